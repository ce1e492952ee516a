"""Sequence sharding: which tokens each rank of the sequence group holds, and moving between the
full sequence and the shards.

A sequence of L tokens is shared by the N ranks of the sequence group in one of two layouts:

* **contiguous**: rank r holds tokens ``[r·c, (r+1)·c)`` with ``c = L/N`` (L divisible by N);
* **zigzag**: the sequence is cut into 2N chunks of ``h = L/(2N)`` tokens and rank r holds chunks
  ``r`` and ``2N−1−r``, in that order (L divisible by 2N). Under a causal mask each rank then has
  one early chunk (few visible keys) and one late chunk (many), so every rank does the same work.

Token-wise layers (embeddings, Linear, LayerNorm, the MLP, the loss) run on the shard without
communication; only attention needs the other ranks' tokens. Embeddings must use the *global*
position of a token (:func:`sequence_positions`), not its index in the shard.

Gradients follow the rule of sequence parallelism: the global loss is the sum of the ranks' local
losses, and a tensor replicated on every rank holds on each rank only that rank's part of its
gradient; the parts are summed over the group (the gradient callback does this for parameters).
So the backward of :func:`split_sequence` pads the shard's gradient with zeros (no
communication), and the backward of :func:`gather_sequence` is a reduce-scatter (the adjoint of
the all-gather).
"""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import get_array_module
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm import functional as dist_F
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.groups import position_in, sequence_group

__all__ = [
    "check_sequence_length",
    "gather_sequence",
    "sequence_positions",
    "shard_ranges",
    "split_lm_batch",
    "split_sequence",
]


def _layout(zigzag: bool) -> str:
    return "zigzag" if zigzag else "contiguous"


def check_sequence_length(op: str, seq_len: int, world: int, zigzag: bool) -> None:
    """Raise a ValueError naming ``op``, L, N and the layout unless L splits into equal shards
    (divisible by N for the contiguous layout, by 2N for zigzag)."""
    need = 2 * world if zigzag else world
    if seq_len % need:
        what = "2N" if zigzag else "N"
        raise ValueError(
            f"{op}: sequence length L={seq_len} is not divisible by {what}={need} "
            f"(N={world} ranks, {_layout(zigzag)} layout)"
        )


def shard_ranges(seq_len: int, rank: int, world: int, zigzag: bool = False) -> list[tuple]:
    """The ``(start, stop)`` token ranges rank ``rank`` of ``world`` holds, in shard order.

    Example::

        shard_ranges(8, 1, 2, zigzag=True)    # [(2, 4), (4, 6)]: chunks 1 and 2 of 4
    """
    check_sequence_length("shard_ranges", seq_len, world, zigzag)
    if not zigzag:
        c = seq_len // world
        return [(rank * c, (rank + 1) * c)]
    h = seq_len // (2 * world)
    late = 2 * world - 1 - rank
    return [(rank * h, (rank + 1) * h), (late * h, (late + 1) * h)]


def sequence_positions(seq_len: int, zigzag: bool = False, group: Group | None = None):
    """The global positions (int64 NumPy array) of this rank's tokens of a length-``seq_len``
    sequence: ``r·c + t`` for the contiguous layout, the positions of chunks ``r`` and ``2N−1−r``
    for zigzag. Feed them to the position embedding.

    Example::

        pos = sequence_positions(16)          # rank 1 of 2: [8, 9, ..., 15]
    """
    index, world = position_in("sequence_positions", sequence_group(group))
    return np.concatenate(
        [np.arange(a, b, dtype=np.int64) for a, b in shard_ranges(seq_len, index, world, zigzag)]
    )


def _axis(op: str, x, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a {x.ndim}-D input {x.shape}")
    return axis % x.ndim


def _concat_ranges(x, axis: int, ranges):
    """``x`` restricted to the token ``ranges`` along ``axis``, concatenated (Tensor or array)."""
    parts = [x[(slice(None),) * axis + (slice(a, b),)] for a, b in ranges]
    if len(parts) == 1:
        return parts[0]
    if isinstance(x, Tensor):
        return F.concat(parts, axis)
    return get_array_module(x).concatenate(parts, axis)


def split_sequence(x, axis: int, zigzag: bool = False, group: Group | None = None):
    """This rank's shard of the full sequence ``x`` (a Tensor or a NumPy/CuPy array, the same on
    every rank) along ``axis``. Differentiable: the shard's gradient flows back into its positions
    of ``x`` (zeros elsewhere; see the module docstring for why there is no communication).

    Example::

        ids_local = split_sequence(ids, axis=1)              # (B, L) -> (B, L/N)
        q_local = split_sequence(q, axis=2, zigzag=True)     # (B, H, L, D) -> (B, H, L/N, D)
    """
    op = "split_sequence"
    axis = _axis(op, x, axis)
    index, world = position_in(op, sequence_group(group))
    check_sequence_length(op, x.shape[axis], world, zigzag)
    if world == 1:
        return x
    return _concat_ranges(x, axis, shard_ranges(x.shape[axis], index, world, zigzag))


def gather_sequence(x, axis: int, zigzag: bool = False, group: Group | None = None):
    """The full sequence from every rank's shard ``x`` along ``axis`` (inverse of
    :func:`split_sequence`), on every rank. Differentiable (an all-gather, whose backward
    reduce-scatters the gradient). Arrays are gathered too, without autodiff.

    Example::

        logits = gather_sequence(logits_local, axis=1)      # (B, L/N, V) -> (B, L, V)
    """
    op = "gather_sequence"
    axis = _axis(op, x, axis)
    group = sequence_group(group)
    _, world = position_in(op, group)
    if zigzag and x.shape[axis] % 2:
        raise ValueError(
            f"{op}: a zigzag shard holds two equal chunks, but axis {axis} has "
            f"{x.shape[axis]} tokens (odd) on this rank"
        )
    if world == 1:
        return x
    if isinstance(x, Tensor):
        full = dist_F.all_gather(x, group, axis)
    else:
        full = comm.all_gather_along(x, axis, group)
    if not zigzag:
        return full
    # ``full`` holds, per rank r, chunks r and 2N-1-r; chunk j sits at slot 2j (j < N) or
    # 2(2N-1-j)+1 (j >= N). Put the chunks back in order.
    h = x.shape[axis] // 2
    slots = [2 * j if j < world else 2 * (2 * world - 1 - j) + 1 for j in range(2 * world)]
    return _concat_ranges(full, axis, [(s * h, (s + 1) * h) for s in slots])


def split_lm_batch(tokens, zigzag: bool = False, group: Group | None = None):
    """``(input_ids, labels)`` shards for next-token prediction from ``tokens`` of shape
    ``(B, L + 1)`` (the same on every rank): inputs are ``tokens[:, :-1]`` and labels
    ``tokens[:, 1:]``, shifted *before* splitting, because the label of a shard's last token is the
    first token of the next shard. Arrays in, arrays out.

    Example::

        ids, labels = split_lm_batch(tokens)          # each (B, L/N)
    """
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(
            f"split_lm_batch: expected tokens of shape (B, L + 1) with L >= 1, got {tokens.shape}"
        )
    return (split_sequence(tokens[:, :-1], 1, zigzag, group),
            split_sequence(tokens[:, 1:], 1, zigzag, group))
