"""Attention modules: ``DotProductAttention``, the attention core on heads that are already
projected, and ``MultiHeadAttention``, scaled dot-product attention over ``num_heads`` learned
projections.

``MultiHeadAttention`` is written as a composition of ``F.linear``, ``F.matmul`` and
``F.softmax``, so gradients (including second-order ones) come for free. Parameter names follow
PyTorch: ``in_proj_weight`` packs the query, key and value projections as
``(3 * embed_dim, embed_dim)``; ``out_proj`` is a Linear.
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.module import init
from minigrad.module.dropout import Dropout
from minigrad.module.linear import Linear
from minigrad.module.module import Module


class DotProductAttention(Module):
    """The attention core: ``softmax(q @ k^T / sqrt(head_dim)) @ v`` on ``(batch, heads, tokens,
    head_dim)`` queries, keys and values already projected and split into heads, with no
    parameters. ``causal`` lets query i attend keys ``j <= i``; ``dropout`` (a module with a
    ``drop_prob``, e.g. :class:`~minigrad.module.Dropout`) drops attention weights while training.

    It is the local core of :class:`~minigrad.module.transformer.SelfAttention`, where parallel
    models put ring or all-to-all attention instead, and it computes the weights of
    :class:`MultiHeadAttention`.

    Example::

        core = M.DotProductAttention(causal=True, dropout=M.Dropout(0.1))
        out = core(q, k, v)  # (B, H, L, D)
    """

    def __init__(self, causal: bool = False, dropout: Module | None = None, **kwargs):
        super().__init__(**kwargs)
        self.causal = bool(causal)
        self.dropout = dropout

    def weights(self, q: Tensor, k: Tensor, bias: Tensor | None = None) -> Tensor:
        """The attention weights ``(..., L, S)``: softmax of the scaled scores plus ``bias`` (an
        additive mask from ``F.nn.attention_bias``; the causal one when None and ``causal``),
        after dropout."""
        scores = F.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(q.shape[-1]))
        if bias is None and self.causal:
            bias = F.nn.attention_bias(q.shape[-2], k.shape[-2], is_causal=True, like=scores)
        if bias is not None:
            scores = scores + bias
        weights = F.softmax(scores, axis=-1)
        return weights if self.dropout is None else self.dropout(weights)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.training and self.dropout is not None and self.dropout.drop_prob > 0:
            return F.matmul(self.weights(q, k), v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


class MultiHeadAttention(Module):
    """Multi-head attention. Inputs are ``(N, L, E)`` (``batch_first=True``, the default) or
    ``(L, N, E)``; returns ``(output, weights)`` where ``weights`` (the head-averaged attention
    matrix ``(N, L, S)``) is None unless ``need_weights``.

    Masks (built by ``F.nn.attention_bias``, one meaning for all of minigrad): ``attn_mask`` is
    ``(L, S)`` or ``(N * num_heads, L, S)``, boolean with **True = may attend** (as in
    ``F.scaled_dot_product_attention`` and PyTorch's SDPA; PyTorch's ``nn.MultiheadAttention``
    uses the opposite, so invert such a mask with ``~``) or float (added to the scores);
    ``key_padding_mask`` is ``(N, S)`` boolean with True = padding (ignored);
    ``is_causal`` hides future positions.

    Example::

        mha = M.MultiHeadAttention(64, 4)
        out, _ = mha(x, x, x, is_causal=True)  # self-attention, x: (N, L, 64)
    """

    @staticmethod
    def count_parameters(embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                         batch_first: bool = True, **kwargs) -> int:
        """The number of trainable parameters of this layer built with these arguments, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        return 4 * (embed_dim + bool(bias)) * embed_dim

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, **kwargs):
        super().__init__(**kwargs)
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiHeadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                f"({num_heads})"
            )
        self.embed_dim = int(embed_dim)
        self.num_heads = int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.batch_first = bool(batch_first)
        e = self.embed_dim
        self.in_proj_weight = Parameter(np.zeros((3 * e, e), np.float32))
        self.in_proj_bias = Parameter(np.zeros(3 * e, np.float32)) if bias else None
        self.out_proj = Linear(e, e, bias=bias)
        self.attn_dropout = Dropout(dropout)
        self.core = DotProductAttention(dropout=self.attn_dropout)
        init.xavier_uniform_(self.in_proj_weight)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _project(self, x: Tensor, i: int) -> Tensor:
        """Project with the i-th block of the packed weight and split heads: (N, H, L, D)."""
        e = self.embed_dim
        w = self.in_proj_weight[i * e:(i + 1) * e]
        b = self.in_proj_bias[i * e:(i + 1) * e] if self.in_proj_bias is not None else None
        n, length = x.shape[0], x.shape[1]
        y = F.linear(x, w, b).reshape(n, length, self.num_heads, self.head_dim)
        return y.transpose(0, 2, 1, 3)

    def _bias(self, attn_mask, key_padding_mask, is_causal, n, length, s, like: Tensor):
        """One additive float bias broadcastable to (N, H, L, S), or None (F.nn.attention_bias)."""
        if getattr(attn_mask, "ndim", None) == 3:  # (N * H, L, S) -> (N, H, L, S)
            attn_mask = attn_mask.reshape(n, self.num_heads, length, s)
        if key_padding_mask is not None and tuple(np.shape(key_padding_mask)) != (n, s):
            raise ValueError(
                f"MultiHeadAttention: key_padding_mask must have shape {(n, s)} (True = padding), "
                f"got {tuple(np.shape(key_padding_mask))}"
            )
        with like.device.context():
            return F.nn.attention_bias(length, s, attn_mask, is_causal, key_padding_mask,
                                       like=like)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                attn_mask=None, key_padding_mask=None, is_causal: bool = False,
                need_weights: bool = False):
        key = query if key is None else key
        value = key if value is None else value
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 3 or t.shape[-1] != self.embed_dim:
                raise ValueError(
                    f"MultiHeadAttention(embed_dim={self.embed_dim}): expected {name} of shape "
                    f"({'N, L' if self.batch_first else 'L, N'}, {self.embed_dim}), got "
                    f"{tuple(t.shape)}"
                )
        if not self.batch_first:
            query, key, value = (t.transpose(1, 0, 2) for t in (query, key, value))
        n, length, s = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = self._project(query, 0), self._project(key, 1), self._project(value, 2)
        mask = self._bias(attn_mask, key_padding_mask, is_causal, n, length, s, q)
        weights = self.core.weights(q, k, mask)
        out = F.matmul(weights, v).transpose(0, 2, 1, 3).reshape(n, length, self.embed_dim)
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(1, 0, 2)
        return out, (weights.mean(axis=1) if need_weights else None)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
