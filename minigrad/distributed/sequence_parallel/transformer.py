"""A small transformer language model whose attention is sequence-parallel: ring or Ulysses with
one argument, or dense attention for the single-device twin. It is the transformer of
:mod:`minigrad.module.transformer` with a sequence-parallel attention core
(:class:`SequenceParallelLayers`) and global token positions.

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

import minigrad.module as M
from minigrad.autodiff.tensor import Parameter
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.groups import sequence_group
from minigrad.distributed.sequence_parallel.ring_attention import RingAttention
from minigrad.distributed.sequence_parallel.sharding import sequence_positions
from minigrad.distributed.sequence_parallel.ulysses import UlyssesAttention

__all__ = ["ATTENTIONS", "DenseAttention", "SequenceParallelLM", "SequenceParallelLayers",
           "make_attention"]

ATTENTIONS = ("ring", "ulysses", "dense")

# Attention over the tokens this process holds, with no communication: the single-device twin of
# RingAttention and UlyssesAttention.
DenseAttention = M.DotProductAttention


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


class SequenceParallelLayers(M.TransformerLayers):
    """The single-device layers with a sequence-parallel attention core (:func:`make_attention`);
    every other layer is token-wise and runs on this rank's tokens."""

    def __init__(self, attention: str, zigzag: bool, group: Group | None, overlap: bool):
        self.attention, self.zigzag, self.group, self.overlap = attention, zigzag, group, overlap

    def attention_core(self, causal: bool, dropout: float) -> M.Module:
        """The core named by ``attention``; it has no dropout."""
        return make_attention(self.attention, causal, self.zigzag, self.group, self.overlap)


class SequenceParallelLM(M.TransformerLM):
    """A small transformer LM on this rank's shard of each sequence (see the module docstring):
    :class:`minigrad.module.TransformerLM` with a sequence-parallel attention core.

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
        if attention not in ATTENTIONS:
            raise ValueError(
                f"SequenceParallelLM: attention must be one of {ATTENTIONS}, got {attention!r}"
            )
        super().__init__(
            vocab_size, dim, num_heads, num_layers, max_len, mlp_ratio, causal=causal,
            layers=SequenceParallelLayers(attention, zigzag, group, overlap), **kwargs)
        self.attention, self.zigzag, self.group = attention, bool(zigzag), group
        if np.dtype(dtype) != np.float32:
            _cast_parameters(self, np.dtype(dtype))

    def positions(self, shard_len: int) -> np.ndarray:
        """The global positions of this rank's ``shard_len`` tokens."""
        if self.attention == "dense":
            return super().positions(shard_len)
        seq_len = shard_len * sequence_group(self.group).size
        pos = sequence_positions(seq_len, self.zigzag, self.group)
        self.check_length(seq_len)
        return pos


def _cast_parameters(module: M.Module, dtype: np.dtype) -> None:
    """Replace every parameter of ``module`` by a copy of dtype ``dtype``."""
    for m in module.modules():
        for name, value in list(vars(m).items()):
            if isinstance(value, Parameter):
                setattr(m, name, Parameter(value.numpy().astype(dtype), device=value.device))
