"""Boxing: one routine that moves a global tensor from any (placement, SBP) to any other.

On one placement, the SBP changes one mesh dimension at a time, among the ranks that share every
other mesh coordinate (a *slice* of the mesh); each 1-D change is one of:

=========================  =================================================================
from -> to                 what the ranks of the slice do
=========================  =================================================================
partial_sum -> broadcast   all-reduce (sum)
partial_sum -> split(j)    reduce-scatter along j
split(i) -> broadcast      all-gather along i
split(i) -> split(j)       all-to-all (split along j, concatenate along i)
broadcast -> split(j)      keep the local slice, no communication
broadcast -> partial_sum   the slice's first rank keeps the data, the others hold zeros
split(i) -> partial_sum    each rank keeps its piece in place, zeros elsewhere
same -> same               nothing
=========================  =================================================================

Uneven splits (balanced sizes, see :mod:`.sbp`) move as they are: the array-level collectives cut
and join pieces of any length along an axis.

With several mesh dimensions the order matters when two mesh dimensions split the same tensor
axis (pieces nest in mesh order): a 1-D change on mesh dimension ``d`` is valid only when no later
mesh dimension splits an axis that the change splits or gathers. The planner (``plan_steps``)
makes valid direct changes while it can, and routes what is left through broadcast.

A change of placement: when both meshes have the same shape and the source pieces differ (some
mesh dimension is not broadcast), the SBP is changed on the source placement and each rank sends
its piece to the rank at the same mesh position of the destination (a rank at the same position
in both keeps its piece). Otherwise the source gathers the whole value (broadcast), each rank
joining the placement receives it from one rank of the source (ranks that leave send first; a
rank in both keeps its copy), and the destination cuts it to its SBP without communication. Ranks
in neither placement do nothing.

Gradients: the gradient of a redistribution is the same routine run backwards on the adjoint
layouts (split stays split, broadcast <-> partial_sum), so the backward of an all-gather is a
reduce-scatter, of an all-reduce an all-reduce, of a slice a zero-padding.

Every collective is an array-level one of :mod:`minigrad.distributed.comm.arrays` (the ``*_along``
ones where an axis is cut or joined), carrying the lockstep digest as its ``check`` string
(:mod:`.lockstep`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import get_array_module
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import get_rank
from minigrad.distributed.global_tensor import lockstep
from minigrad.distributed.global_tensor.sbp import (
    adjoint,
    balanced_sizes,
    broadcast,
    describe,
    local_shape,
    local_slices,
    piece_bounds,
)

__all__ = ["Boxing", "Layout", "box", "empty_piece", "piece_of", "plan_steps"]


class Layout(NamedTuple):
    """Where and how a global tensor lives: a placement and one SBP per mesh dimension."""

    placement: object
    sbp: tuple

    def adjoint(self) -> "Layout":
        """The layout of this tensor's gradient."""
        return Layout(self.placement, tuple(adjoint(s) for s in self.sbp))

    def piece_shape(self, shape: tuple, rank: int) -> tuple:
        """The shape of ``rank``'s piece of a logical ``shape`` ((0,) outside the placement)."""
        if rank not in self.placement:
            return (0,)
        return local_shape(shape, self.sbp, self.placement.mesh_shape, self.placement.coord(rank))


def empty_piece(dtype, xp=np):
    """The local data of a global tensor on a rank outside its placement: no elements."""
    return xp.empty((0,), dtype)


def box(a, src: Layout, dst: Layout, shape: tuple, what: str = "to_global"):
    """Redistribute ``a`` (this rank's piece of a tensor of logical ``shape`` laid out as ``src``)
    to ``dst``; returns this rank's new piece. Every rank of both placements must call it."""
    if src == dst:
        return a
    me = get_rank()
    shape = tuple(shape)
    if src.placement == dst.placement:
        line = f"{what} {shape} {describe(src.sbp)} -> {describe(dst.sbp)}"
    else:
        line = (f"{what} {shape} {describe(src.sbp)} on ranks {src.placement.ranks} -> "
                f"{describe(dst.sbp)} on ranks {dst.placement.ranks}")
    for pl in {src.placement, dst.placement}:
        if me in pl:
            lockstep.record(pl, line)
    if src.placement == dst.placement:
        if me not in src.placement:
            return a
        return _box_on(a, src.placement, src.sbp, dst.sbp, shape, line)
    return _move(a, src, dst, shape, line)


