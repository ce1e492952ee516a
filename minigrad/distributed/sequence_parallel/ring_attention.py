"""Ring attention: exact softmax attention over a sequence split across the N ranks of a ring,
without any rank ever holding more than one (L/N) × (L/N) score block per head.

Forward (online softmax). Rank r holds ``q_r, k_r, v_r`` of shape ``(B, H, c, D)``, ``c = L/N``.
In N steps the K/V blocks travel one hop around the ring (send to r+1, receive from r−1), so at
step t rank r holds the block of rank ``(r − t) mod N``. For each block it computes the scores
``s = (q·scale) kᵀ`` (one c × c block per head) and folds them into a running row maximum ``m``,
normaliser ``ℓ`` and output ``o``::

    m' = max(m, rowmax(s));  p = exp(s − m');  α = exp(m − m')
    ℓ  = α·ℓ + rowsum(p);    o = α·o + p·v;   m = m'

and finally ``out = o / ℓ`` and ``lse = m + log ℓ`` (the log-sum-exp of every score row, saved for
backward). The hop that brings the next block is started *before* the current block is computed,
so the transfer hides behind the compute (:class:`~.transfer.RingExchange`).

Backward (an exact replay). With ``δ = rowsum(dout ∘ out)`` each block's gradients follow from the
saved ``lse`` alone: ``p = exp(s − lse)``, ``dv += pᵀ dout``, ``ds = p ∘ (dout vᵀ − δ)``,
``dq += ds k``, ``dk += dsᵀ q`` (times the scale). The K/V blocks go around the ring again, and each
block's ``dk, dv`` accumulators travel with it: a rank adds its contribution to the accumulators
that arrive and passes them on, and after N hops they are back with the block's owner, complete.

Causal masks. Step 0 is a rank's own block, the diagonal, masked inside. With contiguous shards
rank r sees all of the blocks of ranks s < r and none of s > r, which it skips — so rank N−1 does N
times the work of rank 0. With **zigzag** shards (rank r holds chunks r and 2N−1−r of 2N, see
:mod:`.sharding`) every off-diagonal block is half visible: for s < r all of my queries see the
sender's early chunk (its late chunk is entirely in my future), for s > r only my late chunk sees
the sender's two chunks. So every rank computes the diagonal plus N−1 half blocks — the same work —
and the halves the mask removes are never computed (only inside the diagonal block is the mask
applied element by element). :func:`ring_block_plan` is that table.

:func:`record_score_blocks` logs every score-sized array the kernel allocates (shape and bytes):
tests use it to check the c × c bound and the balance of the causal work, benchmarks to measure
the memory of attention.
"""

from __future__ import annotations

import contextlib
import math
from collections import namedtuple

from minigrad.autodiff import Function, is_recording
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import get_array_module
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.checks import check_qkv, check_zigzag_shard
from minigrad.distributed.sequence_parallel.groups import position_in, sequence_group
from minigrad.distributed.sequence_parallel.transfer import RingExchange
from minigrad.module.module import Module

__all__ = [
    "BlockPlan",
    "RingAttention",
    "RingAttentionFunction",
    "ScoreBlock",
    "record_score_blocks",
    "ring_attention",
    "ring_block_plan",
]

BlockPlan = namedtuple("BlockPlan", ["rows", "cols", "diagonal"])
BlockPlan.__doc__ = """What one ring step computes: the query tokens ``rows`` and key tokens
``cols`` (slices of the shards) and whether the causal mask cuts through it (``diagonal``)."""

ScoreBlock = namedtuple("ScoreBlock", ["phase", "step", "source", "shape", "nbytes"])
ScoreBlock.__doc__ = """A score-sized array the ring kernel allocated: ``phase`` "forward" or
"backward", the ring ``step``, the group index of the K/V block's owner (``source``), its
``shape`` ``(B, H, rows, cols)`` and ``nbytes``."""

_RECORDERS: list[list] = []


@contextlib.contextmanager
def record_score_blocks():
    """Log every score block the ring kernel allocates on this rank while the block runs.

    Example::

        with record_score_blocks() as blocks:
            out = attn(q, k, v)
        max(b.shape[-2] * b.shape[-1] for b in blocks)       # (L/N)**2 at most
    """
    log: list = []
    _RECORDERS.append(log)
    try:
        yield log
    finally:
        _RECORDERS.remove(log)


def _note(phase: str, step: int, source: int, block) -> None:
    for log in _RECORDERS:
        log.append(ScoreBlock(phase, step, source, tuple(block.shape), int(block.nbytes)))


