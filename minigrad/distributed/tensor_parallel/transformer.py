"""The transformer of :mod:`minigrad.module.transformer` built from ``tp.*`` layers: the same code
is the single-device model (no parallel context) and its parallel twin in every mode.

Attention splits its heads the way the fused query/key/value projection splits its output
features (``out_chunks=3``): each rank computes whole heads for its rows, with no communication
of its own. In 1D the block is two column→row pairs (attention, MLP): one all-reduce forward and
one backward each.
"""

from __future__ import annotations

import minigrad.module as M
from minigrad.distributed.tensor_parallel.dropout import Dropout
from minigrad.distributed.tensor_parallel.layers import (
    Classifier,
    Embedding,
    LayerNorm,
    Linear,
    tensor_parallel_context,
)
from minigrad.distributed.tensor_parallel.layouts import current_layout

__all__ = ["MLP", "SelfAttention", "TensorParallelLayers", "TransformerBlock", "TransformerLM"]


class TensorParallelLayers(M.TransformerLayers):
    """The ``tp.*`` layer of the configured mode for every layer of the transformer, and as many
    heads per rank as the fused query/key/value projection leaves it."""

    def linear(self, in_features: int, out_features: int, bias: bool = True,
               chunks: int = 1) -> M.Module:
        """``tp.Linear`` (column- or row-parallel in 1D, as the layout says)."""
        return Linear(in_features, out_features, bias, out_chunks=chunks)

    def layer_norm(self, dim: int) -> M.Module:
        """``tp.LayerNorm``."""
        return LayerNorm(dim)

    def embedding(self, num_embeddings: int, dim: int) -> M.Module:
        """``tp.Embedding``."""
        return Embedding(num_embeddings, dim)

    def classifier(self, in_features: int, num_classes: int, bias: bool = True) -> M.Module:
        """``tp.Classifier``: logits split by class (train with ``tp.cross_entropy``)."""
        return Classifier(in_features, num_classes, bias)

    def dropout(self, drop_prob: float) -> M.Module:
        """``tp.Dropout``: equal masks where the activation is replicated, different where split."""
        return Dropout(drop_prob)

    def local_heads(self, num_heads: int) -> int:
        """``num_heads`` over the number of blocks the features are split into."""
        ctx = tensor_parallel_context()
        split = current_layout(ctx).feature_blocks(ctx) if ctx is not None else 1
        if num_heads % split:
            raise ValueError(
                f"SelfAttention: num_heads {num_heads} is not divisible by the {split} ranks the "
                "features are split over"
            )
        return num_heads // split


_LAYERS = TensorParallelLayers()


class SelfAttention(M.SelfAttention):
    """Multi-head self-attention on ``(batch, seq, dim)`` (:class:`minigrad.module.SelfAttention`
    of ``tp.*`` layers): each rank runs ``num_heads / (feature split)`` whole heads; ``dropout``
    drops attention weights (``attn_dropout``)."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__(dim, num_heads, dropout, causal, layers=_LAYERS)

    @property
    def attn_dropout(self) -> M.Module:
        """The dropout of the attention weights (the core's)."""
        return self.core.dropout


class MLP(M.MLP):
    """``fc2(gelu(fc1(x)))`` of ``tp.Linear`` layers: a column→row pair in 1D."""

    def __init__(self, dim: int, hidden: int):
        super().__init__(dim, hidden, layers=_LAYERS)


class TransformerBlock(M.TransformerBlock):
    """Pre-LayerNorm transformer block (:class:`minigrad.module.TransformerBlock`) of ``tp.*``
    layers.

    Example::

        block = tp.TransformerBlock(256, 8, causal=True)   # mode from the parallel context
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 causal: bool = False):
        super().__init__(dim, num_heads, mlp_ratio, dropout, causal, layers=_LAYERS)


class TransformerLM(M.TransformerLM):
    """A small causal language model of ``tp.*`` layers (:class:`minigrad.module.TransformerLM`,
    output layer without bias). ``forward(ids)`` takes this rank's batch block of token ids
    ``(batch, seq)`` and returns its block of the logits; train it with ``tp.cross_entropy``.

    Example::

        lm = tp.TransformerLM(vocab=96, dim=64, num_heads=4, depth=2, max_len=64)
    """

    def __init__(self, vocab: int, dim: int, num_heads: int, depth: int, max_len: int,
                 mlp_ratio: int = 4, dropout: float = 0.0):
        super().__init__(vocab, dim, num_heads, depth, max_len, mlp_ratio, dropout, causal=True,
                         head_bias=False, layers=_LAYERS)
