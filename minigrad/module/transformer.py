"""A transformer written once: :class:`SelfAttention`, :class:`MLP`, :class:`TransformerBlock` and
the language model :class:`TransformerLM`, all built from a :class:`TransformerLayers` factory.

The single-device model and its parallel twins differ only in the layers they are made of: the
linear layers (tensor parallelism splits their features), the LayerNorms, embeddings, output layer
and dropout (parallel versions of each), and the attention core (local softmax attention, or ring
or all-to-all attention over a sequence split across processes). The factory's defaults are the
single-device layers; ``minigrad.distributed`` subclasses it (this layer imports nothing from
there). The modules call the factory in the order they are built, which a tensor-parallel factory
relies on (its 1D Linear alternates column- and row-parallel).
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.module.activation import GELU
from minigrad.module.attention import DotProductAttention
from minigrad.module.dropout import Dropout
from minigrad.module.embedding import Embedding
from minigrad.module.linear import Linear
from minigrad.module.module import Module
from minigrad.module.normalization import LayerNorm
from minigrad.module.sequential import Sequential

__all__ = ["MLP", "SelfAttention", "TransformerBlock", "TransformerLM", "TransformerLayers"]


class TransformerLayers:
    """The layers a transformer is made of; these defaults build the single-device model.

    Override a method to build a parallel model: :meth:`linear` (and :meth:`local_heads`) for
    split features, :meth:`attention_core` for attention over a split sequence, and so on.

    Example::

        class Causal(M.TransformerLayers):
            def attention_core(self, causal, dropout):
                return M.DotProductAttention(causal=True)

        block = M.TransformerBlock(64, 4, layers=Causal())
    """

    def linear(self, in_features: int, out_features: int, bias: bool = True,
               chunks: int = 1) -> Module:
        """A linear layer. ``chunks > 1`` says its output is that many equal parts (the fused
        query/key/value projection) that a feature-splitting factory must split one by one."""
        return Linear(in_features, out_features, bias)

    def layer_norm(self, dim: int) -> Module:
        """A LayerNorm over the last axis of ``dim`` features."""
        return LayerNorm(dim)

    def embedding(self, num_embeddings: int, dim: int) -> Module:
        """A lookup table of ``num_embeddings`` vectors of ``dim`` features."""
        return Embedding(num_embeddings, dim)

    def classifier(self, in_features: int, num_classes: int, bias: bool = True) -> Module:
        """The output layer: ``num_classes`` logits from ``in_features`` features."""
        return Linear(in_features, num_classes, bias)

    def dropout(self, drop_prob: float) -> Module:
        """Dropout with probability ``drop_prob`` of the activation the last layer built gives."""
        return Dropout(drop_prob)

    def attention_core(self, causal: bool, dropout: float) -> Module:
        """The attention core, called as ``core(q, k, v)`` on ``(batch, heads, tokens,
        head_dim)`` tensors; ``dropout`` is the drop probability of the attention weights."""
        return DotProductAttention(causal, self.dropout(dropout))

    def local_heads(self, num_heads: int) -> int:
        """How many of the ``num_heads`` heads this process computes (asked right after the
        query/key/value projection is built): all of them unless the features are split."""
        return num_heads


_SINGLE_DEVICE = TransformerLayers()


class SelfAttention(Module):
    """Multi-head self-attention on ``(batch, tokens, dim)``: a fused query/key/value projection,
    the attention core on ``(batch, heads, tokens, head_dim)``, an output projection. Only the
    core mixes tokens; with split features each process runs :meth:`~TransformerLayers.local_heads`
    whole heads.

    Example::

        attn = M.SelfAttention(64, 4, causal=True)
        y = attn(x)  # x: (N, L, 64)
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0, causal: bool = False,
                 layers: TransformerLayers | None = None, **kwargs):
        super().__init__(**kwargs)
        if dim % num_heads:
            raise ValueError(f"SelfAttention: dim {dim} is not divisible by num_heads {num_heads}")
        layers = _SINGLE_DEVICE if layers is None else layers
        self.dim, self.num_heads, self.causal = int(dim), int(num_heads), bool(causal)
        self.head_dim = self.dim // self.num_heads
        self.qkv = layers.linear(dim, 3 * dim, chunks=3)
        self.local_heads = layers.local_heads(self.num_heads)
        self.core = layers.attention_core(self.causal, dropout)
        self.proj = layers.linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.qkv(x)
        b, s = qkv.shape[0], qkv.shape[1]
        h, d = self.local_heads, self.head_dim
        q, k, v = qkv.reshape(b, s, 3, h, d).transpose(2, 0, 3, 1, 4)
        out = self.core(q, k, v)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, s, h * d))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"


