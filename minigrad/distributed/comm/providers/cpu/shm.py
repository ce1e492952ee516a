"""Shared-memory transport (all members on one host) and the shared-memory ring for messages.

Every rank owns a memory-mapped segment in /dev/shm: a control block (int64 slots, named below),
two data areas and, sparse until used, its shared heap (:mod:`.shared_heap`: arrays that the
peers read in place). An exchange round is "write my stream into area ``step % 2``, bump my step,
wait until all peers reached it, read their area": double buffering by step parity lets a rank
write the next round while slower peers still read the previous one, so a round costs a single
synchronisation. Large messages stream through in rounds of ``MINIGRAD_DIST_SHM_CHUNK`` bytes.
Segments are unlinked as soon as every peer has opened them, so nothing is left in /dev/shm even if
a process is killed. Limitation: the protocol relies on x86's store ordering (TSO).
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import struct
import uuid

import numpy as np

from minigrad.distributed.comm.providers.base import CollectiveError, as_bytes, describe
from minigrad.distributed.comm.providers.cpu.shared_heap import SharedHeap, heap_bytes, page_round
from minigrad.distributed.comm.providers.cpu.transport import SHM_DIR
from minigrad.distributed.comm.providers.waiting import Waiter, Watchdog, polls
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime.settings import SHM_CHUNK_ENV, env_bytes
from minigrad.distributed.runtime.wire import encode_header

CTRL_BYTES = 4096  # one page of control slots keeps the data areas page-aligned
# int64 slots of a group segment's control block
STEP = 0  # rounds this rank has completed writing
ABORT = 1  # 1 once this rank abandoned the current collective (its peers must not wait)
OWNER_PID = 2  # the owner's pid, so peers can tell a dead owner from a slow one
# int64 slots of a ring's control block
RING_WRITTEN = 0  # bytes written so far (monotonic)
RING_READ = 1  # bytes read so far (monotonic)
RING_WRITER_PID = 2
RING_READER_PID = 3
META_BYTES = 1 << 16  # room for a round's header at the start of each data area
HEAD = struct.Struct("<qq")  # a header's JSON length and its sequence number (-1: none)
QUICK_POLLS = 200  # polls of a round's peers before the watched, backing-off wait begins
ABORT_EVERY = 16  # polls between looks at the peers' abort flags
CACHE_SIZE = 256  # encoded headers kept per group (keys: the collectives' shapes and options)
# Rounds of half the per-core L2 cache, 128 KiB to 1 MiB: a round writes this rank's chunk, reads
# each peer's and writes the result, and that stays in cache when the chunk fits in half of L2
# (measured on an AMD EPYC with 1 MiB of L2, 2 ranks: 16 MiB all-reduce 3.0 ms in 1 MiB rounds,
# 1.6 ms in 512 KiB ones, 1.7 ms in 256 KiB ones). The per-round synchronisation (~10 us) stays
# small next to copying the chunk, and N ranks x 2 areas a few MB of /dev/shm.
MIN_DEFAULT_CHUNK, MAX_DEFAULT_CHUNK = 128 << 10, 1 << 20
MIN_CHUNK = 4096
L2_SIZE_FILES = "/sys/devices/system/cpu/cpu0/cache/index*/"  # Linux: level, type, size


def l2_cache_bytes() -> int | None:
    """This machine's per-core L2 cache in bytes (Linux's sysfs), None where it does not say."""
    for entry in sorted(glob.glob(L2_SIZE_FILES)):
        try:
            with open(os.path.join(entry, "level")) as f:
                if f.read().strip() != "2":
                    continue
            with open(os.path.join(entry, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            return int(digits) * scale
    return None


def default_chunk_bytes() -> int:
    """Half the L2 cache, rounded down to a power of two, within 128 KiB..1 MiB (512 KiB where
    the size is unknown): see :data:`MAX_DEFAULT_CHUNK`."""
    l2 = l2_cache_bytes()
    if l2 is None:
        return 512 << 10
    half = 1 << max(0, (l2 // 2).bit_length() - 1)
    return min(MAX_DEFAULT_CHUNK, max(MIN_DEFAULT_CHUNK, half))


def chunk_bytes() -> int:
    """Bytes per shared-memory round (``MINIGRAD_DIST_SHM_CHUNK``, a multiple of 64; default
    :func:`default_chunk_bytes`). Every rank of a host computes the same value."""
    value = env_bytes(SHM_CHUNK_ENV)
    value = default_chunk_bytes() if value is None else value
    return max(MIN_CHUNK, value // 64 * 64)


def segment_prefix(job: str) -> str:
    """File-name prefix of a job's segments in /dev/shm."""
    return f"mg-{job}-"


