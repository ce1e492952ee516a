"""Distributed training on CPU and GPU: MegEngine's ``megengine.distributed`` API, plus the
collectives of PyTorch's ``torch.distributed`` and OneFlow's ``oneflow.comm``.

The folders, bottom up (each imports only those before it; ``tests/test_layering.py`` checks):

* :mod:`.runtime`: how ranks come to exist and meet: ``@dist.launcher``, ``python -m
  minigrad.distributed.launch``, the environment launchers set, the rendezvous store, ``[rank N]``
  output;
* :mod:`.comm`: process groups, the collective backends (:mod:`.comm.providers`: cpu, mpi, nccl),
  the array-level collectives every API calls (:mod:`.comm.arrays`), PyTorch's API on tensors
  (:mod:`.comm.collectives`) and MegEngine's differentiable one (:mod:`.comm.functional`);
* :mod:`.data_parallel`: ``bcast_list_``, the bucketed gradient all-reduce, DDP, SyncBatchNorm;
* :mod:`.mesh`: the ranks as a grid of named axes, and ``init_parallel``;
* the strategies: :mod:`.pipeline`, :mod:`.tensor_parallel`, :mod:`.sequence_parallel`,
  :mod:`.global_tensor`;
* :mod:`.checkpoint`: the logical sharded checkpoint format every strategy saves to and loads
  from (``dist.checkpoint.save``/``load``/``latest``/``async_save``).
* :mod:`.deepspeed`: DeepSpeed's entry point (``deepspeed.initialize``, its JSON config) over the
  folders above; above ``minigrad.amp`` in the layer order, so this package does not import it.

MegEngine's module paths ``minigrad.distributed.functional`` and ``minigrad.distributed.helper``
still import (see :mod:`minigrad.aliases`).

Example::

    import minigrad.distributed as dist

    @dist.launcher
    def main():
        x = np.ones(2) * dist.get_rank()
        dist.all_reduce(x)                 # in place, like torch.distributed
        return x

    main()   # -> [array([1., 1.]), array([1., 1.])]
"""

from minigrad.distributed import checkpoint, comm
from minigrad.distributed.comm import functional
from minigrad.distributed.comm.arrays import group_barrier
from minigrad.distributed.comm.collectives import (
    P2POp,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
)
from minigrad.distributed.comm.group import (
    WORLD,
    Group,
    destroy_process_group,
    get_backend,
    get_client,
    get_local_rank,
    get_node_size,
    get_rank,
    get_world_size,
    group_end,
    group_start,
    init_process_group,
    is_available,
    is_distributed,
    is_initialized,
    new_group,
)
from minigrad.distributed.comm.providers.base import (
    Backend,
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ReduceOp,
    Work,
)
from minigrad.distributed.comm.recorder import comm_log
from minigrad.distributed.data_parallel import helper
from minigrad.distributed.data_parallel.ddp import DistributedDataParallel
from minigrad.distributed.data_parallel.fully_shard import (
    full_gradients,
    full_optimizer_state_dict,
    full_state_dict,
    fully_shard,
    load_full_optimizer_state_dict,
    load_full_state_dict,
    no_sync,
)
from minigrad.distributed.data_parallel.helper import bcast_list_, make_allreduce_cb, synchronized
from minigrad.distributed.data_parallel.mixed_precision import MixedPrecisionPolicy
from minigrad.distributed.data_parallel.sync_batch_norm import SyncBatchNorm
from minigrad.distributed.data_parallel.zero import ZeroRedundancyOptimizer
from minigrad.distributed.data_parallel.zero_memory import ModelStateMeter, estimate_zero_memory
from minigrad.distributed.mesh.parallel_context import get_parallel_context, init_parallel
from minigrad.distributed.runtime.launcher import LaunchError, launcher
from minigrad.distributed.runtime.log import get_logger
from minigrad.distributed.runtime.store import Client, Server, StoreError, StoreTimeout

__all__ = [
    "WORLD",
    "Backend",
    "Client",
    "CollectiveError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "DistributedDataParallel",
    "Group",
    "LaunchError",
    "MixedPrecisionPolicy",
    "ModelStateMeter",
    "P2POp",
    "ReduceOp",
    "Server",
    "StoreError",
    "StoreTimeout",
    "SyncBatchNorm",
    "Work",
    "ZeroRedundancyOptimizer",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "bcast_list_",
    "broadcast",
    "broadcast_object_list",
    "checkpoint",
    "comm",
    "comm_log",
    "destroy_process_group",
    "estimate_zero_memory",
    "full_gradients",
    "full_optimizer_state_dict",
    "full_state_dict",
    "fully_shard",
    "functional",
    "gather",
    "get_backend",
    "get_client",
    "get_local_rank",
    "get_logger",
    "get_node_size",
    "get_parallel_context",
    "get_rank",
    "get_world_size",
    "group_barrier",
    "group_end",
    "group_start",
    "helper",
    "init_parallel",
    "init_process_group",
    "irecv",
    "is_available",
    "is_distributed",
    "is_initialized",
    "isend",
    "launcher",
    "load_full_optimizer_state_dict",
    "load_full_state_dict",
    "make_allreduce_cb",
    "new_group",
    "no_sync",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "synchronized",
]
