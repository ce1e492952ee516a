"""Flat buffers: many arrays packed back to back into one array, so that one collective moves them.

Data parallelism sends many small arrays (one gradient per parameter) through collectives whose
cost is mostly per call; packing them into one buffer per (dtype, device) turns N calls into one.
This module is that one packing step, used by every caller:

* :func:`group_by_layout` groups arrays (or tensors) by ``(dtype name, device)``, first-seen order;
* :class:`FlatBuffer` holds arrays of one dtype and device back to back (optionally padded to a
  multiple of a group size, with zeros, so it splits into equal shards); :meth:`FlatBuffer.pack`
  copies arrays in, :meth:`FlatBuffer.views` gives each array's slot as a view of the buffer,
  :meth:`FlatBuffer.unpack_into` copies the slots back into arrays, :meth:`FlatBuffer.shard`
  gives the i-th of n equal parts;
* :class:`BufferPool` keeps buffers between calls, keyed by layout, and hands one out again only
  when nothing views it any more (a fresh multi-megabyte buffer costs a page fault per 4 KiB on
  every step); :class:`ScratchPool` does the same for plain 1-D scratch buffers of any size.

Example::

    for key, arrays in group_by_layout(grads).items():
        flat = FlatBuffer.of(arrays)            # one buffer holding all of them
        comm.all_reduce(flat.data, "avg")
        flat.unpack_into(arrays)                # or: reduced = flat.views()
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Hashable

import numpy as np

from minigrad.backend.xp import get_array_module
from minigrad.distributed.comm.providers.base import dtype_name


def layout_key(x: Any) -> tuple[str, str]:
    """``(dtype name, device)`` of an array or tensor: arrays of one key share a flat buffer."""
    device = getattr(x, "device", "cpu")
    return dtype_name(x.dtype), str(device)


def group_by_layout(items, key: Callable[[Any], Hashable] = layout_key) -> dict:
    """``{key: [items]}`` for arrays or tensors grouped by ``key`` (by default ``(dtype,
    device)``), keys and items in first-seen order, so every rank builds the same groups."""
    groups: dict = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def _padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple if multiple > 1 else size


class FlatBuffer:
    """Arrays of one dtype and device stored back to back in one flat array ``data``.

    ``shapes``: the arrays' shapes, in order; ``pad_to``: the total length is rounded up to a
    multiple of it (zeros at the end), so the buffer splits into ``pad_to`` equal shards;
    ``empty(count, dtype)``: allocates ``data`` when not given (default ``xp.empty``).
    """

    def __init__(self, shapes, dtype, xp, pad_to: int = 1, data=None, empty=None):
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [_prod(s) for s in self.shapes]
        self.offsets = []
        offset = 0
        for size in self.sizes:
            self.offsets.append(offset)
            offset += size
        self.size = offset  # the arrays' elements, without padding
        self.pad_to = max(int(pad_to), 1)
        if data is None:
            data = (xp.empty if empty is None else empty)(_padded(offset, self.pad_to), dtype)
            if data.size > offset:
                data[offset:] = 0
        self.data = data

    @classmethod
    def of(cls, arrays, pad_to: int = 1, xp=None) -> FlatBuffer:
        """A new buffer laid out for ``arrays`` (one dtype and device) and holding their values
        (one concatenation). ``xp``: the array module, by default that of ``arrays[0]``."""
        arrays = list(arrays)
        xp = get_array_module(arrays[0]) if xp is None else xp
        size = sum(_prod(a.shape) for a in arrays)
        parts = [a.reshape(-1) for a in arrays]
        pad = _padded(size, max(int(pad_to), 1)) - size
        if pad:
            parts.append(xp.zeros(pad, arrays[0].dtype))
        shapes = [a.shape for a in arrays]
        return cls(shapes, arrays[0].dtype, xp, pad_to, data=xp.concatenate(parts))

    @property
    def layout(self) -> tuple:
        """What decides whether the buffer fits other arrays: shapes, dtype and padding."""
        return (tuple(self.shapes), dtype_name(self.data.dtype), self.pad_to)

    def pack(self, arrays) -> FlatBuffer:
        """Copy ``arrays`` (shapes as laid out) into the buffer, in order; returns self."""
        arrays = list(arrays)
        if len(arrays) != len(self.shapes):
            raise ValueError(
                f"FlatBuffer.pack: laid out for {len(self.shapes)} arrays, got {len(arrays)}"
            )
        if not arrays:
            return self
        xp = get_array_module(self.data)
        xp.concatenate([a.reshape(-1) for a in arrays], out=self.data[: self.size])
        return self

    def view(self, i: int):
        """The i-th array's slot, a view of the buffer in its shape."""
        start = self.offsets[i]
        return self.data[start : start + self.sizes[i]].reshape(self.shapes[i])

    def views(self) -> list:
        """Every array's slot as a view of the buffer, in order (writes go to the buffer)."""
        return [self.view(i) for i in range(len(self.shapes))]

    def unpack_into(self, arrays) -> None:
        """Copy each slot back into the corresponding array of ``arrays`` (in place)."""
        for i, a in enumerate(arrays):
            a[...] = self.view(i)

    def shard_size(self, n: int) -> int:
        """Length of each of ``n`` equal shards (``pad_to`` must be a multiple of ``n``)."""
        if len(self.data) % n:
            raise ValueError(
                f"FlatBuffer.shard: {len(self.data)} elements do not split into {n} equal shards"
            )
        return len(self.data) // n

    def shard(self, i: int, n: int):
        """The i-th of ``n`` equal parts of the buffer (padding included), a view."""
        m = self.shard_size(n)
        return self.data[i * m : (i + 1) * m]

    def segments(self, i: int, n: int) -> list[tuple[int, int, int]]:
        """``(array index, start, stop)`` (flat element ranges inside each array) of the arrays
        that overlap shard ``i`` of ``n``: which array elements a shard holds."""
        return shard_segments(self.sizes, i, n)

    def is_free(self) -> bool:
        """Whether no view of the buffer is alive outside this object (it can be refilled)."""
        # the references: self.__dict__ and getrefcount's argument
        return sys.getrefcount(self.data) == 2


