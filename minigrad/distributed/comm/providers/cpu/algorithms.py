"""The ``"cpu"`` backend's collectives, each written once on the transports' ``exchange``
(gather, scatter, all-gather and all-to-all come from the backend base, on :meth:`exchange`).

Reductions combine the members' inputs in group order, so every rank gets bitwise the same result.
With more than two members and more than :data:`RS_AG_MIN_BYTES`, all-reduce runs as reduce-scatter
then all-gather: each rank reads ``2 (n-1) / n`` of the array instead of ``n - 1`` whole copies.
Arrays that every member holds in its shared heap (``comm.shared_empty``) are not copied through
the exchange at all: all-reduce and reduce-scatter read them in place (``_all_reduce_shared``,
``_reduce_scatter_shared``), after one round in which the members tell where they lie.
"""

from __future__ import annotations

import numpy as np

from minigrad.distributed.comm.providers.base import (
    UFUNCS,
    Backend,
    ReduceOp,
    array_meta,
    as_bytes,
    check_broadcast_buffers,
    check_fingerprints,
    describe,
    divide_by_count,
    dtype_name,
    fingerprint,
    reduce_in_order,
)
from minigrad.distributed.comm.providers.cpu.p2p import PeerChannels
from minigrad.distributed.comm.providers.cpu.shm import ShmTransport
from minigrad.distributed.comm.providers.cpu.tcp import TcpTransport
from minigrad.distributed.comm.providers.cpu.transport import LocalTransport, choose_transport

# Below 64 KiB the one-round direct exchange wins: the second synchronised round of reduce-scatter
# + all-gather costs more than reading n-1 small arrays (measured on 3-4 ranks of a 2-core VM).
RS_AG_MIN_BYTES = 64 << 10
TRANSPORTS = {"local": LocalTransport, "shm": ShmTransport, "tcp": TcpTransport}


def _empty(meta) -> np.ndarray:
    return np.empty(meta[0], dtype=np.dtype(meta[1]))


def _fill(out: np.ndarray, offset: int, piece: memoryview) -> None:
    if len(piece):
        as_bytes(out)[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)


def _ignore(pieces) -> None:
    """The consume step of an exchange that moves no data."""


class _Aborting:
    """``with backend._aborting:`` around a collective's transport work: on any error inside,
    tell the peers this rank abandoned the collective and mark the group broken (every member
    then raises instead of waiting), then let the error go on. A class rather than a
    ``contextlib.contextmanager``: entering and leaving a generator-based one cost 0.6 us, a
    tenth of a 4 KiB all-reduce (5.5 -> 4.9 us a call, 2 ranks of an AMD EPYC)."""

    __slots__ = ("backend",)

    def __init__(self, backend):
        self.backend = backend

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if exc is not None:
            self.backend.transport.abort()
            self.backend.ctx.mark_broken(exc)
        return False  # re-raise


