"""A small transformer language model whose attention is sequence-parallel: ring or Ulysses with
one argument, or dense attention for the single-device twin.

Every rank runs the model on its shard of each sequence, ``(B, L/N)`` token ids. Everything except
attention is token-wise and runs locally: the token embedding, the position embedding (looked up
at the tokens' *global* positions), LayerNorm, the MLP and the LM head. Parameters are replicated;
build the model with the same seed on every rank (or broadcast it), sum the gradients over the
sequence × data group and use :func:`~.loss.sequence_cross_entropy` as the loss.

Example::

    mg.random.seed(0)
    model = SequenceParallelLM(vocab_size=64, dim=32, num_heads=4, num_layers=2, max_len=128,
                               attention="ring", zigzag=True)
    ids, labels = split_lm_batch(tokens, zigzag=True)              # (B, L/N) each
    gm = GradManager().attach(model.parameters(),
                              callbacks=[dist.make_allreduce_cb("sum", group=gradient_group())])
    with gm:
        gm.backward(sequence_cross_entropy(model(Tensor(ids)), labels))
"""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.groups import sequence_group
from minigrad.distributed.sequence_parallel.ring_attention import RingAttention
from minigrad.distributed.sequence_parallel.sharding import sequence_positions
from minigrad.distributed.sequence_parallel.ulysses import UlyssesAttention

__all__ = ["ATTENTIONS", "DenseAttention", "SelfAttention", "SequenceParallelLM",
           "TransformerBlock", "make_attention"]

ATTENTIONS = ("ring", "ulysses", "dense")


class DenseAttention(M.Module):
    """Attention over the tokens this process holds, with no communication: the single-device
    twin of :class:`~.ring_attention.RingAttention` and :class:`~.ulysses.UlyssesAttention`."""

    def __init__(self, causal: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.causal = bool(causal)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def make_attention(attention: str, causal: bool, zigzag: bool, group: Group | None,
                   overlap: bool) -> M.Module:
    """The attention core named ``attention`` (one of :data:`ATTENTIONS`)."""
    if attention == "ring":
        return RingAttention(causal=causal, zigzag=zigzag, group=group, overlap=overlap)
    if attention == "ulysses":
        return UlyssesAttention(causal=causal, group=group, zigzag=zigzag)
    if attention == "dense":
        return DenseAttention(causal=causal)
    raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")


class SelfAttention(M.Module):
    """Multi-head self-attention on ``(B, T, dim)``: a fused q/k/v projection, the attention core
    on ``(B, heads, T, head_dim)``, an output projection. Only the core communicates."""

    def __init__(self, dim: int, num_heads: int, core: M.Module, **kwargs):
        super().__init__(**kwargs)
        if dim % num_heads:
            raise ValueError(f"SelfAttention: dim={dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = int(num_heads), dim // num_heads
        self.qkv = M.Linear(dim, 3 * dim)
        self.core = core
        self.proj = M.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, dim = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.num_heads, self.head_dim)
        q, k, v = F.split(qkv.transpose(2, 0, 3, 1, 4), 3, axis=0)
        out = self.core(q.reshape(q.shape[1:]), k.reshape(k.shape[1:]), v.reshape(v.shape[1:]))
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, t, dim))


class TransformerBlock(M.Module):
    """Pre-norm block: ``x + attn(LN(x))``, then ``x + MLP(LN(x))`` with a GELU MLP."""

    def __init__(self, dim: int, num_heads: int, core: M.Module, mlp_ratio: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.ln1 = M.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, core)
        self.ln2 = M.LayerNorm(dim)
        self.mlp = M.Sequential(M.Linear(dim, mlp_ratio * dim), M.GELU(),
                                M.Linear(mlp_ratio * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SequenceParallelLM(M.Module):
    """A small transformer LM on this rank's shard of each sequence (see the module docstring).

    ``attention``: "ring" (:class:`RingAttention`), "ulysses" (:class:`UlyssesAttention`, needs
    ``num_heads`` divisible by the sequence group size) or "dense" (no sequence parallelism: the
    single-device model). ``zigzag`` says the shards are zigzag (:func:`split_sequence`) — it sets
    the positions and the causal work split. ``dtype`` casts the parameters after the usual
    initialisation (``"float64"`` for exactness checks). ``forward(ids)`` takes ``(B, T)`` integer
    ids and returns ``(B, T, vocab_size)`` logits; the sequence length is ``T·N`` (``T`` for
    "dense").
    """

    def __init__(self, vocab_size: int, dim: int, num_heads: int, num_layers: int, max_len: int,
                 attention: str = "ring", causal: bool = True, zigzag: bool = False,
                 group: Group | None = None, mlp_ratio: int = 4, overlap: bool = True,
                 dtype="float32", **kwargs):
        super().__init__(**kwargs)
        if attention not in ATTENTIONS:
            raise ValueError(
                f"SequenceParallelLM: attention must be one of {ATTENTIONS}, got {attention!r}"
            )
        self.attention, self.zigzag, self.group = attention, bool(zigzag), group
        self.max_len = int(max_len)
        self.tok = M.Embedding(vocab_size, dim)
        self.pos = M.Embedding(max_len, dim)
        self.blocks = M.Sequential(*[
            TransformerBlock(dim, num_heads, make_attention(attention, causal, zigzag, group,
                                                            overlap), mlp_ratio)
            for _ in range(num_layers)
        ])
        self.ln_f = M.LayerNorm(dim)
        self.head = M.Linear(dim, vocab_size)
        if np.dtype(dtype) != np.float32:
            _cast_parameters(self, np.dtype(dtype))

    def positions(self, shard_len: int) -> np.ndarray:
        """The global positions of this rank's ``shard_len`` tokens."""
        if self.attention == "dense":
            seq_len, pos = shard_len, np.arange(shard_len, dtype=np.int64)
        else:
            seq_len = shard_len * sequence_group(self.group).size
            pos = sequence_positions(seq_len, self.zigzag, self.group)
        if seq_len > self.max_len:
            raise ValueError(
                f"SequenceParallelLM: sequence length {seq_len} exceeds max_len {self.max_len}"
            )
        return pos

    def embed(self, ids: Tensor) -> Tensor:
        """Token plus position embeddings of this rank's ``(B, T)`` ids: ``(B, T, dim)``."""
        pos = Tensor(self.positions(ids.shape[1]), device=self.pos.weight.device)
        return self.tok(ids) + self.pos(pos)

    def forward(self, ids) -> Tensor:
        if not isinstance(ids, Tensor):
            ids = Tensor(np.asarray(ids), device=self.tok.weight.device)
        if ids.ndim != 2:
            raise ValueError(f"SequenceParallelLM: ids must be (batch, tokens), got {ids.shape}")
        return self.head(self.ln_f(self.blocks(self.embed(ids))))


def _cast_parameters(module: M.Module, dtype: np.dtype) -> None:
    """Replace every parameter of ``module`` by a copy of dtype ``dtype``."""
    for m in module.modules():
        for name, value in list(vars(m).items()):
            if isinstance(value, Parameter):
                setattr(m, name, Parameter(value.numpy().astype(dtype), device=value.device))
