"""Distributed training (MegEngine's ``megengine.distributed`` API), on CPU and GPU.

Layers: :mod:`.store` (authenticated TCP rendezvous), :mod:`.group` (process groups),
:mod:`.comm` (array collectives; backends in :mod:`.backends`), :mod:`.launcher` and
``python -m minigrad.distributed.launch`` (start the ranks).

Example::

    import minigrad.distributed as dist

    @dist.launcher
    def main():
        return dist.comm.all_reduce(np.ones(2) * dist.get_rank())

    main()   # -> [array([1., 1.]), array([1., 1.])]
"""

from minigrad.distributed import comm
from minigrad.distributed.backends import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    Work,
)
from minigrad.distributed.group import (
    WORLD,
    Group,
    destroy_process_group,
    get_backend,
    get_client,
    get_rank,
    get_world_size,
    group_barrier,
    init_process_group,
    is_distributed,
    new_group,
)
from minigrad.distributed.launcher import LaunchError, launcher
from minigrad.distributed.parallel_context import get_parallel_context, init_parallel  # noqa: F401
from minigrad.distributed.store import Client, Server, StoreError, StoreTimeout

__all__ = [
    "WORLD",
    "Client",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "Group",
    "LaunchError",
    "Server",
    "StoreError",
    "StoreTimeout",
    "Work",
    "comm",
    "destroy_process_group",
    "get_backend",
    "get_client",
    "get_rank",
    "get_world_size",
    "group_barrier",
    "init_process_group",
    "is_distributed",
    "launcher",
    "new_group",
]

# ---- Differentiable layer (written by the dist.functional / helper engineer) -------------------
# `functional` (differentiable collectives), `helper` (bcast_list_, make_allreduce_cb) and
# `data_parallel` build on `comm` above; they are imported here once they exist.
try:  # pragma: no cover - depends on files owned by another engineer
    from minigrad.distributed import functional  # noqa: F401
    from minigrad.distributed.data_parallel import DistributedDataParallel  # noqa: F401
    from minigrad.distributed.helper import bcast_list_, make_allreduce_cb  # noqa: F401
    from minigrad.distributed.sync_batch_norm import SyncBatchNorm  # noqa: F401

    __all__ += ["functional", "bcast_list_", "make_allreduce_cb", "DistributedDataParallel",
                "SyncBatchNorm"]
except ImportError:
    pass