def ring_block_plan(rank: int, source: int, world: int, shard_len: int, causal: bool,
                    zigzag: bool) -> BlockPlan | None:
    """The part of the (my queries × ``source``'s keys) block that ring step must compute, or None
    when the causal mask removes all of it.

    Example::

        ring_block_plan(0, 1, 2, 8, causal=True, zigzag=True)   # rows 4:8 (my late chunk), cols 0:8
    """
    full = slice(0, shard_len)
    if not causal:
        return BlockPlan(full, full, False)
    if source == rank:
        return BlockPlan(full, full, True)
    if not zigzag:
        return BlockPlan(full, full, False) if source < rank else None
    half = shard_len // 2
    if source < rank:
        return BlockPlan(full, slice(0, half), False)
    return BlockPlan(slice(half, shard_len), full, False)


def _scores(xp, q_scaled, k, diagonal: bool):
    """``q_scaled kᵀ`` with the causal mask applied inside a diagonal block."""
    s = xp.matmul(q_scaled, xp.swapaxes(k, -1, -2))
    if diagonal:
        n = s.shape[-1]
        s[..., xp.triu(xp.ones((n, n), dtype=bool), 1)] = -xp.inf
    return s


def _fold(xp, s, v, o, m, l) -> None:
    """Fold one score block ``s`` (overwritten) and its values ``v`` into the running output
    ``o``, row maximum ``m`` and normaliser ``l`` (views of this rank's state, updated in place)."""
    m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
    s -= m_new
    xp.exp(s, out=s)
    alpha = xp.exp(m - m_new)
    l *= alpha
    l += s.sum(axis=-1, keepdims=True)
    o *= alpha
    o += xp.matmul(s, v)
    m[...] = m_new


def _ring_blocks(ring: RingExchange, rank: int, kv: list, causal: bool, zigzag: bool):
    """Yield ``(step, source, plan, kv)`` for the N ring steps: the K/V block held at each step
    (that of group rank ``source``) and what to compute with it. The hop bringing the next block
    starts before the step is handed out and is waited for only when the next one is asked for,
    so it overlaps the caller's compute."""
    n, c = ring.size, kv[0].shape[-2]
    for step in range(n):
        source = (rank - step) % n
        pending = ring.shift(kv) if step < n - 1 else None
        yield step, source, ring_block_plan(rank, source, n, c, causal, zigzag), kv
        if pending is not None:
            kv = pending.wait()


def _shard_mismatch(rank: int, source: int, k, v, kv) -> str | None:
    if kv[0].shape == k.shape and kv[1].shape == v.shape:
        return None
    return (
        f"RingAttention: the shards differ across the sequence group: group rank {rank} holds k "
        f"{k.shape} and v {v.shape}, group rank {source} holds k {kv[0].shape} and v "
        f"{kv[1].shape}; every rank must hold L/N tokens of the same batch and heads"
    )


def ring_forward(q_scaled, k, v, ring: RingExchange, rank: int, causal: bool, zigzag: bool):
    """Raw-array forward on this rank's shards; returns ``(out, lse)``. ``q_scaled`` is ``q``
    times the softmax scale."""
    xp = get_array_module(q_scaled)
    o = xp.zeros(q_scaled.shape[:-1] + v.shape[-1:], q_scaled.dtype)
    m = xp.full(q_scaled.shape[:-1] + (1,), -xp.inf, q_scaled.dtype)
    l = xp.zeros_like(m)
    error = None
    for step, source, plan, kv in _ring_blocks(ring, rank, [k, v], causal, zigzag):
        # after a mismatch keep passing the blocks on, so that every rank sees it and raises
        error = error or _shard_mismatch(rank, source, k, v, kv)
        if plan is not None and error is None:
            rows, cols = (..., plan.rows, slice(None)), (..., plan.cols, slice(None))
            s = _scores(xp, q_scaled[rows], kv[0][cols], plan.diagonal)
            _note("forward", step, source, s)
            _fold(xp, s, kv[1][cols], o[rows], m[rows], l[rows])
            del s
    if error:
        raise ValueError(error)
    return o / l, m + xp.log(l)


def _block_grads(xp, q_scaled, k, v, dout, lse, delta, dq, plan: BlockPlan, step: int,
                 source: int) -> list:
    """``[dk, dv]`` of one block (zeros outside ``plan.cols``); adds the block's part to ``dq``."""
    rows, cols = (..., plan.rows, slice(None)), (..., plan.cols, slice(None))
    dk, dv = xp.zeros_like(k), xp.zeros_like(v)
    q_r, dout_r = q_scaled[rows], dout[rows]
    p = _scores(xp, q_r, k[cols], plan.diagonal)
    _note("backward", step, source, p)
    p -= lse[rows]
    xp.exp(p, out=p)
    dv[cols] += xp.matmul(xp.swapaxes(p, -1, -2), dout_r)
    ds = xp.matmul(dout_r, xp.swapaxes(v[cols], -1, -2))
    _note("backward", step, source, ds)
    ds -= delta[rows]
    ds *= p
    del p
    dq[rows] += xp.matmul(ds, k[cols])
    dk[cols] += xp.matmul(xp.swapaxes(ds, -1, -2), q_r)
    return [dk, dv]


