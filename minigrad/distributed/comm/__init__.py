"""The communication core: process groups, the collectives on them, and what moves the bytes.

Bottom up: :mod:`.providers` (the collective backends, one interface: ``cpu`` over shared memory or
TCP, ``mpi``, ``nccl``), :mod:`.group` (process groups and the rule that routes an array to a
provider), :mod:`.arrays` (array-level collectives and messages: the one implementation every API
calls), then the two user-facing spellings on tensors: :mod:`.collectives` (PyTorch's and
OneFlow's, in place) and :mod:`.functional` (MegEngine's, differentiable).

``minigrad.distributed.comm`` is also the array-level API itself (the names of :mod:`.arrays`),
as it was before these folders existed::

    from minigrad.distributed import comm
    comm.all_reduce(np.ones(3))
"""

from minigrad.distributed.comm.arrays import (
    DTYPES,
    ReduceOp,
    Work,
    all_gather,
    all_gather_along,
    all_reduce,
    all_to_all,
    all_to_all_along,
    barrier,
    broadcast,
    gather,
    group_barrier,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_along,
    scatter,
    send,
    split_along,
)

__all__ = [
    "DTYPES",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_along",
    "all_reduce",
    "all_to_all",
    "all_to_all_along",
    "barrier",
    "broadcast",
    "gather",
    "group_barrier",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_along",
    "scatter",
    "send",
    "split_along",
]
