"""The ``"mpi"`` backend: collectives and messages through MPI (``mpi4py``; ``pip install -e
".[mpi]"`` brings mpi4py and the MPICH library).

Use it where MPI is how jobs start (``mpiexec -n 4 python train.py``, Slurm's ``srun``): the
process group's ranks are ``MPI_COMM_WORLD``'s, the WORLD group talks on a duplicate of it and each
sub-group on a communicator made with ``MPI_Comm_create_group`` by its members only.

Every call first agrees on its fingerprint in one small ``Iallgather`` of fixed-size slots, one
per member: a binary head (the length of the header's JSON and the call's sequence number), then
the JSON of the rest of the fingerprint (cached per call signature, so a repeated call encodes
nothing; a header longer than :data:`HEADER_SLOT` follows in a second, sized round). When every
slot holds this rank's bytes the call is agreed without decoding anything; otherwise the headers are
decoded, and mismatched calls raise on every rank with the same message as the other backends. The
round also tells receivers the shapes they are about to get. Data then moves with the matching
nonblocking MPI collective, whose request is polled by the same :class:`~.waiting.Waiter` and
watchdog as the cpu backend's waits, so MPI calls get the same warning and timeout (a blocking MPI
call could never time out). MPI cannot tell which ranks have not arrived: a rank that waits for more
than :data:`PUBLISH_AFTER` seconds records its position in the store, and the watchdog names the
members that have not recorded reaching this call.

Small reductions (at most :data:`INLINE_BYTES`, groups of at most :data:`INLINE_MAX_MEMBERS`,
host arrays: not where a CUDA-aware MPI takes GPU arrays) travel inside the header round, after
the header in each slot: every member reduces the gathered contributions itself, in member order,
so such a call is one MPI round trip instead of two (the fingerprint check costs no round of its
own, as on the cpu backend's shared memory) and its result is bitwise the same on every rank.

Larger reductions use MPI's own (``float16``, which MPI lacks, is reduced in float32). With more
than two ranks MPI does not promise the same summation order on every rank, so their float results
may differ in the last bit between ranks (the cpu backend's are bitwise identical). CuPy arrays are
passed to MPI directly when the library is CUDA-aware (:func:`cuda_aware`), otherwise staged through
host memory.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct

import numpy as np

from minigrad.distributed.comm.flat_buffer import FlatBuffer
from minigrad.distributed.comm.providers import base
from minigrad.distributed.comm.providers.base import (
    BOOL_AS_BYTES_OPS,
    UFUNCS,
    Backend,
    CollectiveError,
    ReduceOp,
    array_meta,
    as_bytes,
    dtype_name,
    reduce_in_order,
)
from minigrad.distributed.comm.providers.waiting import Waiter, Watchdog, polls
from minigrad.distributed.runtime.store import StoreTimeout
from minigrad.distributed.runtime.wire import encode_header

HEADER_SLOT = 512  # bytes per member for the header (HEAD, then the JSON): fits most headers
HEAD = struct.Struct("<qq")  # the header JSON's length (negative: follows in a second round), seq
INLINE_BYTES = 4096  # reductions up to this size ride in the header round (groups of up to ...)
INLINE_MAX_MEMBERS = 8  # ... 8 members: each member's slot grows by INLINE_BYTES for every call
CACHE_SIZE = 256  # encoded headers kept per group (keys: the calls' signatures)
PUBLISH_AFTER = 1.0  # seconds of waiting before a rank records its position in the store
QUICK_POLLS = 16  # polls before the watchdog is set up: small calls usually complete within them
MPI_SPIN_POLLS = 500  # then ~100 us of polling before each poll also yields the core
TAG_HEADER, TAG_DATA = 1, 2  # point-to-point message parts (MPI keeps each tag's order per pair)
_MPI_TYPES = {
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "int8": "INT8_T",
    "uint8": "UINT8_T",
    "bool": "UINT8_T",
    "int32": "INT32_T",
    "int64": "INT64_T",
}
_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PROD", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"}


def mpi_module():
    """``mpi4py.MPI`` (importing it initialises MPI); a clear error when mpi4py is missing."""
    try:
        from mpi4py import MPI  # optional dependency: the [mpi] extra
    except ImportError as exc:
        raise RuntimeError(  # one line naming the extra, not the import machinery's traceback
            f"the mpi backend needs mpi4py and an MPI library ({exc}); install them with "
            f'pip install -e ".[mpi]"'
        ) from None
    return MPI


def cuda_aware() -> bool:
    """Whether the loaded MPI library can read CuPy (device) buffers itself
    (``MPIX_Query_cuda_support``, offered by MPICH and Open MPI)."""
    mpi_module()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libmpi" in line and ".so" in line}
    except OSError:
        return False
    for path in paths:
        query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        if query is not None:
            return bool(query())
    return False


def broadcast_from_rank0(data: bytes | None) -> bytes:
    """Rank 0's bytes on every rank of ``MPI_COMM_WORLD`` (the rendezvous bootstrap under mpiexec:
    rank 0 shares the store's address and secret). Raw bytes, never pickle."""
    world = mpi_module().COMM_WORLD
    size = np.array([0 if data is None else len(data)], np.int64)
    world.Bcast(size, root=0)
    buf = np.frombuffer(data, np.uint8).copy() if data is not None else np.empty(size[0], np.uint8)
    world.Bcast(buf, root=0)
    return buf.tobytes()


