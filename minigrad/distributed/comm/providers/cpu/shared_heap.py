"""Shared buffers: arrays in a rank's shared-memory segment that its peers read in place.

The all-reduce of an ordinary array copies it into the exchange areas of the shared-memory
transport (:mod:`.shm`) round by round, and every member reduces the whole array. When the array
already lives in shared memory, the peers can read it where it is: each member reduces only its
own part (reading that part of every member's array), then copies the others' reduced parts
(the zero-copy all-reduce in :mod:`.algorithms`). PyTorch calls such buffers symmetric memory.

Each rank's segment file ends in a *heap*, a sparse range after the control block and the
exchange areas (it costs nothing until pages are reserved). :class:`SharedHeap` hands out
page-aligned blocks of it, first fit:

* ``posix_fallocate`` reserves a block's pages when it is handed out, so a full /dev/shm shows
  as "no block" (the caller falls back to private memory), never as a SIGBUS on a later write;
* each block is its own ``mmap`` of the file, so the block lives exactly as long as the arrays
  viewing it: a finalizer returns it to the heap (and its pages to the system, ``MADV_REMOVE``)
  when the last view is gone;
* peers map a member's heap when they first meet an array in it, through the file descriptor
  they kept since the segment was shared (the file itself is unlinked at once, so nothing is left
  in /dev/shm if a process is killed);
* only the process that allocated a block frees it: a child forked from a rank (a data-loader
  worker) inherits the blocks' finalizers, and its dropping an inherited array must not hand
  the parent's live pages back to the system.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
import weakref

import numpy as np

from minigrad.distributed.runtime.settings import SHM_HEAP_ENV, env_bytes

PAGE = mmap.ALLOCATIONGRANULARITY
MAX_DEFAULT_HEAP = 64 << 30  # virtual: a heap costs pages only where blocks are reserved


def page_round(n: int) -> int:
    """``n`` rounded up to a whole number of pages."""
    return -(-n // PAGE) * PAGE


def heap_bytes(shm_dir: str | None) -> int:
    """Bytes of heap at the end of each segment: ``MINIGRAD_DIST_SHM_HEAP``, by default the size
    of the /dev/shm file system (no block can be bigger), at most 64 GiB; 0 turns shared buffers
    off."""
    value = env_bytes(SHM_HEAP_ENV)
    if value is not None:
        return page_round(value)
    if shm_dir is None:
        return 0
    fs = os.statvfs(shm_dir)
    return min(MAX_DEFAULT_HEAP, fs.f_blocks * fs.f_frsize // PAGE * PAGE)


class SharedHeap:
    """The blocks of this rank's heap: ``fd`` is the segment's file, the heap its bytes
    ``[base, base + size)`` (``base`` page-aligned)."""

    def __init__(self, fd: int, base: int, size: int):
        self.fd, self.base, self.size = fd, base, size
        self._lock = threading.Lock()  # finalizers run on whichever thread drops the last view
        self._free = [(0, size)] if size else []  # (offset, length), sorted, coalesced
        self._live: dict = {}  # block address -> (offset, length)
        self._closed = False
        self._owner = os.getpid()

    def allocate(self, nbytes: int) -> mmap.mmap | None:
        """A block of at least ``nbytes`` (a writable mmap), or None when the heap or /dev/shm
        has no room for it."""
        length = page_round(max(int(nbytes), 1))
        with self._lock:
            if self._closed:
                return None
            i = next((i for i, (_, free) in enumerate(self._free) if free >= length), None)
            if i is None:
                return None
            off, free = self._free[i]
            try:
                os.posix_fallocate(self.fd, self.base + off, length)
            except OSError:
                return None
            try:
                block = mmap.mmap(self.fd, length, offset=self.base + off)
            except OSError:  # out of address space or mappings: private memory will do
                return None
            if free == length:
                del self._free[i]
            else:
                self._free[i] = (off + length, free - length)
            address = np.frombuffer(block, np.uint8, 1).ctypes.data
            self._live[address] = (off, length)
        # not at exit: the file goes away with the process, and a forked child's exit must not
        # free its parent's blocks
        weakref.finalize(block, self._release, address).atexit = False
        return block

    def locate(self, x: np.ndarray) -> int | None:
        """Where ``x``'s first byte lies in the heap (an offset), when ``x`` (C-contiguous) lies
        inside a live block; else None."""
        if not self._live:
            return None
        start = x.ctypes.data
        end = start + x.nbytes
        with self._lock:
            for address, (off, length) in self._live.items():
                if address <= start and end <= address + length:
                    return off + start - address
        return None

    def _release(self, address: int) -> None:
        if os.getpid() != self._owner:  # a forked child dropped its copy of the parent's array
            return
        with self._lock:
            off, length = self._live.pop(address)
            if self._closed:
                return
            try:  # hand the pages back: a freed block keeps no memory
                hole = mmap.mmap(self.fd, length, offset=self.base + off)
                hole.madvise(mmap.MADV_REMOVE)
                hole.close()
            except (OSError, ValueError):
                pass
            i = bisect.bisect(self._free, (off, length))
            self._free.insert(i, (off, length))
            if i + 1 < len(self._free) and off + length == self._free[i + 1][0]:
                self._free[i] = (off, length + self._free.pop(i + 1)[1])
            if i > 0 and sum(self._free[i - 1]) == off:
                prev = self._free.pop(i - 1)
                self._free[i - 1] = (prev[0], prev[1] + self._free[i - 1][1])

    def free_bytes(self) -> int:
        """Bytes not handed out (for tests and diagnostics)."""
        with self._lock:
            return sum(length for _, length in self._free)

    def close(self) -> None:
        """Hand out nothing more; blocks still viewed stay valid memory (no longer shared)."""
        with self._lock:
            self._closed = True