class CpuBackend(Backend):
    """Collectives on NumPy arrays for one group, over shared memory or TCP."""

    name = "cpu"
    averages = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.transport_kind = choose_transport(ctx.ranks, ctx.hosts)
        self.transport = TRANSPORTS[self.transport_kind](ctx)
        # point-to-point channels belong to the WORLD group (peers are global ranks)
        self.peers = PeerChannels(ctx, ctx.hosts) if ctx.gid == 0 else None
        ranks = ctx.ranks
        self._check_headers = lambda headers: check_fingerprints(headers, ranks)
        self._aborting = _Aborting(self)

    def close(self) -> None:
        super().close()
        if self.peers is not None:
            self.peers.close()
        self.transport.close()

    # --- plumbing
    def _what(self, fp: dict):
        """``what()``: the call of fingerprint ``fp`` in this group, for error messages (built
        only when one is written)."""
        return lambda: f"{describe(fp)} in group {self.ctx.ranks}"

    def _run(self, fp: dict, sends: list, on_headers=None, consume=None, key=None) -> list[dict]:
        """One exchange under fingerprint ``fp``, checked on every member; ``key`` (optional) lets
        the transport reuse the encoded header of an earlier call with the same key."""
        fp.setdefault("backend", self.name)  # the NCCL backend checks its calls through here
        what = self._what(fp)

        def headers_hook(headers):
            self._check_headers(headers)
            if on_headers is not None:
                on_headers(headers)

        with self._aborting:
            return self.transport.exchange(
                fp, sends, headers_hook, consume or _ignore, what, key
            )

    def exchange_headers(self, fp: dict, on_headers=None) -> list[dict]:
        """Agree on a fingerprint (and exchange small JSON headers) without data: the NCCL backend
        checks its calls this way before NCCL sees them."""
        self.flush()
        return self._run(fp, [None] * len(self.ctx.ranks), on_headers)

    def exchange(self, fp: dict, sends: list) -> list:
        """Exchange, receiving a list of arrays (one per member that addressed this rank)."""
        me = self.ctx.rank
        outs: list = [None] * len(self.ctx.ranks)

        def on_headers(headers):
            for src, h in enumerate(headers):
                m = h["meta"][me]
                if m is not None:
                    outs[src] = _empty(m)

        def consume(pieces):
            for src, (off, mv) in pieces.items():
                _fill(outs[src], off, mv)

        self._run(fp, sends, on_headers, consume)
        return outs

    # --- collectives
    def shared_empty(self, count: int, dtype: np.dtype):
        """A 1-D array in this rank's shared heap (:mod:`.shared_heap`), or None (not on shared
        memory, heap full)."""
        if self.transport.kind != "shm":
            return None
        block = self.transport.heap.allocate(count * dtype.itemsize)
        return None if block is None else np.frombuffer(block, dtype, count)

    def all_reduce(self, x: np.ndarray, op: ReduceOp, seq: int, check: str | None = None) -> None:
        """In place. ``ReduceOp.AVG`` (``averages``) divides as the reduction's last step: on
        the zero-copy path each member divides only its own part."""
        transport, n = self.transport, len(self.ctx.ranks)
        divisor = n if op is ReduceOp.AVG else None
        ufunc = UFUNCS[ReduceOp.SUM if divisor else op]

        def header() -> dict:
            sig = [list(x.shape), dtype_name(x.dtype), op.value]
            return dict(fingerprint("all_reduce", seq, None, sig, check), backend=self.name)

        key = (x.shape, x.dtype, op, check)
        if transport.kind == "shm" and 0 < x.nbytes <= transport.chunk and (
                n <= 2 or x.nbytes <= RS_AG_MIN_BYTES):
            # one round of shared memory: the transport's own all-reduce (see ShmTransport); the
            # fingerprint is built only when the transport needs it (first call of a shape, a
            # mismatch, a wait long enough to warn)
            with self._aborting:
                transport.all_reduce(x, ufunc, seq, key, header, self._check_headers)
        else:
            fp = header()
            if transport.kind == "shm" and self._all_reduce_shared(x, ufunc, fp, key, divisor):
                return
            if n > 2 and x.nbytes > RS_AG_MIN_BYTES and x.size >= n:
                self._all_reduce_rs_ag(x, ufunc, fp)
            else:
                self._all_reduce_direct(x, ufunc, fp, key)
        if divisor:
            divide_by_count(x, divisor)

    def _shared_offsets(self, fp: dict, arrays: list, key) -> np.ndarray | None:
        """Round 1 of the zero-copy paths (fingerprints checked as in every exchange): each
        member tells where each of ``arrays`` lies in its shared heap (:mod:`.shared_heap`).
        Every member's offsets (row j: member j's), or None when some member has one of them
        in private memory (or cannot map its peers' heaps): every member sees the same and
        falls back alike.

        The round is the transport's one-round all-reduce (a sum) of a table in which each
        member fills its own row with offset + 1 (0: private) and leaves the others' at 0,
        which gives every member the whole table."""
        transport, n, me = self.transport, len(self.ctx.ranks), self.ctx.rank
        table = np.zeros((n, len(arrays)), np.int64)
        if table.nbytes > transport.chunk:  # more than one round (a tiny MINIGRAD_DIST_SHM_CHUNK):
            return None  # every member copies, as all of them decide so
        where = [transport.heap.locate(a) for a in arrays]
        if None not in where and not transport.peer_heaps_mapped():
            where = [None] * len(arrays)  # it cannot read the peers' arrays: everyone copies
        table[me] = [0 if w is None else w + 1 for w in where]
        fp.setdefault("backend", self.name)
        with self._aborting:
            transport.all_reduce(table, np.add, fp["seq"], key, lambda: fp, self._check_headers)
        return table - 1 if table.all() else None

    def _all_reduce_shared(self, x, ufunc, fp, key, divisor) -> bool:
        """The zero-copy all-reduce, when every member's ``x`` lies in its shared heap
        (:func:`~minigrad.distributed.comm.arrays.shared_empty`); else False, nothing done.

        After round 1 (:meth:`_shared_offsets`) the array is taken in pieces of one transport
        round per member (half an L2 cache each). In each piece, member i reduces part i,
        reading that part of every member's array in place, in group order (bitwise what the
        other paths give), and divides it for AVG; after a synchronisation each member copies
        the piece's other parts from their owners while they are still in cache (2 ranks on an
        AMD EPYC, against reducing the whole array, then copying it: 16 MiB 2.18 -> 1.64 ms,
        2.7 MB 480 -> 308 us). A last synchronisation keeps every array unchanged until all
        members have copied."""
        offsets = self._shared_offsets(fp, [x], ("all_reduce/where",) + key)
        if offsets is None:
            return False
        transport, n, me = self.transport, len(self.ctx.ranks), self.ctx.rank
        what = self._what(fp)
        flat = x.reshape(-1)
        piece = max(transport.chunk // x.itemsize, 1) * n
        with self._aborting:
            arrays = [flat if j == me else
                      transport.peer_array(j, int(offsets[j][0]), x.dtype, x.size, what)
                      for j in range(n)]
            for start in range(0, flat.size, piece):
                size = min(piece, flat.size - start)
                bounds = [start + size * j // n for j in range(n + 1)]
                part = slice(bounds[me], bounds[me + 1])
                reduce_in_order([a[part] for a in arrays], ufunc, flat[part])
                if divisor:
                    divide_by_count(flat[part], divisor)
                transport.sync(what)  # every part of this piece is reduced
                for j in range(n):
                    if j != me:
                        flat[bounds[j] : bounds[j + 1]] = arrays[j][bounds[j] : bounds[j + 1]]
            transport.sync(what)  # nobody reads this rank's array any more
        return True

    def all_gather_into(self, x: np.ndarray, out: np.ndarray, seq: int,
                        check: str | None = None) -> None:
        """Member j's ``x`` into ``out[j * x.size : (j + 1) * x.size]``, each piece written
        straight into ``out`` (no array per member). When every member's ``x`` lies in its
        shared heap, each member copies the others' ``x`` in place from their memory (round 1
        says where, round 2 keeps them unchanged until all have copied); else the pieces come
        through the exchange buffers. ``x`` may be a view of ``out`` (an in-place gather)."""
        n, k = len(self.ctx.ranks), x.size
        fp = fingerprint("all_gather_into", seq, None, [dtype_name(x.dtype), int(k)], check)
        flat = x.reshape(-1)
        parts = [out[j * k : (j + 1) * k] for j in range(n)]
        key = ("all_gather_into", x.dtype, k, check)
        if (self.transport.kind == "shm" and x.nbytes * n > self.transport.chunk
                and self._all_gather_shared(flat, parts, fp, key)):
            return

        def consume(pieces):
            for src, (off, mv) in pieces.items():
                _fill(parts[src], off, mv)

        self._run(fp, [flat] * n, None, consume, key)

    def _all_gather_shared(self, flat, parts, fp, key) -> bool:
        """The zero-copy all-gather, when every member's ``flat`` lies in its shared heap; else
        False, nothing done. Each member starts with the member after it, so that with more
        than two members they do not all read the same one at once."""
        offsets = self._shared_offsets(fp, [flat], ("all_gather_into/where",) + key)
        if offsets is None:
            return False
        transport, n, me = self.transport, len(self.ctx.ranks), self.ctx.rank
        what = self._what(fp)
        with self._aborting:
            for j in [(me + i) % n for i in range(n)]:
                parts[j][...] = flat if j == me else transport.peer_array(
                    j, int(offsets[j][0]), flat.dtype, flat.size, what)
            transport.sync(what)  # nobody reads this rank's array any more
        return True

    def _all_reduce_direct(self, x, ufunc, fp, key) -> None:
        """Every member reads every member's data, round by round, and reduces all of it."""
        n = len(self.ctx.ranks)
        flat = x.reshape(-1)
        dtype = x.dtype

        def consume(pieces):
            if len(pieces) == 2:  # the common case: two members, one ufunc call
                off, first = pieces[0]
                second = pieces[1][1]
                off //= x.itemsize
                a, b = np.frombuffer(first, dtype), np.frombuffer(second, dtype)
                ufunc(a, b, out=flat[off : off + a.size])
                return
            srcs = sorted(pieces)
            off = pieces[srcs[0]][0] // x.itemsize
            views = [np.frombuffer(pieces[s][1], dtype) for s in srcs]
            reduce_in_order(views, ufunc, flat[off : off + views[0].size])

        self._run(fp, [x] * n, None, consume, ("all_reduce",) + key)

    def _all_reduce_rs_ag(self, x, ufunc, fp) -> None:
        n, me = len(self.ctx.ranks), self.ctx.rank
        flat = x.reshape(-1)
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
        parts = [flat[bounds[j] : bounds[j + 1]] for j in range(n)]
        mine = np.empty_like(parts[me])
        started = set()

        def consume_rs(pieces):
            for src in sorted(pieces):
                off, mv = pieces[src]
                v = np.frombuffer(mv, x.dtype)
                o = mine[off // x.itemsize : off // x.itemsize + v.size]
                if off not in started:
                    o[...] = v
                    started.add(off)
                else:
                    ufunc(o, v, out=o)

        self._run(fp, parts, None, consume_rs)

        def consume_ag(pieces):
            for src, (off, mv) in pieces.items():
                _fill(flat, int(bounds[src]) * x.itemsize + off, mv)

        self._run(dict(fp, op="all_reduce/gather"), [mine] * n, None, consume_ag)

    def broadcast(self, x: np.ndarray | None, root: int, seq: int,
                  check: str | None = None) -> np.ndarray:
        n, me, ranks = len(self.ctx.ranks), self.ctx.rank, self.ctx.ranks
        fp = dict(fingerprint("broadcast", seq, ranks[root], None, check), meta=array_meta(x))
        box = {"out": x}

        def on_headers(headers):
            check_broadcast_buffers(headers, root, ranks, seq)
            if box["out"] is None:
                box["out"] = _empty(headers[root]["meta"])

        def consume(pieces):
            if me != root:
                off, mv = pieces[root]
                _fill(box["out"], off, mv)

        sends = [x] * n if me == root else [None] * n
        self._run(fp, sends, on_headers, consume)
        return box["out"]

    def reduce(self, x: np.ndarray, op: ReduceOp, root: int, seq: int,
               check: str | None = None) -> None:
        n = len(self.ctx.ranks)
        sends = [x if j == root else None for j in range(n)]
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        outs = self.move("reduce", seq, self.ctx.ranks[root], sig, sends, check)
        if self.ctx.rank == root:
            reduce_in_order(outs, UFUNCS[op], x)

    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int,
                       check: str | None = None) -> np.ndarray:
        sig = [[array_meta(c) for c in chunks], op.value]
        if self.transport.kind == "shm" and sum(c.nbytes for c in chunks) > self.transport.chunk:
            out = self._reduce_scatter_shared(chunks, op, seq, sig, check)
            if out is not None:
                return out
        outs = self.move("reduce_scatter", seq, None, sig, list(chunks), check)
        return reduce_in_order(outs, UFUNCS[op], np.empty_like(outs[0]))

    def _reduce_scatter_shared(self, chunks, op, seq, sig, check) -> np.ndarray | None:
        """The zero-copy reduce-scatter, when every member's chunks all lie in its shared heap
        (views of one ``shared_empty`` array, as ``fully_shard``'s gradient buffers are); else
        None, nothing done. After round 1 (:meth:`_shared_offsets`), member i reduces chunk i of
        every member, read in place, in group order; round 2 keeps every chunk unchanged until
        all members have read."""
        fp = dict(fingerprint("reduce_scatter", seq, None, sig, check),
                  meta=[array_meta(c) for c in chunks])
        key = ("reduce_scatter/where", tuple((c.shape, c.dtype) for c in chunks), op, check)
        offsets = self._shared_offsets(fp, chunks, key)
        if offsets is None:
            return None
        transport, n, me = self.transport, len(self.ctx.ranks), self.ctx.rank
        what = self._what(fp)
        mine = chunks[me]
        with self._aborting:
            parts = [mine if j == me else
                     transport.peer_array(j, int(offsets[j][me]), mine.dtype, mine.size, what)
                     .reshape(mine.shape) for j in range(n)]
            out = reduce_in_order(parts, UFUNCS[op], np.empty_like(mine))
            transport.sync(what)  # nobody reads this rank's chunks any more
        return out

    def barrier(self, seq: int, check: str | None = None) -> None:
        self._run(fingerprint("barrier", seq, None, None, check), [None] * len(self.ctx.ranks))

    # --- point to point
    def _channels(self) -> PeerChannels:
        if self.peers is None:
            raise RuntimeError("point-to-point messages go through the WORLD group's backend")
        return self.peers

    def send(self, x, dst: int, header: dict) -> None:
        self._channels().send(x, dst, header)

    def recv(self, src: int):
        return self._channels().recv(src)
