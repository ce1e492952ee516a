"""Ulysses attention (DeepSpeed): sequence parallelism by trading the split of the sequence for a
split of the heads.

Each rank of the sequence group holds ``(B, H, L/N, D)`` shards of q, k, v. One all-to-all per
tensor turns them into ``(B, H/N, L, D)``: every rank gets all L tokens of H/N heads. Attention is
then ordinary local attention (``F.scaled_dot_product_attention``) on whole sequences, and one more
all-to-all turns the output back into ``(B, H, L/N, D)`` — four all-to-alls per layer, each moving
``1/N`` of a tensor per rank. The heads must divide evenly over the ranks. The score matrix per
rank is ``(H/N) × L × L``: memory still falls as 1/N, but quadratically in L, unlike ring
attention.
"""

from __future__ import annotations

import functools

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm import functional as dist_F
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.checks import check_qkv, check_zigzag_shard
from minigrad.distributed.sequence_parallel.groups import position_in, sequence_group
from minigrad.distributed.sequence_parallel.sharding import shard_ranges
from minigrad.module.module import Module

__all__ = ["UlyssesAttention", "ulysses_attention"]


@functools.lru_cache(maxsize=16)
def _zigzag_causal_mask(shard_len: int, world: int) -> np.ndarray:
    """May-attend mask (True) over the tokens in the order the all-to-all gathers zigzag shards
    (the same for every layer and step: built once per shape, never written)."""
    seq_len = shard_len * world
    pos = np.concatenate([
        np.arange(a, b) for r in range(world) for a, b in shard_ranges(seq_len, r, world, True)
    ])
    return pos[:, None] >= pos[None, :]


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                      group: Group | None = None, scale: float | None = None,
                      zigzag: bool = False) -> Tensor:
    """Functional Ulysses attention on this rank's shards ``(batch, heads, L/N, head_dim)``; see
    :class:`UlyssesAttention`.

    Example::

        out = ulysses_attention(q, k, v, causal=True)
    """
    op = "UlyssesAttention"
    check_qkv(op, q, k, v)
    group = sequence_group(group)
    _, world = position_in(op, group)
    heads, shard_len = q.shape[1], q.shape[2]
    if heads % world:
        raise ValueError(
            f"{op}: heads={heads} is not divisible by N={world} (the ranks of the sequence "
            f"group); each rank attends over H/N whole heads"
        )
    if zigzag:
        check_zigzag_shard(op, shard_len)
    if world > 1:
        q, k, v = (dist_F.all_to_all(t, group, split_axis=1, concat_axis=2) for t in (q, k, v))
    mask = None
    if causal and zigzag and world > 1:
        mask = q.xp.asarray(_zigzag_causal_mask(shard_len, world))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale
    )
    if world > 1:
        out = dist_F.all_to_all(out, group, split_axis=2, concat_axis=1)
    return out


class UlyssesAttention(Module):
    """Exact multi-head attention over a sequence split across the sequence group, by all-to-all
    between a token split and a head split (see the module docstring). Needs the number of heads
    to be divisible by the group size N.

    Called as ``attn(q, k, v)`` on this rank's shards ``(batch, heads, L/N, head_dim)``.
    ``zigzag=True`` accepts zigzag shards (only the causal mask depends on the layout), so a model
    can switch between ring and Ulysses attention without changing its data layout.
    ``group=None`` is the default sequence group; ``scale`` defaults to ``1/sqrt(head_dim)``.

    Example::

        attn = UlyssesAttention(causal=True)
        out = attn(q, k, v)                       # (B, H, L/N, D) on every rank
    """

    def __init__(self, causal: bool = False, group: Group | None = None,
                 scale: float | None = None, zigzag: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.causal, self.group, self.scale, self.zigzag = bool(causal), group, scale, bool(zigzag)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return ulysses_attention(q, k, v, self.causal, self.group, self.scale, self.zigzag)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, zigzag={self.zigzag}"
