"""Logical tensors and their pieces: the one model every parallel layout is described in.

A checkpoint stores each tensor by its *logical* value (the whole tensor of the single-device
model), cut into *pieces*: boxes of that value (``offsets`` and ``sizes`` per dimension). How a
layout holds a tensor is only a question of which logical elements each rank has:

* a data-parallel replica holds the whole tensor (one box, the same on every replica: written
  once, by the lowest rank that holds it);
* a tensor-parallel shard holds, per dimension, the indices its :class:`ShardSpec` names (one box,
  or several for a fused query/key/value weight cut chunk by chunk);
* a pipeline stage holds whole tensors of its own layers only;
* a global tensor holds the box that its SBP gives its mesh coordinate;
* a sharded optimizer (ZeRO) holds a range of the flattened parameter: a *flat* shard, which
  is a few boxes in row-major order (:func:`flat_boxes`).

:class:`Shard` is one rank's part of one logical tensor: per-dimension index arrays into the
logical tensor, or a flat range ``[start, stop)`` of its row-major elements (then the local array
is 1-D). :func:`boxes` cuts a shard into boxes for writing; :func:`check_coverage` proves that a
set of boxes covers a logical tensor exactly once; :func:`fill` copies the overlap of a stored
piece into a shard being loaded, whatever the two layouts; :func:`assemble` builds a shard's local
array from the stored pieces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = [
    "Box",
    "Shard",
    "assemble",
    "boxes",
    "check_coverage",
    "fill",
    "flat_boxes",
    "full_index",
]


@dataclass(frozen=True)
class Box:
    """The elements ``offsets[d] <= i < offsets[d] + sizes[d]`` of a logical tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def volume(self) -> int:
        """How many elements the box holds."""
        return math.prod(self.sizes)

    def overlaps(self, other: "Box") -> bool:
        """Whether the two boxes share an element."""
        return all(a < b + m and b < a + n for a, n, b, m in
                   zip(self.offsets, self.sizes, other.offsets, other.sizes))

    def __str__(self) -> str:
        return "[" + ", ".join(f"{a}:{a + n}" for a, n in zip(self.offsets, self.sizes)) + "]"


@dataclass
class Shard:
    """This rank's part of the logical tensor ``key`` of ``shape`` and ``dtype``: per dimension,
    the logical indices it holds (ascending), or with ``flat = (start, stop)`` that range of the
    row-major elements (``index`` unused; the local array is 1-D). ``read()`` returns the local
    array (for saving), ``write(array)`` stores a loaded one (of the local shape)."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    index: tuple[np.ndarray, ...] | None
    read: Callable[[], np.ndarray]
    write: Callable[[np.ndarray], None]
    flat: tuple[int, int] | None = None

    @property
    def local_shape(self) -> tuple[int, ...]:
        """The shape of the local array."""
        if self.flat is not None:
            return (self.flat[1] - self.flat[0],)
        return tuple(len(i) for i in self.index)

    def parts(self) -> list[tuple[Box, tuple[np.ndarray, ...], slice | None]]:
        """The shard as ``(bounding box, index, segment)``: for a flat shard one per box of its
        range, with the segment of the 1-D local array that holds it; else the index itself."""
        if self.flat is None:
            bound = Box(tuple(int(i[0]) if len(i) else 0 for i in self.index),
                        tuple(int(i[-1] - i[0] + 1) if len(i) else 0 for i in self.index))
            return [(bound, self.index, None)]
        out, pos = [], 0
        for box in flat_boxes(self.shape, *self.flat):
            index = tuple(np.arange(a, a + n) for a, n in zip(box.offsets, box.sizes))
            out.append((box, index, slice(pos, pos + box.volume)))
            pos += box.volume
        return out


def full_index(shape) -> tuple[np.ndarray, ...]:
    """The index of a whole tensor of ``shape`` (a replica)."""
    return tuple(np.arange(n) for n in shape)


def _runs(index: np.ndarray) -> list[tuple[int, int, int]]:
    """``(logical start, local start, length)`` of each run of consecutive indices."""
    if len(index) == 0:
        return []
    breaks = np.nonzero(np.diff(index) != 1)[0] + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(index)]])
    return [(int(index[a]), int(a), int(b - a)) for a, b in zip(starts, stops)]


def flat_boxes(shape, start: int, stop: int) -> list[Box]:
    """The boxes, in row-major order, that make up the elements ``[start, stop)`` of a tensor
    of ``shape`` flattened (at most two partial rows per dimension around one block)."""
    shape = tuple(int(n) for n in shape)
    if stop <= start:
        return []
    if not shape:
        return [Box((), ())]
    inner = math.prod(shape[1:])
    first, first_at = divmod(start, inner)
    last, last_at = divmod(stop, inner)
    rest = shape[1:]

    def rows(row: int, a: int, b: int) -> list[Box]:
        return [Box((row,) + x.offsets, (1,) + x.sizes) for x in flat_boxes(rest, a, b)]

    if first == last:
        return rows(first, first_at, last_at)
    out = []
    if first_at:
        out += rows(first, first_at, inner)
        first += 1
    if last > first:
        out.append(Box((first,) + (0,) * len(rest), (last - first,) + rest))
    if last_at:
        out += rows(last, 0, last_at)
    return out


def boxes(shard: Shard) -> list[tuple[Box, Callable[[np.ndarray], np.ndarray]]]:
    """The shard as boxes of the logical tensor, each with a function taking the local array to
    the box's part of it (box-shaped)."""
    if shard.flat is not None:
        return [(box, lambda a, seg=seg, box=box: a[seg].reshape(box.sizes))
                for box, _, seg in shard.parts()]
    per_dim = [_runs(np.asarray(i)) for i in shard.index]
    out = [((), (), ())]
    for runs in per_dim:
        out = [(o + (g,), s + (n,), sl + (slice(l, l + n),))
               for o, s, sl in out for g, l, n in runs]
    return [(Box(o, s), lambda a, sl=sl: a[sl]) for o, s, sl in out]


