"""``minigrad.functional.distributed``: MegEngine's ``megengine.functional.distributed``, the
differentiable collectives under the name MegEngine code imports them by.

It is an alias: every name here *is* the function of :mod:`minigrad.distributed.functional`
(where they are defined and documented). The module is loaded only when imported explicitly
(``import minigrad.functional.distributed`` or ``from minigrad.functional.distributed import
all_reduce_sum``): ``minigrad.functional`` itself does not import it, so importing the ops never
pulls in the distributed runtime.

Example::

    from minigrad.functional.distributed import all_reduce_sum
    total = all_reduce_sum(local)  # inside a launched rank
"""

from minigrad.distributed.functional import (  # noqa: F401  (re-exports)
    all_gather,
    all_reduce_max,
    all_reduce_min,
    all_reduce_sum,
    all_to_all,
    broadcast,
    gather,
    reduce_scatter_sum,
    reduce_sum,
    remote_recv,
    remote_send,
    scatter,
)

__all__ = [
    "all_gather",
    "all_reduce_max",
    "all_reduce_min",
    "all_reduce_sum",
    "all_to_all",
    "broadcast",
    "gather",
    "reduce_scatter_sum",
    "reduce_sum",
    "remote_recv",
    "remote_send",
    "scatter",
]
