"""Dropout for tensor-parallel models: the same mask on every rank where an activation is whole,
different masks where each rank holds a different block.

Ranks that hold the same (replicated) activation must drop the same elements, or they would
diverge; ranks that hold different blocks must draw independently, or every block would get the
same pattern. The parallel context keeps one stream of each kind
(:meth:`~minigrad.distributed.mesh.parallel_context.ParallelContext.rng`).
"""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.mesh.parallel_context import get_parallel_context
from minigrad.distributed.tensor_parallel.layouts import current_layout
from minigrad.module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    """Inverted dropout with probability ``drop_prob``. ``sharded`` picks the stream: True for an
    activation split across the tensor-parallel ranks ("tensor" stream), False for a replicated one
    ("replicated" stream); None (default) decides from the layout the layer is built in (always
    split in mode "sequence"). Without a parallel context it is ``M.Dropout``.

    Example::

        drop = tp.Dropout(0.1)   # after a 1D row-parallel Linear: replicated, equal masks
    """

    def __init__(self, drop_prob: float = 0.0, sharded: bool | None = None):
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"Dropout: drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = float(drop_prob)
        self.ctx = get_parallel_context(required=False)
        if sharded is None and self.ctx is not None:
            layout = current_layout(self.ctx)  # sequence parallelism splits every activation
            sharded = self.ctx.mode == "sequence" or bool(layout.batch_axes or layout.feature_axis)
        self.stream = "tensor" if sharded else "replicated"

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        if self.ctx is None:
            return F.dropout(x, self.drop_prob, training=True)
        gen = self.ctx.rng(self.stream, x.device)
        keep = gen.random(x.shape, dtype=np.float32) >= self.drop_prob
        scale = x.xp.asarray(keep, dtype=x.dtype) * (1.0 / (1.0 - self.drop_prob))
        return x * Tensor(scale, device=x.device)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, stream={self.stream!r}"