class ScratchPool:
    """1-D scratch buffers kept between calls per (owner, dtype), as PyTorch's caching allocator
    keeps its blocks: :meth:`get` hands out a prefix of a kept buffer that no view of is alive
    (whatever used it last has finished), else allocates one, so concurrent users (a transfer in
    flight and the next being packed) get different buffers and a steady loop allocates nothing.
    ``empty(count, dtype, owner)`` allocates (e.g. ``comm.shared_empty`` of the owner group)."""

    def __init__(self, empty: Callable):
        self._empty = empty
        self._buffers: dict = {}  # (id(owner), dtype name) -> [FlatBuffer of one array]

    def get(self, owner, count: int, dtype):
        """A 1-D array of ``count`` elements (old contents) for ``owner``: a prefix of a free
        kept buffer large enough, else of a new one (which replaces the largest free one, too
        small, if any)."""
        kept = self._buffers.setdefault((id(owner), np.dtype(dtype).name), [])
        free = [buf for buf in kept if buf.is_free()]
        for buf in free:
            if buf.size >= count:
                return buf.data[:count]
        if free:
            kept.remove(max(free, key=lambda buf: buf.size))
        buf = FlatBuffer([(count,)], dtype, np, data=self._empty(count, dtype, owner))
        kept.append(buf)
        return buf.data[:count]


def shard_segments(sizes, i: int, n: int) -> list[tuple[int, int, int]]:
    """For arrays of ``sizes`` elements laid out back to back and padded to a multiple of ``n``:
    ``(array index, start, stop)`` of the element ranges that fall in the i-th of ``n`` equal
    shards, in order (padding is in no range)."""
    total = sum(sizes)
    m = _padded(total, n) // n if n > 1 else total
    lo, hi = i * m, (i + 1) * m
    out, offset = [], 0
    for j, size in enumerate(sizes):
        a, b = max(lo, offset), min(hi, offset + size)
        if a < b:
            out.append((j, a - offset, b - offset))
        offset += size
    return out


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class BufferPool:
    """Flat buffers kept between calls, keyed by the caller's key and the layout.

    :meth:`get` returns the buffer an earlier call got for the same key and layout when nothing
    views it any more, else a new one (which replaces it in the pool). ``host_empty(count,
    dtype)`` allocates the NumPy ones (e.g. ``comm.shared_empty``, so collectives read them in
    place); device buffers come from their array module.
    """

    def __init__(self, host_empty=None):
        self._buffers: dict = {}
        self._host_empty = host_empty

    def get(self, key: Hashable, arrays, pad_to: int = 1, fill: bool = True) -> FlatBuffer:
        """A buffer laid out for ``arrays`` (one dtype and device), holding their values when
        ``fill``; reused when the one kept under ``key`` has the same layout and is free."""
        arrays = list(arrays)
        shapes = [tuple(a.shape) for a in arrays]
        buf = self._buffers.get(key)
        layout = (tuple(shapes), dtype_name(arrays[0].dtype), max(int(pad_to), 1))
        if buf is None or buf.layout != layout or not buf.is_free():
            xp = get_array_module(arrays[0])
            empty = self._host_empty if xp is np else None
            buf = self._buffers[key] = FlatBuffer(shapes, arrays[0].dtype, xp, pad_to,
                                                  empty=empty)
        return buf.pack(arrays) if fill else buf

    def kept(self, key: Hashable) -> FlatBuffer | None:
        """The buffer kept under ``key`` (free or not), or None."""
        return self._buffers.get(key)

    def clear(self) -> None:
        """Drop every kept buffer."""
        self._buffers = {}
