"""Keep freed memory in the process (glibc ``mallopt``) so that NumPy temporaries stop faulting.

Every op allocates its result afresh. With glibc's defaults, large blocks are ``mmap``-ed and
handed back to the kernel on free, and the top of the heap is trimmed, so each training step
faults the same pages in again: about 2,500 page faults per LeNet step, which on a VM cost as
much as the arithmetic (``benchmarks/bench_training.py`` measures both settings). A fixed 32 MB
mmap threshold and a 1 GB trim threshold keep those pages for reuse; the price is that resident
memory stays near its peak, as with PyTorch's caching allocators. Applied when minigrad is
imported, unless ``MINIGRAD_MALLOC=default``; a no-op where the C library has no ``mallopt``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters

#: Blocks below this come from the heap (reused after free) instead of a fresh mmap: 32 MB covers
#: the activations and gradients of the models in benchmarks/ (a 24 MB block is measured there).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Freed memory at the top of the heap is handed back to the kernel only beyond this, so the next
#: step's allocations do not fault the same pages in again.
TRIM_THRESHOLD_BYTES = 1 << 30
#: Extra heap grown with each ``brk``, so a step's many allocations need few system calls.
TOP_PAD_BYTES = 64 << 20


def tune_malloc() -> bool:
    """Apply the settings above to this process (and the processes it forks later); returns
    whether the C library accepted them."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
                and mallopt(_M_TOP_PAD, TOP_PAD_BYTES))


def tune_malloc_unless_disabled() -> bool:
    """``tune_malloc()`` unless ``MINIGRAD_MALLOC=default`` asks for glibc's own settings (run by
    ``import minigrad``); returns whether the settings were applied."""
    if os.environ.get("MINIGRAD_MALLOC", "tuned") == "default":
        return False
    return tune_malloc()
