"""A transformer block and a small language model written once with the ``tp.*`` layers: the same
code is the single-device model (no parallel context) and its parallel twin in every mode.

Attention splits its heads the way the fused query/key/value projection splits its output
features (``out_chunks=3``): each rank computes whole heads for its rows, with no communication
of its own. In 1D the block is two column→row pairs (attention, MLP): one all-reduce forward and
one backward each.
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.tensor_parallel.dropout import Dropout
from minigrad.distributed.tensor_parallel.layers import (
    Classifier,
    Embedding,
    LayerNorm,
    Linear,
    tensor_parallel_context,
)
from minigrad.distributed.tensor_parallel.layouts import current_layout

__all__ = ["MLP", "SelfAttention", "TransformerBlock", "TransformerLM"]


class SelfAttention(M.Module):
    """Multi-head self-attention on ``(batch, seq, dim)``: fused q/k/v projection, scaled
    dot-product attention per head (``causal`` hides later positions), output projection. With
    tensor parallelism each rank runs ``num_heads / (feature split)`` whole heads."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"SelfAttention: dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.causal = int(dim), int(num_heads), bool(causal)
        self.head_dim = self.dim // self.num_heads
        self.qkv = Linear(dim, 3 * dim, out_chunks=3)
        ctx = tensor_parallel_context()
        split = current_layout(ctx).feature_blocks(ctx) if ctx is not None else 1
        if num_heads % split:
            raise ValueError(
                f"SelfAttention: num_heads {num_heads} is not divisible by the {split} ranks the "
                "features are split over"
            )
        self.local_heads = num_heads // split
        self.attn_dropout = Dropout(dropout)
        self.proj = Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.qkv(x)
        b, s = qkv.shape[0], qkv.shape[1]
        h, d = self.local_heads, self.head_dim
        q, k, v = qkv.reshape(b, s, 3, h, d).transpose(2, 0, 3, 1, 4)
        if self.training and self.attn_dropout.drop_prob > 0:
            scores = F.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(d))
            if self.causal:
                scores = scores + F.nn.attention_bias(s, s, is_causal=True, like=scores)
            out = F.matmul(self.attn_dropout(F.softmax(scores, axis=-1)), v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, s, h * d))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"


class MLP(M.Module):
    """``fc2(gelu(fc1(x)))``: a column→row pair in 1D."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.act = M.GELU()
        self.fc2 = Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(M.Module):
    """Pre-LayerNorm transformer block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``
    with a GELU MLP of ``mlp_ratio × dim`` hidden features.

    Example::

        block = tp.TransformerBlock(256, 8, causal=True)   # mode from the parallel context
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 causal: bool = False):
        super().__init__()
        self.ln1 = LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, dropout, causal)
        self.drop1 = Dropout(dropout)
        self.ln2 = LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim)
        self.drop2 = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.mlp(self.ln2(x)))


class TransformerLM(M.Module):
    """A small causal language model: token and position embeddings, ``depth`` blocks, a final
    LayerNorm and a classifier over the vocabulary. ``forward(ids)`` takes this rank's batch
    block of token ids ``(batch, seq)`` and returns its block of the logits; train it with
    ``tp.cross_entropy``.

    Example::

        lm = tp.TransformerLM(vocab=96, dim=64, num_heads=4, depth=2, max_len=64)
    """

    def __init__(self, vocab: int, dim: int, num_heads: int, depth: int, max_len: int,
                 mlp_ratio: int = 4, dropout: float = 0.0):
        super().__init__()
        self.max_len = int(max_len)
        self.tok = Embedding(vocab, dim)
        self.pos = Embedding(max_len, dim)
        self.drop = Dropout(dropout)
        self.blocks = [TransformerBlock(dim, num_heads, mlp_ratio, dropout, causal=True)
                       for _ in range(depth)]
        self.ln = LayerNorm(dim)
        self.head = Classifier(dim, vocab, bias=False)

    def forward(self, ids) -> Tensor:
        seq = ids.shape[1]
        if seq > self.max_len:
            raise ValueError(f"TransformerLM: sequence length {seq} exceeds max_len {self.max_len}")
        positions = Tensor(np.arange(seq, dtype=np.int64), device=self.pos.weight.device)
        h = self.drop(self.tok(ids) + self.pos(positions))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))
