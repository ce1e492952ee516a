"""Pieces shared by the 2D, 2.5D and 3D modes, whose activations are blocked over both the batch
and the features (see :mod:`.layouts`).

*Feature parameters* — LayerNorm weight and bias, Linear biases, embedding tables — are indexed by
the features of a layout. Each is cut into the layout's feature blocks, and each block again over
the ranks of the batch group (which all use the same feature block), so a rank stores
``1 / (feature blocks × batch blocks)`` of it. The forward all-gathers the block over the batch
group; the backward reduce-scatters the gradient, which sums the contributions of every batch
block (:func:`gather_feature_param`). In 2D this is Colossal-AI's bias scheme (a column's bias
split down the column).

A 2.5D or 3D Linear's bias whose feature block does not split again over the batch group
(Colossal-AI asks of such a bias only that the tensor depth divides it: ``Linear3D(4, 12)`` on 8
ranks; its 2D layers, like minigrad's, need every rank of the grid to divide it) keeps its whole
feature block on every rank of the batch group instead (:func:`bias_spec`): forward it is used as
it is, backward its gradient is summed over the batch group (:func:`~.regions.copy_to_region`).

LayerNorm needs the mean and variance over all features of a row: sums over the feature group
(:func:`~.regions.all_reduce_region`, two tiny all-reduces forward and two backward).
"""

from __future__ import annotations

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.layouts import Layout, advance_layout, current_layout
from minigrad.distributed.tensor_parallel.regions import (
    all_gather_region,
    all_reduce_region,
    copy_to_region,
)
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec

__all__ = [
    "BlockedEmbedding",
    "BlockedLayerNorm",
    "add_feature_bias",
    "bias_spec",
    "feature_spec",
    "gather_feature_param",
]


def feature_spec(length: int, layout: Layout, leading: tuple = (), chunks: int = 1,
                 batch_split: bool = True) -> ShardSpec:
    """The :class:`ShardSpec` of a parameter ``leading + (length,)`` whose last axis holds the
    features of ``layout``: cut by the feature axis, then (``batch_split``) by the batch axes."""
    axes = (layout.feature_axis, *layout.batch_axes) if batch_split else (layout.feature_axis,)
    splits = ((),) * len(leading) + (axes,)
    return ShardSpec(tuple(leading) + (int(length),), splits, chunks)


def bias_spec(length: int, layout: Layout, ctx: ParallelContext, chunks: int = 1,
              by_depth: bool = True) -> tuple[ShardSpec, bool]:
    """The spec of a Linear's bias and whether it is split over the batch group too: it is when
    its feature blocks divide evenly over the batch group, else (``by_depth``: 2.5D and 3D) each
    rank keeps its whole feature block, so only the feature blocks must divide the length, as in
    Colossal-AI."""
    parts = layout.feature_blocks(ctx) * layout.batch_blocks(ctx) * chunks
    batch_split = int(length) % parts == 0 or not by_depth
    return feature_spec(length, layout, chunks=chunks, batch_split=batch_split), batch_split


def gather_feature_param(p: Tensor, layout: Layout, ctx: ParallelContext,
                         chunks: int = 1, batch_split: bool = True) -> Tensor:
    """This rank's whole feature block of a feature parameter (all-gather over the batch group;
    backward reduce-scatter). With ``chunks`` > 1 (the bias of a fused q/k/v projection) the
    gathered pieces are put back chunk by chunk. A parameter not split over the batch group
    (``batch_split=False``) is the block already: used as it is, its gradient summed over the
    batch group."""
    group = layout.batch_group(ctx)
    if not batch_split:
        return copy_to_region(p, group)
    out = all_gather_region(p, group, -1)
    if chunks > 1 and group is not None and group.size > 1:
        lead, n = out.shape[:-1], out.shape[-1]
        out = out.reshape(*lead, group.size, chunks, n // (group.size * chunks))
        axes = tuple(range(len(lead))) + (len(lead) + 1, len(lead), len(lead) + 2)
        out = out.transpose(*axes).reshape(*lead, n)
    return out


def add_feature_bias(y: Tensor, bias: Tensor | None, layout: Layout, ctx: ParallelContext,
                     chunks: int = 1, batch_split: bool = True) -> Tensor:
    """``y + bias`` for a bias that is a feature parameter of ``layout`` (``y`` when None)."""
    if bias is None:
        return y
    return y + gather_feature_param(bias, layout, ctx, chunks, batch_split)


class BlockedLayerNorm(ParallelModule):
    """LayerNorm over features split across the layout's feature group (base of LayerNorm2D,
    LayerNorm2p5D and LayerNorm3D). Same parameters and results as ``M.LayerNorm``."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, affine: bool = True,
                 ctx: ParallelContext | None = None, layout: Layout | None = None):
        super().__init__(ctx)
        if not isinstance(normalized_shape, int):
            (normalized_shape,) = normalized_shape
        self.normalized_shape, self.eps = int(normalized_shape), float(eps)
        self.layout = current_layout(self.ctx) if layout is None else layout
        spec = feature_spec(self.normalized_shape, self.layout)
        self.adopt(M.LayerNorm(self.normalized_shape, eps, affine), {"weight": spec, "bias": spec})
        self.input_layout = self.output_layout = self.layout
        advance_layout(self.ctx, self.layout)

    def forward(self, x: Tensor) -> Tensor:
        n = self.normalized_shape
        self.check_features(x, n // self.layout.feature_blocks(self.ctx))
        group = self.layout.feature_group(self.ctx)
        mean = all_reduce_region(x.sum(axis=-1, keepdims=True), group) * (1.0 / n)
        centred = x - mean
        var = all_reduce_region((centred * centred).sum(axis=-1, keepdims=True), group) * (1.0 / n)
        y = centred / F.sqrt(var + self.eps)
        if self.weight is None:
            return y
        return (y * gather_feature_param(self.weight, self.layout, self.ctx)
                + gather_feature_param(self.bias, self.layout, self.ctx))

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, {self.layout}"


class BlockedEmbedding(ParallelModule):
    """Embedding whose output features are split like the layout's (base of Embedding2D,
    Embedding2p5D and Embedding3D): ids come in this rank's batch block, the table's columns are
    a feature parameter. Same parameters and results as ``M.Embedding``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 ctx: ParallelContext | None = None, layout: Layout | None = None):
        super().__init__(ctx)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        self.layout = current_layout(self.ctx) if layout is None else layout
        spec = feature_spec(self.embedding_dim, self.layout, leading=(self.num_embeddings,))
        self.adopt(M.Embedding(num_embeddings, embedding_dim, padding_idx), {"weight": spec},
                   names=("weight",))
        self.input_layout = self.output_layout = self.layout
        advance_layout(self.ctx, self.layout)

    def forward(self, ids) -> Tensor:
        ids = self.check_ids(ids, self.num_embeddings)
        table = gather_feature_param(self.weight, self.layout, self.ctx)
        return F.embedding(ids, table, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.layout}"