def ring_backward(dout, q_scaled, k, v, out, lse, ring: RingExchange, rank: int, causal: bool,
                  zigzag: bool):
    """Raw-array backward replaying the ring; returns ``(dq_scaled, dk, dv)`` where ``dq_scaled``
    still needs the softmax scale (the gradient with respect to ``q_scaled``)."""
    xp = get_array_module(q_scaled)
    delta = (dout * out).sum(axis=-1, keepdims=True)
    dq = xp.zeros_like(q_scaled)
    pending_grads = None
    for step, source, plan, kv in _ring_blocks(ring, rank, [k, v], causal, zigzag):
        grads = None
        if plan is not None:
            grads = _block_grads(xp, q_scaled, kv[0], kv[1], dout, lse, delta, dq, plan, step,
                                 source)
        if step > 0:  # the accumulators of the block I hold now, from the ranks before me
            arrived = pending_grads.wait()
            if grads is None:
                grads = arrived
            else:
                grads[0] += arrived[0]
                grads[1] += arrived[1]
        if ring.size > 1:  # pass them on; after the last step they travel home to their owner
            pending_grads = ring.shift(grads)
    dk, dv = pending_grads.wait() if ring.size > 1 else grads
    return dq, dk, dv


class RingAttentionFunction(Function):
    """The autodiff node of ring attention: forward and backward run the ring on raw arrays."""

    def forward(self, q, k, v, group: Group, causal: bool, zigzag: bool, scale: float,
                overlap: bool):
        rank, _ = position_in("RingAttention", group)
        q_scaled = q.data * scale
        with RingExchange(group, q.device, overlap) as ring:
            out, lse = ring_forward(q_scaled, k.data, v.data, ring, rank, causal, zigzag)
        self.saved = (q_scaled, k.data, v.data, out, lse)
        self.ring_args = (group, q.device, overlap, rank, causal, zigzag, scale)
        return out

    def backward(self, dout):
        if is_recording():
            raise NotImplementedError(
                "RingAttention: second-order gradients are not supported (its backward replays "
                "the ring on raw arrays)"
            )
        group, device, overlap, rank, causal, zigzag, scale = self.ring_args
        with RingExchange(group, device, overlap) as ring:
            dq, dk, dv = ring_backward(dout.data, *self.saved, ring, rank, causal, zigzag)
        dq *= scale
        return dq, dk, dv, None, None, None, None, None


def default_scale(scale: float | None, head_dim: int) -> float:
    """``scale``, or the usual ``1/sqrt(head_dim)`` when it is None."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, zigzag: bool = False,
                   group: Group | None = None, scale: float | None = None,
                   overlap: bool = True) -> Tensor:
    """Functional ring attention on this rank's shards ``(batch, heads, L/N, head_dim)``; returns
    this rank's shard of ``softmax(q kᵀ·scale + mask) v``. See :class:`RingAttention`.

    Example::

        out = ring_attention(q, k, v, causal=True, zigzag=True)
    """
    op = "RingAttention"
    check_qkv(op, q, k, v)
    group = sequence_group(group)
    position_in(op, group)
    if zigzag:
        check_zigzag_shard(op, q.shape[2])
    scale = default_scale(scale, q.shape[-1])
    return RingAttentionFunction()(q, k, v, group, bool(causal), bool(zigzag), scale,
                                   bool(overlap))


class RingAttention(Module):
    """Exact multi-head attention over a sequence split across the sequence group, blockwise around
    a ring (see the module docstring): memory per rank is one (L/N)² score block per head, and the
    transfer of the next K/V block overlaps the compute of the current one (``overlap=False``
    serialises them, for comparison).

    Called as ``attn(q, k, v)`` on this rank's shards ``(batch, heads, L/N, head_dim)`` laid out as
    :func:`~.sharding.split_sequence` makes them (``zigzag`` must match the layout; with
    ``causal=True`` zigzag shards give every rank the same work). ``group=None`` is the default
    sequence group (:func:`~.groups.sequence_group`); ``scale`` defaults to ``1/sqrt(head_dim)``.

    Example::

        attn = RingAttention(causal=True, zigzag=True)
        out = attn(q, k, v)                       # (B, H, L/N, D) on every rank
    """

    def __init__(self, causal: bool = False, zigzag: bool = False, group: Group | None = None,
                 scale: float | None = None, overlap: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.causal, self.zigzag, self.group = bool(causal), bool(zigzag), group
        self.scale, self.overlap = scale, bool(overlap)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return ring_attention(q, k, v, self.causal, self.zigzag, self.group, self.scale,
                              self.overlap)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, zigzag={self.zigzag}, overlap={self.overlap}"