# -------------------------------------------------------------------------------------------------
# one placement


def _splits(s) -> set:
    return {s.dim} if s.kind == "S" else set()


def plan_steps(src: tuple, dst: tuple) -> list:
    """The 1-D changes ``(mesh dim, from, to, state before)`` that take nd-SBP ``src`` to
    ``dst``, each valid in the state it runs in (see the module docstring).

    First, direct changes while one is valid (on one mesh dimension that is always: each pair
    is one collective). When the remaining ones are all blocked by a later mesh dimension
    splitting the same axis, the rest goes through broadcast: from the last mesh dimension to the
    first, every dimension that changes or blocks a change is gathered (valid: the later ones
    are broadcast by then), then from the first to the last each is cut to its destination
    without communication (nesting in mesh order, as the layout means)."""
    cur, n, steps = list(src), len(src), []

    def axes(d) -> set:
        return _splits(cur[d]) | _splits(dst[d])

    def blocked(d) -> bool:
        return any(cur[e].kind == "S" and cur[e].dim in axes(d) for e in range(d + 1, n))

    def step(d, to) -> None:
        steps.append((d, cur[d], to, tuple(cur)))
        cur[d] = to

    while True:
        pending = [d for d in range(n) if cur[d] != dst[d]]
        ready = [d for d in pending if not blocked(d)]
        if not ready:
            break
        step(ready[0], dst[ready[0]])
    if not pending:
        return steps
    for d in reversed(range(n)):
        blocks = cur[d].kind == "S" and any(
            cur[c] != dst[c] and cur[d].dim in axes(c) for c in range(d))
        if cur[d].kind != "B" and (cur[d] != dst[d] or blocks):
            step(d, broadcast)
    for d in range(n):
        if cur[d] != dst[d]:
            step(d, dst[d])
    return steps


def _box_on(a, placement, src: tuple, dst: tuple, shape: tuple, line: str):
    """Change the SBP on one placement, one mesh dimension at a time."""
    me = get_rank()
    coord = placement.coord(me)
    for d, frm, to, state in plan_steps(src, dst):
        # the value the slice along d shares: the logical tensor cut by the mesh dims before d
        seen = local_shape(shape, state[:d], placement.mesh_shape[:d], coord[:d])
        a = _box_1d(a, placement, d, frm, to, seen, line)
    return a


def _box_1d(a, placement, d: int, frm, to, seen: tuple, line: str):
    """One mesh dimension ``d``: ``frm`` -> ``to`` among the ranks of this rank's slice, which
    share a value of shape ``seen``."""
    if frm == to:
        return a
    me = get_rank()
    ranks = placement.slice_ranks(d, me)
    k, i = len(ranks), ranks.index(me)
    xp = get_array_module(a)
    if k == 1:
        return a
    if frm.kind == "P" or (frm.kind == "S" and to.kind != "P"):  # a collective follows
        group = placement.slice_group(d, me)
        with lockstep.checked(placement, ranks, f"{line} (mesh dimension {d})") as check:
            return _collective_1d(a, group, frm, to, seen, check)
    if frm.kind == "B" and to.kind == "S":  # keep the local slice
        start, stop = piece_bounds(seen[to.dim], k, i)
        return xp.ascontiguousarray(a[(slice(None),) * to.dim + (slice(start, stop),)])
    if frm.kind == "B":  # -> partial_sum: the first rank keeps the data
        return a if i == 0 else xp.zeros_like(a)
    # split(j) -> partial_sum: the piece in place, zeros elsewhere
    j = frm.dim
    full = list(a.shape)
    full[j] = seen[j]
    out = xp.zeros(full, a.dtype)
    start, _ = piece_bounds(seen[j], k, i)
    out[(slice(None),) * j + (slice(start, start + a.shape[j]),)] = a
    return out


def _collective_1d(a, group, frm, to, seen: tuple, check):
    """The 1-D changes that communicate, among the ``group`` of a slice (pieces of balanced
    sizes, uneven ones included, move as they are)."""
    k = group.size
    if frm.kind == "P" and to.kind == "B":
        return comm.all_reduce(a.copy(), "sum", group, check=check)
    if frm.kind == "P":  # -> split(j): reduce-scatter
        sizes = balanced_sizes(seen[to.dim], k)
        return comm.reduce_scatter_along(a, to.dim, group, sizes=sizes, check=check)
    if to.kind == "B":  # split(i) -> broadcast: all-gather
        return comm.all_gather_along(a, frm.dim, group, check=check)
    # split(i) -> split(j): all-to-all, split along j, concatenate along i
    sizes = balanced_sizes(seen[to.dim], k)
    return comm.all_to_all_along(a, to.dim, frm.dim, group, sizes=sizes, check=check)