def remove_job_segments(job: str) -> None:
    """Delete /dev/shm files of ``job`` (normally none: segments are unlinked once mapped).
    Launchers call this after a job, in case a rank died between creating and sharing one."""
    if SHM_DIR is None:
        return
    for path in glob.glob(os.path.join(SHM_DIR, segment_prefix(job) + "*")):
        unlink(path)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0 probes without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_path(job: str, tag: str) -> str:
    """A fresh /dev/shm file name for one of ``job``'s segments."""
    if SHM_DIR is None:
        raise CollectiveError(
            "shared-memory transport needs /dev/shm (use MINIGRAD_DIST_TRANSPORT=tcp)"
        )
    return os.path.join(SHM_DIR, f"{segment_prefix(job)}{tag}-{uuid.uuid4().hex[:12]}")


def unlink(path: str) -> None:
    """Remove a segment file if it still exists."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Segment:
    """A memory-mapped file in /dev/shm (created by its owner, mapped by peers): its first
    ``mapped`` bytes (control block and exchange areas) are mapped at once, the rest (the
    owner's shared heap, see :mod:`.shared_heap`) on demand, through the descriptor kept open
    for it (one per member of each group on this host; a fully mapped file keeps none)."""

    def __init__(self, path: str, size: int, create: bool, mapped: int | None = None):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        mapped = size if mapped is None else mapped
        try:
            if create:
                os.ftruncate(self.fd, size)  # sparse: pages cost memory once written
            self.mm = mmap.mmap(self.fd, mapped)
        except BaseException:
            os.close(self.fd)
            raise
        self.path, self.size, self.mapped = path, size, mapped
        if mapped == size:
            os.close(self.fd)
            self.fd = -1
        self.buf = memoryview(self.mm)
        self.ctrl = self.buf[:64].cast("q")
        self._heap: memoryview | None = None

    def heap(self, base: int) -> memoryview:
        """The bytes from ``base`` to the end of the file (mapped on first use)."""
        if self._heap is None:
            self._heap = memoryview(mmap.mmap(self.fd, self.size - base, offset=base))
        return self._heap

    def close(self) -> None:
        """Unmap (a caller still holding a view keeps the mapping until the process ends)."""
        for view in (self.ctrl, self.buf, self._heap):
            try:
                if view is not None:
                    view.release()
            except (BufferError, ValueError):
                pass
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


class ShmTransport:
    """Group exchange over shared memory (all members on this host)."""

    kind = "shm"

    def __init__(self, ctx):
        self.ctx = ctx
        self.ranks, self.index = ctx.ranks, ctx.rank
        self.chunk = chunk_bytes()
        self.area = META_BYTES + self.chunk
        n = len(self.ranks)
        path = new_path(ctx.job, f"g{ctx.gid}r{ctx.global_rank}")
        self.heap_base = page_round(CTRL_BYTES + 2 * self.area)
        self.me = Segment(path, self.heap_base + heap_bytes(SHM_DIR), create=True,
                          mapped=CTRL_BYTES + 2 * self.area)
        self.me.ctrl[OWNER_PID] = os.getpid()
        self.heap = SharedHeap(self.me.fd, self.heap_base, self.me.size - self.heap_base)
        client, key = ctx.client, f"{ctx.prefix}/shm"
        try:
            client.set(f"{key}/{self.index}", {"path": path, "size": self.me.size})
            self.segs: list[Segment] = []
            for j in range(n):
                if j == self.index:
                    self.segs.append(self.me)
                    continue
                info = client.get(f"{key}/{j}", timeout=ctx.timeout)
                self.segs.append(Segment(info["path"], int(info["size"]), create=False,
                                         mapped=self.me.mapped))
            client.barrier(f"{key}/attached", n, timeout=ctx.timeout)
        finally:
            unlink(path)  # every peer has it open now (or the job failed): nothing can leak
        self.pids = [int(s.ctrl[OWNER_PID]) for s in self.segs]
        self.peers = [(j, s.ctrl) for j, s in enumerate(self.segs) if j != self.index]
        self.step = 0
        self._quick_polls = polls(QUICK_POLLS)
        self._areas = [[self._area(s, parity) for s in self.segs] for parity in (0, 1)]
        # the peers' areas only: this rank's own header is always its own
        self._peer_areas = [[a for j, a in enumerate(areas) if j != self.index]
                            for areas in self._areas]
        self._cache: dict = {}
        self._reduce_views: dict = {}
        self._header_in: list = [None, None]  # the header bytes all_reduce left in each area
        self._peer_heaps: bool | None = None  # peer_heaps_mapped(), once known

    def close(self) -> None:
        """Unmap the group's segments."""
        self.heap.close()
        self._reduce_views.clear()
        for areas in self._areas:
            for area in areas:
                area.release()
        for s in self.segs:
            s.close()

    def abort(self) -> None:
        """Tell the peers this rank abandoned the current collective."""
        self.me.ctrl[ABORT] = 1

    def _area(self, seg: Segment, parity: int) -> memoryview:
        off = CTRL_BYTES + parity * self.area
        return seg.buf[off : off + self.area]

    def sync(self, what) -> None:
        """Publish this round and wait until every peer published it too (``what()``: the
        call, for the watchdog's messages)."""
        self.step += 1
        target, peers = self.step, self.peers
        self.me.ctrl[STEP] = target
        for _ in range(self._quick_polls):  # a peer with its own core arrives within microseconds
            for _, c in peers:
                if c[STEP] < target:
                    break
            else:
                return

        def late() -> list[int]:
            return [self.ranks[j] for j, c in peers if c[STEP] < target]

        def check() -> None:
            dead = [self.ranks[j] for j, _ in peers if not pid_alive(self.pids[j])]
            if dead:
                raise CollectiveError(f"{what()}: rank(s) {dead} died (process exited)")

        ctx = self.ctx
        waiter = Waiter(Watchdog(what, ctx.timeout, ctx.warn_after, ctx.global_rank, late), check)
        polls = 0
        while True:
            for _, c in peers:  # a plain loop: each poll must cost well under a microsecond
                if c[STEP] < target:
                    break
            else:
                return
            polls += 1
            if polls % ABORT_EVERY == 0 and any(c[ABORT] for _, c in peers):
                if all(c[STEP] >= target for _, c in peers):
                    return  # it aborted after arriving: this round's data is complete
                bad = [self.ranks[j] for j, c in peers if c[ABORT]]
                others = [r for j, r in enumerate(self.ranks) if j != self.index and r not in bad]
                failure = failures.reason(others, within=1.0)  # in an MPI job: why they aborted
                cause = "" if failure is None else f" ({failure})"
                raise CollectiveError(f"{what()}: rank(s) {bad} aborted this collective{cause}")
            waiter.pause()

    def peer_heaps_mapped(self) -> bool:
        """Whether this rank can read every peer's shared heap: mapped on the first call (a
        virtual range the size of each peer's heap); False for good where the address space
        does not allow it (``ulimit -v``), so this rank's arrays count as private."""
        if self._peer_heaps is None:
            try:
                for j, seg in enumerate(self.segs):
                    if j != self.index:
                        seg.heap(self.heap_base)
                self._peer_heaps = True
            except (OSError, ValueError):
                self._peer_heaps = False
        return self._peer_heaps

    def peer_array(self, member: int, offset: int, dtype: np.dtype, count: int,
                   what) -> np.ndarray:
        """The ``count`` elements at byte ``offset`` of member ``member``'s shared heap (see
        :mod:`.shared_heap`), read and written in place; ``what()`` names the call in errors."""
        seg = self.segs[member]
        if offset < 0 or offset + count * dtype.itemsize > seg.size - self.heap_base:
            raise CollectiveError(
                f"{what()}: rank {self.ranks[member]} named bytes [{offset}, "
                f"{offset + count * dtype.itemsize}) of its shared heap of "
                f"{seg.size - self.heap_base} B")
        return np.frombuffer(seg.heap(self.heap_base), dtype, count, offset)

    def _encode(self, header: dict, sends: list, key, what) -> tuple:
        """``(seq, JSON bytes of the header without its seq, the header with the layout of the
        data, [(offset, bytes)] to send)``. The JSON and the layout are cached under ``key`` (the
        caller's promise that equal keys give equal headers but for ``seq``, and equal layouts of
        ``sends``)."""
        seq = header.get("seq")
        if not isinstance(seq, int) or seq < 0:
            seq = None
        cached = self._cache.get(key) if key is not None else None
        if cached is not None:
            hb, layout, dirs, total = cached
            bufs = [(start, as_bytes(sends[j])) for j, start in layout]
            return seq, hb, dict(header, _dir=dirs, _total=total), bufs
        bufs, seen, dirs, layout, total = [], {}, [], [], 0
        for j, a in enumerate(sends):
            if a is None:
                dirs.append(None)
                continue
            ident = id(a)
            if ident not in seen:
                u8 = as_bytes(a)
                seen[ident] = (total, int(u8.size))
                bufs.append((total, u8))
                layout.append((j, total))
                total = (total + int(u8.size) + 7) // 8 * 8
            dirs.append(seen[ident])
        full = dict(header, _dir=dirs, _total=total)
        body = dict(full)
        if seq is not None:
            del body["seq"]  # it travels in binary, so the JSON of a repeated call is cached
        hb = encode_header(body)
        if len(hb) + HEAD.size > META_BYTES:
            raise CollectiveError(f"{what()}: header of {len(hb)} B exceeds {META_BYTES} B")
        if key is not None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = (hb, layout, dirs, total)
        return seq, hb, full, bufs

    def exchange(self, header: dict, sends: list, on_headers, consume, what,
                 key=None) -> list[dict]:
        """One exchange (see :mod:`.transport`), streamed in rounds of ``chunk`` bytes.

        Each member's first round carries its header (``HEAD``: JSON length and sequence number,
        then the JSON) with its data, so the fingerprint check costs no extra round trip. When
        every peer's header bytes equal this rank's, the headers are equal and are not decoded:
        ``on_headers`` gets this rank's header once per member (the same object)."""
        n, me = len(self.ranks), self.index
        seq, hb, full, bufs = self._encode(header, sends, key, what)
        C = self.chunk
        k, nrounds, headers = 0, 1, None
        while k < nrounds:
            parity = self.step % 2
            areas = self._areas[parity]
            area = areas[me]
            if k == 0:
                HEAD.pack_into(area, 0, len(hb), -1 if seq is None else seq)
                area[HEAD.size : HEAD.size + len(hb)] = hb
                self._header_in[parity] = None
            lo, hi = k * C, (k + 1) * C
            for start, u8 in bufs:
                a, b = max(lo, start), min(hi, start + u8.size)
                if a < b:
                    area[META_BYTES + a - lo : META_BYTES + b - lo] = u8[a - start : b - start]
            self.sync(what)
            if k == 0:
                headers = self._headers(areas, full, hb, seq)
                nrounds = max(1, max((h["_total"] + C - 1) // C for h in headers))
                on_headers(headers)
            pieces = {}
            for src in range(n):
                d = headers[src]["_dir"][me]
                if d is None:
                    continue
                start, length = d
                a, b = max(lo, start), min(hi, start + length)
                if a < b or (length == 0 and k == 0):
                    lo_b, hi_b = META_BYTES + a - lo, META_BYTES + max(a, b) - lo
                    pieces[src] = (a - start, areas[src][lo_b:hi_b])
            if pieces:
                consume(pieces)
            k += 1
        return headers

    def all_reduce(self, x, ufunc, seq: int, key, header, on_headers) -> None:
        """All-reduce ``x`` (C-contiguous, non-empty, at most one round of data) in place in one
        round: the wire format of :meth:`exchange` of ``[x] * n`` (so a peer in any other
        collective still sees the mismatch), with typed views of every member's data area kept
        per ``key`` (shape, dtype, op, check), so a repeated call copies in, synchronises once
        and runs the ufunc. ``header()`` gives the call's header (with ``seq``), asked for only
        when needed."""
        entry = self._reduce_views.get(key)
        if entry is None:
            n = len(self.ranks)
            _, hb, full, _ = self._encode(header(), [x] * n, ("all_reduce",) + key,
                                          lambda: self._what(header()))
            views = [[np.frombuffer(area, x.dtype, x.size, META_BYTES).reshape(x.shape)
                      for area in self._areas[parity]] for parity in (0, 1)]
            if len(self._reduce_views) >= CACHE_SIZE:
                self._reduce_views.clear()
            entry = self._reduce_views[key] = (hb, full["_dir"], full["_total"], views)
        hb, dirs, total, views = entry
        parity = self.step % 2
        areas, views = self._areas[parity], views[parity]
        area = areas[self.index]
        HEAD.pack_into(area, 0, len(hb), seq)
        if self._header_in[parity] is not hb:  # a repeated call finds its header there already
            area[HEAD.size : HEAD.size + len(hb)] = hb
            self._header_in[parity] = hb
        views[self.index][...] = x
        self.sync(lambda: self._what(header()))
        head, end = (len(hb), seq), HEAD.size + len(hb)
        for ar in self._peer_areas[parity]:
            if HEAD.unpack_from(ar, 0) != head or ar[HEAD.size : end] != hb:
                full = dict(header(), _dir=dirs, _total=total)
                on_headers(self._headers(areas, full, hb, seq))  # raises on a mismatch
                break
        ufunc(views[0], views[1], out=x)
        for v in views[2:]:
            ufunc(x, v, out=x)

    def _what(self, header: dict) -> str:
        """The call a header describes, for errors and the watchdog."""
        return f"{describe(header)} in group {self.ranks}"

    def _headers(self, areas: list, full: dict, hb: bytes, seq) -> list[dict]:
        """Every member's header of this round: ``full`` (this rank's) for each member when all
        the header bytes match, else each member's decoded header."""
        head = (len(hb), -1 if seq is None else seq)
        end = HEAD.size + len(hb)
        for ar in areas:
            if HEAD.unpack_from(ar, 0) != head or ar[HEAD.size : end] != hb:
                break
        else:
            return [full] * len(areas)
        headers = []
        for ar in areas:
            length, their_seq = HEAD.unpack_from(ar, 0)
            h = json.loads(bytes(ar[HEAD.size : HEAD.size + length]))
            if their_seq >= 0:
                h["seq"] = their_seq
            headers.append(h)
        return headers


class Ring:
    """A single-producer single-consumer byte ring in shared memory (one per direction)."""

    def __init__(self, seg: Segment):
        self.seg = seg
        self.cap = seg.size - CTRL_BYTES
        self.data = seg.buf[CTRL_BYTES:]
        self.ctrl = seg.ctrl

    def _wait(self, ready, watchdog: Watchdog, peer_pid_slot: int) -> None:
        def check() -> None:
            pid = int(self.ctrl[peer_pid_slot])
            if pid and not pid_alive(pid):
                raise CollectiveError(f"{watchdog.what()}: peer process {pid} died")

        waiter = Waiter(watchdog, check)
        while not ready():
            waiter.pause()

    def write(self, data: memoryview, watchdog: Watchdog) -> None:
        """Append ``data``, waiting for the reader whenever the ring is full."""
        pos, n, cap, ctrl = 0, len(data), self.cap, self.ctrl
        while pos < n:
            w = ctrl[RING_WRITTEN]
            if w - ctrl[RING_READ] >= cap:
                self._wait(lambda: ctrl[RING_WRITTEN] - ctrl[RING_READ] < cap, watchdog,
                           RING_READER_PID)
            free = cap - (w - ctrl[RING_READ])
            off = w % cap
            k = min(free, n - pos, cap - off)
            self.data[off : off + k] = data[pos : pos + k]
            pos += k
            ctrl[RING_WRITTEN] = w + k

    def read(self, out: memoryview, watchdog: Watchdog) -> None:
        """Fill ``out`` with the next bytes, waiting for the writer whenever the ring is empty."""
        pos, n, cap, ctrl = 0, len(out), self.cap, self.ctrl
        while pos < n:
            r = ctrl[RING_READ]
            if ctrl[RING_WRITTEN] == r:
                self._wait(lambda r=r: ctrl[RING_WRITTEN] > r, watchdog, RING_WRITER_PID)
            avail = ctrl[RING_WRITTEN] - r
            off = r % cap
            k = min(avail, n - pos, cap - off)
            out[pos : pos + k] = self.data[off : off + k]
            pos += k
            ctrl[RING_READ] = r + k

    def close(self) -> None:
        """Unmap the ring."""
        self.seg.close()

