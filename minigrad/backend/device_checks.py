"""Range checks of index arrays (labels, embedding ids, gather indices) without a host
synchronisation per call.

Checking that every index of an array is in range needs its minimum and maximum on the host. For a
NumPy array that is free, and the check raises at once. For a GPU array, reading two numbers back
waits for every kernel queued before them: done in every embedding or loss call it would stall the
GPU once per op of every training step. So on a GPU the minimum and maximum are computed on the
device (one small reduction, no waiting) and kept; all kept checks are read back together, in one
copy per device, at the next point where the program waits for the GPU anyway: reading a tensor's
values (``Tensor.numpy``, ``.item()``, printing) or :func:`minigrad.backend.synchronize`. A failed
check raises its error there, with a note that it was found late. Meanwhile the op has run with the
bad index (CuPy wraps out-of-range indices around instead of failing), as with PyTorch's device-side
asserts; after 256 unread checks they are read at the next check, to bound the memory they hold.

Example::

    check_range(labels, 0, n_classes,
                lambda lo, hi: ValueError(f"labels must be in [0, {n_classes}), got {lo}..{hi}"))
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from minigrad import seams
from minigrad.backend import kernels
from minigrad.backend.xp import get_array_module

#: Unread GPU checks that trigger a read at the next check.
MAX_PENDING = 256

_pending: list = []  # ((min, max) as 0-d device arrays, low, high, error factory) per unread check
_lock = threading.Lock()


def _forget() -> None:
    with _lock:
        _pending.clear()


seams.GPU_ARRAYS.watch(lambda _arrays: _forget())  # CuPy swapped (tests)


def check_range(array, low: int, high: int, error: Callable[[int, int], Exception]) -> None:
    """Raise ``error(min, max)`` unless every value of the integer array ``array`` is in
    ``[low, high)``: at once for a NumPy array, at the next synchronisation for a GPU array (see
    the module docstring)."""
    if not array.size:
        return
    if isinstance(array, np.ndarray):
        lo, hi = int(array.min()), int(array.max())
        if lo < low or hi >= high:
            raise error(lo, hi)
        return
    with array.device:  # the reduction runs on the array's GPU
        stats = kernels.min_max(array)
    with _lock:
        _pending.append((stats, low, high, error))
        full = len(_pending) >= MAX_PENDING
    if full:
        raise_deferred_errors()


def raise_deferred_errors() -> None:
    """Read back every unread GPU check (one copy per device) and raise the first failure's error,
    noting that it was found late (the read's later failures are dropped: they may only be its
    consequences); a no-op when nothing is pending."""
    with _lock:
        pending = list(_pending)
        _pending.clear()
    if not pending:
        return
    by_device: dict = {}
    for entry in pending:
        by_device.setdefault(entry[0][0].device.id, []).append(entry)
    for entries in by_device.values():
        first = entries[0][0][0]
        xp = get_array_module(first)
        with first.device:
            values = xp.asnumpy(xp.stack([v for stats, *_ in entries for v in stats]))
        for i, (_, low, high, error) in enumerate(entries):
            lo, hi = int(values[2 * i]), int(values[2 * i + 1])
            if lo < low or hi >= high:
                exc = error(lo, hi)
                note = (
                    f"(found on gpu{first.device.id} when its values were next read: GPU index "
                    "checks run without waiting for the GPU, so the failing call came earlier)"
                )
                # in the message itself (BaseException.add_note is Python 3.11+)
                message = f"{exc.args[0]} {note}" if exc.args else note
                exc.args = (message, *exc.args[1:])
                raise exc
