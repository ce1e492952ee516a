"""2.5D tensor parallelism (Tesseract): P = q² · d ranks, d layers of a q × q grid; tensor rank
(k, i, j) = k·q² + i·q + j.

The batch is cut into d·q row blocks: rank (k, i, j) holds ``X[k·q + i, j]``, i.e. each depth
layer k runs the 2D SUMMA (:mod:`.parallel_2d`, same communication, ``B/d`` rows) on its own
share of the batch. Weights are the 2D blocks replicated over the depth, so every layer only sees
a part of the weight gradient: the true ``dW[i, j]`` is the sum over the depth, one all-reduce over
the depth group (``copy_to_region`` on the weight). Colossal-AI's kernel leaves that all-reduce
out; here it is part of the layer. Feature parameters are cut over the d·q batch blocks.
"""

from __future__ import annotations

from minigrad.distributed.tensor_parallel.blocked import BlockedEmbedding, BlockedLayerNorm
from minigrad.distributed.tensor_parallel.layouts import GRID_2P5D
from minigrad.distributed.tensor_parallel.parallel_2d import Linear2D

__all__ = ["Classifier2p5D", "Embedding2p5D", "LayerNorm2p5D", "Linear2p5D"]


class Linear2p5D(Linear2D):
    """``y = x @ weight.T + bias`` on a d × q × q grid: SUMMA within each depth layer, weight
    gradient summed over the depth. Input and output blocked ``(B/(d·q), features/q)``; this rank
    stores ``1/q²`` of the weight. The bias needs only the grid side q to divide it (else each
    rank keeps its whole feature block of it, see :mod:`.blocked`).

    Example::

        fc = tp.Linear2p5D(256, 1024)
    """

    mode = "2.5d"
    layout = GRID_2P5D
    groups = ("2.5d_row", "2.5d_col", "2.5d_dep")
    bias_by_depth = True


class Classifier2p5D(Linear2p5D):
    """The output layer of the 2.5D mode, ``(in_features, num_classes)``: logits blocked
    ``(B/(d·q), classes/q)``."""


class LayerNorm2p5D(BlockedLayerNorm):
    """LayerNorm on 2.5D-blocked activations (statistics summed along the grid row)."""

    mode = "2.5d"


class Embedding2p5D(BlockedEmbedding):
    """Embedding for the 2.5D mode: ids in d·q batch blocks, output ``(B/(d·q), ..., dim/q)``."""

    mode = "2.5d"
