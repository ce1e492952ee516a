"""2D tensor parallelism (SUMMA, Optimus): P = q × q ranks on a grid, rank (i, j) = i·q + j.

Activations ``X (B, K)`` and weights are cut into q × q blocks: rank (i, j) holds ``X[i, j]`` (rows
of block i, features of block j) and the weight block ``W[i, j]`` (in maths ``X @ W`` with ``W``
``(K, N)``; stored as ``weight[N-block j, K-block i]`` of the ``(out, in)`` weight). SUMMA forms
``Y[i, j] = Σ_t X[i, t] · W[t, j]`` in q steps; at step t rank (i, t) broadcasts ``X[i, t]``
along its row and rank (t, j) broadcasts ``W[t, j]`` down its column. The backward re-broadcasts
rather than keeping the q received blocks, so memory stays 1/q² (as in the paper):

* ``dX[i, t] = Σ_j dY[i, j] · W[t, j]ᵀ``: broadcast ``W[t, j]`` down column j, multiply, reduce
  along row i onto rank (i, t);
* ``dW[t, j] = Σ_i X[i, t]ᵀ · dY[i, j]``: broadcast ``X[i, t]`` along row i, multiply, reduce down
  column j onto rank (t, j).

Per Linear: forward 2q broadcasts, backward 2q broadcasts + 2q reduces, all of 1/q² blocks. The
bias is a feature parameter (:mod:`.blocked`): one all-gather down the column forward, one
reduce-scatter backward.
"""

from __future__ import annotations

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.blocked import (
    BlockedEmbedding,
    BlockedLayerNorm,
    add_feature_bias,
    bias_spec,
)
from minigrad.distributed.tensor_parallel.layouts import GRID_2D, advance_layout
from minigrad.distributed.tensor_parallel.regions import (
    broadcast_step,
    copy_to_region,
    reduce_step,
)
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec

__all__ = ["Classifier2D", "Embedding2D", "LayerNorm2D", "Linear2D", "SummaLinear"]


class SummaLinear(Function):
    """``y = x @ weight.T`` on a q × q grid by SUMMA. ``x`` is this rank's block ``(..., K/q)``,
    ``weight`` its ``(N/q, K/q)`` block; ``row`` / ``col`` are its grid row and column groups."""

    def forward(self, x, weight, row: Group, col: Group):
        self.weight, self.row, self.col = weight, row, col
        self.shape = x.shape
        self.x = x.reshape(-1, x.shape[-1])
        i, j = col.rank, row.rank
        y = None
        for t in range(row.size):
            x_it = broadcast_step(self.x if j == t else None, row, t)
            w_tj = broadcast_step(weight if i == t else None, col, t)
            part = F.matmul(x_it, w_tj, transpose_b=True)
            y = part if y is None else y + part
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def backward(self, dy):
        row, col, weight, x = self.row, self.col, self.weight, self.x
        i, j = col.rank, row.rank
        dy = dy.reshape(-1, dy.shape[-1])
        dx = dw = None
        for t in range(row.size):
            if self.needs_input_grad(0):
                w_tj = broadcast_step(weight if i == t else None, col, t)
                part = reduce_step(F.matmul(dy, w_tj), row, t)
                dx = part if j == t else dx
            if self.needs_input_grad(1):
                x_it = broadcast_step(x if j == t else None, row, t)
                part = reduce_step(F.matmul(dy, x_it, transpose_a=True), col, t)
                dw = part if i == t else dw
        return (None if dx is None else dx.reshape(self.shape)), dw, None, None


class Linear2D(ParallelModule):
    """``y = x @ weight.T + bias`` by SUMMA on the q × q grid (see the module doc): input and
    output blocked ``(B/q, features/q)``; this rank stores ``1/q²`` of the weight and bias.
    ``out_chunks`` > 1 splits each chunk of the output separately (fused q/k/v projections).

    Example::

        fc = tp.Linear2D(256, 1024)    # (B/q, 256/q) -> (B/q, 1024/q)
    """

    mode = "2d"
    layout = GRID_2D
    groups = ("2d_row", "2d_col", None)  # row, column, depth
    bias_by_depth = False  # Colossal-AI's 2D bias is split over the whole grid (2.5D: see below)

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 out_chunks: int = 1, ctx: ParallelContext | None = None):
        super().__init__(ctx)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.out_chunks = int(out_chunks)
        row, col, depth = self.groups
        self.row, self.col = self.ctx.group(row), self.ctx.group(col)
        self.depth = self.ctx.group(depth) if depth else None
        bias_shards, self.bias_batch_split = bias_spec(self.out_features, self.layout, self.ctx,
                                                       out_chunks, self.bias_by_depth)
        self.adopt(M.Linear(in_features, out_features, bias), {
            "weight": ShardSpec((self.out_features, self.in_features), (("col",), ("row",)),
                                out_chunks),
            "bias": bias_shards,
        })
        self.input_layout = self.output_layout = self.layout
        advance_layout(self.ctx, self.layout)

    def forward(self, x: Tensor) -> Tensor:
        self.check_features(x, self.in_features // self.row.size)
        weight = copy_to_region(self.weight, self.depth)  # 2.5D: sum dW over the depth
        y = SummaLinear()(x, weight, self.row, self.col)
        return add_feature_bias(y, self.bias, self.layout, self.ctx, self.out_chunks,
                                self.bias_batch_split)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q={self.row.size}")


class Classifier2D(Linear2D):
    """The output layer of the 2D mode, ``(in_features, num_classes)``: logits blocked ``(B/q,
    classes/q)``; pair it with ``tp.cross_entropy`` (the full logits never exist on one rank)."""


class LayerNorm2D(BlockedLayerNorm):
    """LayerNorm on 2D-blocked activations (statistics summed along the grid row)."""

    mode = "2d"


class Embedding2D(BlockedEmbedding):
    """Embedding for the 2D mode: ids blocked by grid row, output ``(B/q, ..., dim/q)``."""

    mode = "2d"
