"""The distributed half of ``SyncBatchNorm``: the all-reduce its statistics go through.

The layer itself is :class:`minigrad.module.normalization.SyncBatchNorm` (``M.SyncBatchNorm``, also
``dist.SyncBatchNorm``). The module package sits below the distributed runtime and cannot import it,
so it declares a :class:`~minigrad.module.normalization.StatsReducer` seam; importing this module
(``minigrad.distributed`` does) installs :class:`AllReduceStats` there, which sums over a process
group with the differentiable ``all_reduce_sum``.
"""

from __future__ import annotations

from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.functional import all_reduce_sum
from minigrad.distributed.comm.group import WORLD, is_distributed
from minigrad.module.normalization import StatsReducer, SyncBatchNorm, set_stats_reducer

__all__ = ["AllReduceStats", "SyncBatchNorm"]


class AllReduceStats(StatsReducer):
    """Sums over the ranks of a process group (``None``: WORLD); a one-process world until
    ``init_process_group`` has run."""

    def world_size(self, group) -> int:
        return (WORLD if group is None else group).size if is_distributed() else 1

    def sum(self, tensor: Tensor, group) -> Tensor:
        return all_reduce_sum(tensor, WORLD if group is None else group)


set_stats_reducer(AllReduceStats())