def check_coverage(key: str, shape: tuple[int, ...], pieces: list[tuple[Box, str]]) -> str | None:
    """Why ``pieces`` (boxes, each with a description of who holds it) do not cover the logical
    tensor ``key`` of ``shape`` exactly once, or None when they do."""
    for box, who in pieces:
        if len(box.offsets) != len(shape) or any(
                a < 0 or n < 0 or a + n > m for a, n, m in zip(box.offsets, box.sizes, shape)):
            return f"tensor {key!r}: piece {box} ({who}) is outside its shape {tuple(shape)}"
    for i, (a, who_a) in enumerate(pieces):
        for b, who_b in pieces[i + 1:]:
            if a.volume and b.volume and a.overlaps(b):
                return (f"tensor {key!r}: piece {a} ({who_a}) and piece {b} ({who_b}) overlap: "
                        "elements written twice")
    covered, total = sum(b.volume for b, _ in pieces), math.prod(shape)
    if covered != total:
        return (f"tensor {key!r} of shape {tuple(shape)}: the pieces cover {covered} of its "
                f"{total} elements (a shard is missing)")
    return None


def _select(index: np.ndarray, start: int, size: int):
    """Where ``index`` falls in ``[start, start + size)``: (positions in the shard, positions in
    the piece), as slices when the index is one run (no copies), else as arrays."""
    if len(index) and index[-1] - index[0] + 1 == len(index):  # one run
        lo, hi = max(int(index[0]), start), min(int(index[-1]) + 1, start + size)
        if lo >= hi:
            return None
        return slice(lo - int(index[0]), hi - int(index[0])), slice(lo - start, hi - start)
    where = np.nonzero((index >= start) & (index < start + size))[0]
    if not len(where):
        return None
    return where, index[where] - start


def fill(out: np.ndarray, done: np.ndarray, index: tuple[np.ndarray, ...], box: Box,
         piece: np.ndarray) -> None:
    """Copy the elements of ``piece`` (stored as ``box``) that the shard of ``index`` holds into
    ``out`` (the local array), marking them in the boolean ``done``."""
    picks = [_select(np.asarray(i), a, n) for i, a, n in zip(index, box.offsets, box.sizes)]
    if any(p is None for p in picks):
        return
    dst = tuple(p[0] for p in picks)
    src = tuple(p[1] for p in picks)
    if any(isinstance(s, np.ndarray) for s in dst):
        dst = np.ix_(*[np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in dst])
        src = np.ix_(*[np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in src])
    out[dst] = piece[src]
    done[dst] = True


def assemble(shard: Shard, dtype: np.dtype, pieces: list,
             read: Callable[[dict], np.ndarray]) -> np.ndarray | None:
    """The local array of ``shard`` from the stored ``pieces`` (index records with
    ``offsets``/``sizes``; ``read(piece)`` returns its array), reading only the pieces that
    overlap it; None when some element is in no piece."""
    out = np.empty(shard.local_shape, dtype)
    complete = True
    for bound, index, seg in shard.parts():
        target = out if seg is None else np.empty(bound.sizes, dtype)
        done = np.zeros(target.shape, bool)
        for piece in pieces:
            box = Box(tuple(piece["offsets"]), tuple(piece["sizes"]))
            if bound.volume and box.volume and bound.overlaps(box):
                fill(target, done, index, box, read(piece))
        complete = complete and bool(done.all())
        if seg is not None:
            out[seg] = target.reshape(-1)
    return out if complete else None