class MLP(Module):
    """``fc2(gelu(fc1(x)))``, ``dim → hidden → dim`` (a column→row pair in 1D tensor
    parallelism)."""

    def __init__(self, dim: int, hidden: int, layers: TransformerLayers | None = None, **kwargs):
        super().__init__(**kwargs)
        layers = _SINGLE_DEVICE if layers is None else layers
        self.fc1 = layers.linear(dim, hidden)
        self.act = GELU()
        self.fc2 = layers.linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(Module):
    """Pre-LayerNorm transformer block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``
    with a GELU MLP of ``mlp_ratio × dim`` hidden features.

    Example::

        block = M.TransformerBlock(256, 8, causal=True)
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 4, dropout: float = 0.0,
                 causal: bool = False, layers: TransformerLayers | None = None, **kwargs):
        super().__init__(**kwargs)
        layers = _SINGLE_DEVICE if layers is None else layers
        self.ln1 = layers.layer_norm(dim)
        self.attn = SelfAttention(dim, num_heads, dropout, causal, layers)
        self.drop1 = layers.dropout(dropout)
        self.ln2 = layers.layer_norm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim, layers)
        self.drop2 = layers.dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.mlp(self.ln2(x)))


class TransformerLM(Module):
    """A small language model: token and position embeddings, ``num_layers`` blocks, a final
    LayerNorm ``ln_f`` and an output layer ``head`` over the vocabulary. ``forward(ids)`` takes
    ``(batch, tokens)`` integer ids and returns ``(batch, tokens, vocab_size)`` logits.

    A parallel model overrides :meth:`positions` when a process holds only some of the tokens of
    each sequence.

    Example::

        lm = M.TransformerLM(vocab_size=96, dim=64, num_heads=4, num_layers=2, max_len=64)
        logits = lm(ids)  # ids: (N, L) int
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, num_layers: int, max_len: int,
                 mlp_ratio: int = 4, dropout: float = 0.0, causal: bool = True,
                 head_bias: bool = True, layers: TransformerLayers | None = None, **kwargs):
        super().__init__(**kwargs)
        layers = _SINGLE_DEVICE if layers is None else layers
        self.max_len = int(max_len)
        self.tok = layers.embedding(vocab_size, dim)
        self.pos = layers.embedding(max_len, dim)
        self.drop = layers.dropout(dropout)
        self.blocks = Sequential(*[
            TransformerBlock(dim, num_heads, mlp_ratio, dropout, causal, layers)
            for _ in range(num_layers)
        ])
        self.ln_f = layers.layer_norm(dim)
        self.head = layers.classifier(dim, vocab_size, bias=head_bias)

    def positions(self, tokens: int) -> np.ndarray:
        """The positions in their sequence of the ``tokens`` tokens of each row of ``ids``."""
        self.check_length(tokens)
        return np.arange(tokens, dtype=np.int64)

    def check_length(self, seq_len: int) -> None:
        """Raise when a sequence of ``seq_len`` tokens is longer than the position table."""
        if seq_len > self.max_len:
            raise ValueError(
                f"{type(self).__name__}: sequence length {seq_len} exceeds max_len {self.max_len}"
            )

    def embed(self, ids: Tensor) -> Tensor:
        """Token plus position embeddings of ``(batch, tokens)`` ids, after dropout."""
        pos = Tensor(self.positions(ids.shape[1]), device=self.pos.weight.device)
        return self.drop(self.tok(ids) + self.pos(pos))

    def forward(self, ids) -> Tensor:
        if not isinstance(ids, Tensor):
            ids = Tensor(np.asarray(ids), device=self.tok.weight.device)
        if ids.ndim != 2:
            raise ValueError(f"{type(self).__name__}: ids must be (batch, tokens), got {ids.shape}")
        return self.head(self.ln_f(self.blocks(self.embed(ids))))