def _reducible(dtype) -> str:
    """The dtype's name, if the mpi backend reduces it (float16 in float32), else TypeError."""
    name = dtype_name(dtype)
    if name not in _MPI_TYPES and name != "float16":
        raise TypeError(f"mpi backend: dtype {name} is not supported")
    return name


def _reduce_rows(rows: list[np.ndarray], ufunc, out: np.ndarray, widen: bool) -> None:
    """``out`` = rows[0] op rows[1] op ... in member order (``widen``: float16 accumulated in
    float32, as the MPI path reduces it; bool sum/product are or/and, as NumPy's ufuncs give)."""
    if widen:
        out[...] = reduce_in_order([r.astype(np.float32) for r in rows], ufunc,
                                   np.empty(out.shape, np.float32))
    else:
        reduce_in_order(rows, ufunc, out)


class MpiBackend(Backend):
    """MPI collectives for one group; WORLD also carries point-to-point messages."""

    name = "mpi"

    def __init__(self, ctx):
        super().__init__(ctx)
        MPI = self.MPI = mpi_module()
        world = MPI.COMM_WORLD
        if ctx.gid == 0:
            if world.Get_size() != len(ctx.ranks) or world.Get_rank() != ctx.global_rank:
                raise CollectiveError(
                    f"backend='mpi': this process is rank {ctx.global_rank} of {len(ctx.ranks)} "
                    f"but MPI_COMM_WORLD rank {world.Get_rank()} of {world.Get_size()}; start the "
                    f"job with mpiexec or srun and let init_process_group() read the ranks"
                )
            self.comm = world.Dup()
        else:
            group = world.Get_group().Incl(list(ctx.ranks))
            self.comm = world.Create_group(group, tag=ctx.gid)
            group.Free()
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise CollectiveError(
                "backend='mpi' needs MPI_THREAD_MULTIPLE (asynchronous operations run on a worker "
                f"thread); this MPI library provides level {MPI.Query_thread()}"
            )
        self.accepts_gpu_arrays = cuda_aware()
        self._quick_polls = polls(QUICK_POLLS)
        # small reductions ride in the header round, unless GPU arrays may come (the choice must
        # not depend on where a member's array lives: members take a path by the call alone)
        small = len(ctx.ranks) <= INLINE_MAX_MEMBERS and not self.accepts_gpu_arrays
        self._inline_room = INLINE_BYTES if small else 0
        # the header round's buffers: one slot per member, the same size for every call (all
        # members post the same count whatever call they are in); used by one call at a time
        self._slot = HEADER_SLOT + self._inline_room
        self._send = np.zeros(self._slot, np.uint8)
        self._received = np.zeros((len(ctx.ranks), self._slot), np.uint8)
        self._send_bytes = memoryview(self._send)
        self._received_bytes = memoryview(self._received.reshape(-1))
        self._body_sent: bytes | None = None  # the header JSON now in self._send
        self._json: dict = {}  # key -> JSON of a header without its seq
        self._inline: dict = {}  # key -> views for a reduction in the header round

    def close(self) -> None:
        super().close()
        self.comm.Free()

    # --- waiting
    def _what(self, header):
        """The description of a call for the watchdog's messages, built only when needed from
        its header (``header``: the header, or a function that gives it)."""
        return lambda: (f"{base.describe(header() if callable(header) else header)} in group "
                        f"{self.ctx.ranks} (backend mpi)")

    def _wait(self, request, what, seq: int) -> None:
        """Poll ``request`` until it completes, under the group's watchdog."""
        for _ in range(self._quick_polls):
            if request.Test():
                return
        ctx = self.ctx
        key = f"{ctx.prefix}/mpi-arrived"
        state = {"published": False}

        def not_arrived() -> list[int]:
            late = []
            for j, r in enumerate(ctx.ranks):
                if j == ctx.rank:
                    continue
                try:
                    if int(ctx.client.get(f"{key}/{j}", timeout=0)) < seq:
                        late.append(r)
                except StoreTimeout:
                    late.append(r)
            return late

        watchdog = Watchdog(what, ctx.timeout, ctx.warn_after, ctx.global_rank, not_arrived)

        def publish() -> None:
            if not state["published"] and watchdog.elapsed() >= min(PUBLISH_AFTER, ctx.warn_after):
                ctx.client.set(f"{key}/{ctx.rank}", seq)
                state["published"] = True

        waiter = Waiter(watchdog, publish, spin_polls=MPI_SPIN_POLLS, yield_polls=math.inf)
        try:
            while not request.Test():
                waiter.pause()
        except BaseException as exc:
            ctx.mark_broken(exc)  # the request may still be pending: the communicator is unusable
            raise

    def _agree(self, fp: dict, key=None) -> list[dict]:
        """Every member's header (fingerprint + metadata), checked: the header round with no data.
        ``key`` (optional) caches the header's JSON: the caller's promise that calls with equal
        keys have equal headers but for ``seq``."""
        headers = self._header_round(lambda: fp, self._encoded(key, fp), fp["seq"])
        return [fp] * len(self.ctx.ranks) if headers is None else headers

    def _encoded(self, key, fp: dict) -> bytes:
        """The JSON of ``fp`` but its ``seq`` (which travels in binary), cached under ``key``."""
        body = self._json.get(key) if key is not None else None
        if body is None:
            body = encode_header({k: v for k, v in fp.items() if k != "seq"})
            if key is not None:
                if len(self._json) >= CACHE_SIZE:
                    self._json.clear()
                self._json[key] = body
        return body

    def _header_round(self, header, body: bytes, seq: int) -> list[dict] | None:
        """One Iallgather of every member's slot (:data:`HEAD`, then ``body``, then whatever the
        caller put in the data part of ``self._send``) into ``self._received``; None when every
        member sent this rank's header bytes, else every member's decoded header, checked (a
        mismatch raises on every member). ``header()`` gives this rank's header, asked for only
        when a message needs it. A ``body`` longer than the slot is sent as its negated length
        and follows in a second, sized round that every member then joins."""
        n, me, size, send = len(self.ctx.ranks), self.ctx.rank, self._slot, self._send
        fits = HEAD.size + len(body) <= HEADER_SLOT
        end = HEAD.size + len(body) if fits else HEAD.size
        HEAD.pack_into(send, 0, len(body) if fits else -len(body), seq)
        if fits and self._body_sent is not body:
            send[HEAD.size : end] = np.frombuffer(body, np.uint8)
            self._body_sent = body
        what = self._what(header)
        self._wait(self.comm.Iallgather(send, self._received), what, seq)
        mine, got = self._send_bytes[:end], self._received_bytes
        for j in range(n):
            if j != me and (not fits or got[j * size : j * size + end] != mine):
                break
        else:
            return None  # the usual case: every member sent this very header
        heads = [HEAD.unpack_from(got, j * size) for j in range(n)]
        if any(length < 0 for length, _ in heads):
            blobs = self._long_headers(body, [abs(length) for length, _ in heads], what, seq)
        else:
            blobs = [bytes(got[j * size + HEAD.size : j * size + HEAD.size + length])
                     for j, (length, _) in enumerate(heads)]
        headers = [dict(json.loads(b), seq=their_seq) for b, (_, their_seq) in zip(blobs, heads)]
        base.check_fingerprints(headers, self.ctx.ranks)
        return headers

    def _long_headers(self, body: bytes, lengths: list[int], what, seq: int) -> list[bytes]:
        flat = np.empty(sum(lengths), np.uint8)
        displs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        request = self.comm.Iallgatherv(
            np.frombuffer(body, np.uint8), [flat, lengths, displs, self.MPI.BYTE]
        )
        self._wait(request, what, seq)
        return [flat[d : d + m].tobytes() for d, m in zip(displs, lengths)]

    def _typed(self, x, op: ReduceOp):
        """``(buffer spec, MPI op)`` for a reduction on ``x`` (float16 is handled by the caller)."""
        name = _reducible(x.dtype)
        if name == "bool":
            op = BOOL_AS_BYTES_OPS.get(op, op)
            x = x.view(np.uint8)
        MPI = self.MPI
        return [x, getattr(MPI, _MPI_TYPES[name])], getattr(MPI, _MPI_OPS[op])

    def _reduction(self, kind: str, x, op: ReduceOp, seq: int, root: int | None,
                   check: str | None) -> None:
        rank_root = None if root is None else self.ctx.ranks[root]
        key = (kind, x.shape, x.dtype, op, rank_root, check)

        def header() -> dict:
            sig = [list(x.shape), dtype_name(x.dtype), op.value]
            return base.fingerprint(kind, seq, rank_root, sig, check)

        inline = None
        if 0 < x.nbytes <= self._inline_room:  # then x is a NumPy array (no GPU arrays come)
            inline = self._inline.get(key) or self._inline_views(key, x, header())
        if inline is not None:  # one round: the data rides in the header round
            body, data, rows, widen = inline
            data[...] = x
            self._header_round(header, body, seq)
            if root is None or self.ctx.rank == root:
                _reduce_rows(rows, UFUNCS[op], x, widen)
            return
        fp = header()
        self._agree(fp, key)
        target = x.astype(np.float32) if x.dtype == np.float16 else x
        buf, mpi_op = self._typed(target, op)
        MPI = self.MPI
        what = self._what(fp)
        if root is None:
            request = self.comm.Iallreduce(MPI.IN_PLACE, buf, mpi_op)
        elif self.ctx.rank == root:
            request = self.comm.Ireduce(MPI.IN_PLACE, buf, mpi_op, root=root)
        else:
            request = self.comm.Ireduce(buf, None, mpi_op, root=root)
        self._wait(request, what, seq)
        if target is not x and (root is None or self.ctx.rank == root):
            x[...] = target

    def _inline_views(self, key, x: np.ndarray, fp: dict) -> tuple | None:
        """``(header JSON, typed view of this rank's data part, typed views of every member's,
        whether float16 is widened)`` for a reduction small enough for the header round, kept
        per ``key``; None for a dtype the backend cannot reduce (the general path then agrees on
        the call and raises)."""
        try:
            _reducible(x.dtype)
        except TypeError:
            return None
        lo, hi = HEADER_SLOT, HEADER_SLOT + x.nbytes
        data = self._send[lo:hi].view(x.dtype).reshape(x.shape)
        rows = [r.view(x.dtype).reshape(x.shape) for r in self._received[:, lo:hi]]
        if len(self._inline) >= CACHE_SIZE:
            self._inline.clear()
        entry = self._inline[key] = (self._encoded(key, fp), data, rows, x.dtype == np.float16)
        return entry

    # --- collectives
    def all_reduce(self, x, op: ReduceOp, seq: int, check: str | None = None) -> None:
        self._reduction("all_reduce", x, op, seq, None, check)

    def reduce(self, x, op: ReduceOp, root: int, seq: int, check: str | None = None) -> None:
        self._reduction("reduce", x, op, seq, root, check)

    def broadcast(self, x, root: int, seq: int, check: str | None = None):
        ranks = self.ctx.ranks
        meta = array_meta(x)
        fp = dict(base.fingerprint("broadcast", seq, ranks[root], None, check), meta=meta)
        headers = self._agree(fp)
        base.check_broadcast_buffers(headers, root, ranks, seq)
        if x is None:
            shape, dt = headers[root]["meta"]
            x = np.empty(shape, dtype=np.dtype(dt))
        what = self._what(fp)
        self._wait(self.comm.Ibcast([as_bytes(x), self.MPI.BYTE], root=root), what, seq)
        return x

    def exchange(self, fp: dict, sends: list) -> list:
        """Member j's ``sends[i]`` arrives as ``result[j]`` on member i: one ``Ialltoallv`` of
        bytes after the header round told everyone the shapes."""
        me, seq = self.ctx.rank, fp["seq"]
        headers = self._agree(fp)
        outs = [None if h["meta"][me] is None else np.empty(h["meta"][me][0], h["meta"][me][1])
                for h in headers]
        send_parts = [as_bytes(a) if a is not None else np.empty(0, np.uint8) for a in sends]
        send_counts = [p.size for p in send_parts]
        recv_counts = [o.nbytes if o is not None else 0 for o in outs]
        send_flat = np.concatenate(send_parts) if send_parts else np.empty(0, np.uint8)
        recv_flat = np.empty(sum(recv_counts), np.uint8)
        sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
        B = self.MPI.BYTE
        request = self.comm.Ialltoallv(
            [send_flat, send_counts, sdispl, B], [recv_flat, recv_counts, rdispl, B]
        )
        what = self._what(fp)
        self._wait(request, what, seq)
        for o, d, c in zip(outs, rdispl, recv_counts):
            if o is not None and c:
                as_bytes(o)[...] = recv_flat[d : d + c]
        return outs

    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int, check: str | None = None):
        me = self.ctx.rank
        metas = [array_meta(c) for c in chunks]
        fp = base.fingerprint("reduce_scatter", seq, None, [metas, op.value], check)
        self._agree(fp)
        widen = chunks[0].dtype == np.float16
        flat = FlatBuffer.of(chunks).data
        flat = flat.astype(np.float32) if widen else flat
        out = np.empty(chunks[me].size, flat.dtype)
        send, mpi_op = self._typed(flat, op)
        recv, _ = self._typed(out, op)
        counts = [c.size for c in chunks]
        what = self._what(fp)
        self._wait(self.comm.Ireduce_scatter(send, recv, counts, mpi_op), what, seq)
        return out.astype(chunks[me].dtype, copy=False).reshape(chunks[me].shape)

    def barrier(self, seq: int, check: str | None = None) -> None:
        # an all-gather: all leave after all came
        self._agree(base.fingerprint("barrier", seq, None, None, check), ("barrier", check))

    # --- point to point
    def send(self, x, dst: int, header: dict) -> None:
        me = self.ctx.global_rank
        what = f"send from rank {me} to rank {dst} (backend mpi)"
        meta = {"header": header}
        if x is not None:
            meta.update(shape=list(x.shape), dtype=dtype_name(x.dtype))
        raw = encode_header(meta)
        if len(raw) > HEADER_SLOT:
            raise CollectiveError(f"{what}: message header of {len(raw)} B exceeds {HEADER_SLOT} B")
        slot = np.zeros(HEADER_SLOT, np.uint8)
        slot[: len(raw)] = np.frombuffer(raw, np.uint8)
        self._wait_p2p(self.comm.Isend(slot, dest=dst, tag=TAG_HEADER), what, dst)
        if x is not None and x.nbytes:
            data = [as_bytes(x), self.MPI.BYTE]
            self._wait_p2p(self.comm.Isend(data, dest=dst, tag=TAG_DATA), what, dst)

    def recv(self, src: int):
        what = f"recv on rank {self.ctx.global_rank} from rank {src} (backend mpi)"
        slot = np.zeros(HEADER_SLOT, np.uint8)
        self._wait_p2p(self.comm.Irecv(slot, source=src, tag=TAG_HEADER), what, src)
        meta = json.loads(slot.tobytes().rstrip(b"\x00"))
        if "shape" not in meta:
            return meta["header"], None
        out = np.empty(meta["shape"], dtype=np.dtype(meta["dtype"]))
        if out.nbytes:
            request = self.comm.Irecv([as_bytes(out), self.MPI.BYTE], source=src, tag=TAG_DATA)
            self._wait_p2p(request, what, src)
        return meta["header"], out

    def _wait_p2p(self, request, what: str, peer: int) -> None:
        if request.Test():
            return
        ctx = self.ctx
        watchdog = Watchdog(what, ctx.timeout, ctx.warn_after, ctx.global_rank, lambda: [peer])
        waiter = Waiter(watchdog, spin_polls=MPI_SPIN_POLLS, yield_polls=math.inf)
        while not request.Test():
            waiter.pause()
