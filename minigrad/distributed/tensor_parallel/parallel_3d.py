"""3D tensor parallelism: P = q³ ranks on a cube, coordinates (weight, input, output) = (i, j, l).

With the input layout A (batch over weight × input, features over output), rank (i, j, l) holds
``X[i·q + j, l]`` (``B/q²`` rows, ``K/q`` features) and ``weight[N-block j, K-block l, part i]``
(``N/q × K/q²``, i.e. ``1/q³`` of the weight). One Linear:

* all-gather X over the input group (j) along the batch → ``X[i, l]``, ``(B/q, K/q)``;
* all-gather the weight over the weight group (i) → ``weight[j, l]``, ``(N/q, K/q)``;
* multiply: a partial ``Y[i, j]`` missing the sum over l; reduce-scatter it over the output group
  (l) along the batch → ``Y[i·q + l, j]``, ``(B/q², N/q)``.

The backward is the adjoint of each step: all-gather dY over the output group, reduce-scatter dX
over the input group and dW over the weight group. The output is in layout B (batch over weight ×
output, features over input): the roles of the input and output axes swap, so layer n's output is
layer n+1's input and no data is moved between layers. Each Linear3D built advances the context's
layout; LayerNorm3D and Embedding3D use the layout they are built in.
"""

from __future__ import annotations

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.blocked import (
    BlockedEmbedding,
    BlockedLayerNorm,
    add_feature_bias,
    bias_spec,
)
from minigrad.distributed.tensor_parallel.layouts import (
    CUBE_3D_A,
    CUBE_3D_B,
    Layout,
    advance_layout,
    current_layout,
)
from minigrad.distributed.tensor_parallel.regions import all_gather_region, reduce_scatter_region
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec

__all__ = ["Classifier3D", "Embedding3D", "LayerNorm3D", "Linear3D"]

_SWAP = {CUBE_3D_A: CUBE_3D_B, CUBE_3D_B: CUBE_3D_A}


class Linear3D(ParallelModule):
    """``y = x @ weight.T + bias`` on the q × q × q cube (see the module doc): input ``(B/q²,
    in/q)`` in ``layout`` (default: the context's current one), output ``(B/q², out/q)`` in the
    swapped layout. ``out_chunks`` > 1 splits each chunk of the output separately.

    Example::

        fc1, fc2 = tp.Linear3D(256, 1024), tp.Linear3D(1024, 256)   # chain: fc2(fc1(x))
    """

    mode = "3d"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 out_chunks: int = 1, ctx: ParallelContext | None = None,
                 layout: Layout | None = None):
        super().__init__(ctx)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.out_chunks = int(out_chunks)
        self.input_layout = current_layout(self.ctx) if layout is None else layout
        if self.input_layout not in _SWAP:
            raise ValueError(f"Linear3D: layout must be CUBE_3D_A or CUBE_3D_B, got {layout}")
        self.output_layout = _SWAP[self.input_layout]
        batch_sub = self.output_layout.feature_axis  # the input axis that cuts my batch block
        feature = self.input_layout.feature_axis
        self.gather_x = self.ctx.group_of_axes(batch_sub)
        self.gather_w = self.ctx.group("3d_weight")
        self.scatter_y = self.ctx.group_of_axes(feature)
        bias_shards, self.bias_batch_split = bias_spec(self.out_features, self.output_layout,
                                                       self.ctx, out_chunks)
        self.adopt(M.Linear(in_features, out_features, bias), {
            "weight": ShardSpec((self.out_features, self.in_features),
                                ((batch_sub,), (feature, "weight")), out_chunks),
            "bias": bias_shards,
        })
        advance_layout(self.ctx, self.output_layout)

    def forward(self, x: Tensor) -> Tensor:
        self.check_features(x, self.in_features // self.scatter_y.size)
        x = all_gather_region(x, self.gather_x, 0)
        weight = all_gather_region(self.weight, self.gather_w, 1)
        y = reduce_scatter_region(F.linear(x, weight), self.scatter_y, 0)
        return add_feature_bias(y, self.bias, self.output_layout, self.ctx, self.out_chunks,
                                self.bias_batch_split)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, q={self.gather_w.size}, {self.input_layout}")


class Classifier3D(Linear3D):
    """The output layer of the 3D mode, ``(in_features, num_classes)``: logits ``(B/q²,
    classes/q)`` in the swapped layout."""


class LayerNorm3D(BlockedLayerNorm):
    """LayerNorm on 3D-blocked activations (statistics summed over the feature group)."""

    mode = "3d"


class Embedding3D(BlockedEmbedding):
    """Embedding for the 3D mode: ids in ``B/q²`` batch blocks, output ``(B/q², ..., dim/q)``."""

    mode = "3d"
