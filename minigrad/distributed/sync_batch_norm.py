"""``SyncBatchNorm``: batch normalisation whose statistics cover the whole group's batch.

In training, per-channel mean and variance come from two differentiable all-reduces (sum of values
and count, then sum of squared deviations), so the forward result and the gradients equal a single
process normalising the concatenated batch. Outside training it is plain BatchNorm.
"""

from __future__ import annotations

import minigrad.functional as F
from minigrad.distributed.functional import all_reduce_sum
from minigrad.distributed.group import WORLD, is_distributed
from minigrad.module.normalization import _BatchNorm
from minigrad.tensor import Tensor


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over ``(N, C)``, ``(N, C, L)`` or ``(N, C, H, W)`` with statistics synchronised
    over ``group`` (MegEngine's ``M.SyncBatchNorm``)."""

    _ndims = (2, 3, 4)
    _expect = "(N, C), (N, C, L) or (N, C, H, W)"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.9,
        affine: bool = True,
        track_running_stats: bool = True,
        group=WORLD,
        **kwargs,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, **kwargs)
        self.group = WORLD if group is None else group

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training or not self.track_running_stats) or not is_distributed():
            return super().forward(x)
        if x.ndim not in self._ndims or x.shape[1] != self.num_features:
            raise ValueError(
                f"SyncBatchNorm({self.num_features}): expected input of shape {self._expect} with "
                f"C={self.num_features}, got {tuple(x.shape)}"
            )
        shape = x.shape
        x4 = x.reshape(shape[0], shape[1], -1, 1)
        axes = (0, 2, 3)
        local_n = x4.shape[0] * x4.shape[2]
        count = all_reduce_sum(Tensor(float(local_n), dtype=x.dtype, device=x.device), self.group)
        mean = all_reduce_sum(x4.sum(axis=axes, keepdims=True), self.group) / count
        centered = x4 - mean
        var = (
            all_reduce_sum((centered * centered).sum(axis=axes, keepdims=True), self.group) / count
        )
        y = centered / F.sqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        if self.track_running_stats:
            n = count.item()
            m = self.momentum
            batch_mean = mean.detach()._data
            unbiased = var.detach()._data * (n / max(n - 1.0, 1.0))
            self.running_mean.set_value(m * self.running_mean._data + (1 - m) * batch_mean)
            self.running_var.set_value(m * self.running_var._data + (1 - m) * unbiased)
        return y.reshape(shape)