# -------------------------------------------------------------------------------------------------
# a change of placement


def _send(a, src_rank: int, dst_rank: int, line: str) -> None:
    lockstep.send_fingerprint(src_rank, dst_rank, line)
    comm.send(np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a, dst_rank)


def _recv(src_rank: int, dst_rank: int, line: str, expect: tuple, dtype):
    lockstep.check_fingerprint(src_rank, dst_rank, line)
    got = comm.recv(src_rank)
    if got.size == math.prod(expect):
        got = got.reshape(expect)  # 0-d arrays may travel as 1-element ones
    if tuple(got.shape) != tuple(expect) or got.dtype != dtype:
        raise lockstep.LockstepError(
            f"{line}: rank {dst_rank} expected a piece of shape {tuple(expect)} and dtype "
            f"{np.dtype(dtype).name} from rank {src_rank}, got {tuple(got.shape)} "
            f"{got.dtype.name}"
        )
    return got


def _move(a, src: Layout, dst: Layout, shape: tuple, line: str):
    me = get_rank()
    sp, dp = src.placement, dst.placement
    dtype = a.dtype
    if sp.mesh_shape == dp.mesh_shape and any(s.kind != "B" for s in src.sbp):
        piece = _box_on(a, sp, src.sbp, dst.sbp, shape, line) if me in sp else None
        pairs = list(zip(sp.rank_list, dp.rank_list))
        for s, t in pairs:
            if s == me and t != me:
                _send(piece, s, t, line)
        for s, t in pairs:
            if t == me and s != me:
                piece = _recv(s, t, line, dst.piece_shape(shape, me), dtype)
        return piece if me in dp else empty_piece(dtype, get_array_module(a))
    whole = tuple(broadcast for _ in sp.mesh_shape)
    full = _box_on(a, sp, src.sbp, whole, shape, line) if me in sp else None
    senders = [r for r in sp.rank_list if r not in dp] + [r for r in sp.rank_list if r in dp]
    joiners = [r for r in dp.rank_list if r not in sp]
    for n, j in enumerate(joiners):
        if senders[n % len(senders)] == me:
            _send(full, me, j, line)
    if me in joiners:
        full = _recv(senders[joiners.index(me) % len(senders)], me, line, shape, dtype)
    if me not in dp:
        return empty_piece(dtype, get_array_module(a))
    return _box_on(full, dp, tuple(broadcast for _ in dp.mesh_shape), dst.sbp, shape, line)


# -------------------------------------------------------------------------------------------------
# the differentiable op


class Boxing(Function):
    """A redistribution as one graph node: forward ``box(src -> dst)``; backward the adjoint
    boxing of the gradient (through ``grad_sbp`` on the source placement when given). Its input
    and output are plain tensors holding this rank's pieces."""

    def forward(self, x, src: Layout, dst: Layout, shape: tuple, grad_sbp):
        self.src, self.dst, self.shape, self.grad_sbp = src, dst, shape, grad_sbp
        return box(x._data, src, dst, shape)

    def backward(self, dy):
        g, src, dst = dy._data, self.src.adjoint(), self.dst.adjoint()
        what = "to_global (backward)"
        if self.grad_sbp is not None:
            via = Layout(self.src.placement, self.grad_sbp)
            g = box(box(g, dst, via, self.shape, what), via, src, self.shape, what)
        else:
            g = box(g, dst, src, self.shape, what)
        return Tensor._wrap(g, dy._device), None, None, None, None


def piece_of(full, layout: Layout, rank: int):
    """``rank``'s piece of the whole logical array ``full`` (a copy; partial_sum: the first rank
    along each partial mesh dimension holds the value, the others zeros)."""
    pl = layout.placement
    xp = get_array_module(full)
    if rank not in pl:
        return empty_piece(full.dtype, xp)
    coord = pl.coord(rank)
    piece = xp.array(full[local_slices(full.shape, layout.sbp, pl.mesh_shape, coord)])
    if any(s.kind == "P" and c != 0 for s, c in zip(layout.sbp, coord)):
        piece[...] = 0
    return piece
