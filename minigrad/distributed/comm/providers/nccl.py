"""The ``"nccl"`` backend: collectives and messages on CuPy arrays with ``cupy.cuda.nccl``.

Calls are agreed on first: fingerprints and shapes travel over the group's host transport (a
header-only exchange of the cpu backend, tens of microseconds), so mismatches raise on every rank,
receivers learn shapes, and NCCL only ever sees matching calls.

Streams: NCCL runs on this backend's own stream. Inputs are prepared (packed, made contiguous) on
the caller's current stream *before* the backend records an event there that the NCCL stream waits
on, so NCCL never reads a buffer before it is filled. After the NCCL kernels the backend records an
"end" event; a synchronous call (:meth:`run`) makes the caller's stream wait on it, an asynchronous
one (:meth:`submit`) returns a :class:`Work` whose ``wait()`` does - so gradient all-reduce overlaps
the rest of backward. Neither blocks the host.

Communicators: a group's communicator is created at its first collective, which all members make
together (the first member creates the unique id and shares it through the store). Point-to-point
messages use one two-rank communicator per pair, created by the two peers at their first message, so
a send never needs ranks that do not take part in it. CuPy is imported only here, on first use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad.backend.device import get_default_device_obj, probe_gpus
from minigrad.backend.xp import cupy_import_error, cupy_or_none
from minigrad.distributed.comm.flat_buffer import FlatBuffer
from minigrad.distributed.comm.providers.base import (
    BOOL_AS_BYTES_OPS,
    Backend,
    CollectiveError,
    ReduceOp,
    Work,
    array_meta,
    check_broadcast_buffers,
    dtype_name,
    fingerprint,
)


def nccl_module():
    """``cupy.cuda.nccl`` when CuPy was built with NCCL, else None (:func:`unavailable_reason`)."""
    return _probe()[0]


def unavailable_reason() -> str | None:
    """Why the NCCL backend cannot be used in this process (None when it can)."""
    nccl, reason = _probe()
    if reason is None:
        gpus = probe_gpus()  # a failed count says why (a broken driver is not "no GPU")
        if gpus.count == 0:
            reason = f"no usable CUDA device ({gpus.reason})"
    return reason


def is_available() -> bool:
    """CuPy with NCCL bindings and at least one CUDA device."""
    return unavailable_reason() is None


def _probe():
    cp = cupy_or_none()
    if cp is None:
        return None, f"CuPy could not be imported ({cupy_import_error()})"
    try:
        from cupy.cuda import nccl  # optional: present only when CuPy was built with NCCL
    except Exception as exc:
        return None, f"cupy.cuda.nccl could not be imported ({type(exc).__name__}: {exc})"
    if not getattr(nccl, "available", True):
        return None, "this CuPy build has no NCCL support (pip install nvidia-nccl-cu12)"
    return nccl, None


def unique_id_to_wire(uid) -> dict:
    """A NCCL unique id as JSON: CuPy >= 14 returns ``bytes``, CuPy 13 a tuple of signed chars."""
    if isinstance(uid, (bytes, bytearray)):
        return {"kind": "bytes", "id": list(bytes(uid))}
    return {"kind": "tuple", "id": [int(v) for v in uid]}


def unique_id_from_wire(wire: dict):
    """The inverse of :func:`unique_id_to_wire`, in the form this CuPy's communicator takes."""
    return bytes(wire["id"]) if wire["kind"] == "bytes" else tuple(wire["id"])


_DTYPE_CODES = {
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "bool": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
}
_OP_CODES = {
    ReduceOp.SUM: "NCCL_SUM",
    ReduceOp.PRODUCT: "NCCL_PROD",
    ReduceOp.MIN: "NCCL_MIN",
    ReduceOp.MAX: "NCCL_MAX",
}
class NcclBackend(Backend):
    """NCCL collectives for one group (``cp``/``nccl`` may be replaced by fakes in unit tests)."""

    name = "nccl"
    accepts_gpu_arrays = True

    def __init__(self, ctx, cp=None, nccl=None):
        super().__init__(ctx)
        self.nccl = nccl if nccl is not None else nccl_module()
        if self.nccl is None:
            raise CollectiveError(
                f"rank {ctx.global_rank}: the nccl backend is unavailable: {unavailable_reason()} "
                f"(install CuPy with NCCL: pip install -e '.[cuda12]')"
            )
        self.cp = cp if cp is not None else cupy_or_none()
        # This rank's GPU (its default device, bound at init): every call runs with it current,
        # also from the threads of isend/irecv, whose current device would otherwise be 0.
        default = get_default_device_obj()
        index = default.index if default.is_gpu else self.cp.cuda.runtime.getDevice()
        self._device = self.cp.cuda.Device(index)
        self.host = ctx.backend("cpu")  # fingerprints, shapes and barriers
        self._comm = None
        self._pairs: dict[int, Any] = {}
        self._stream = None
        self._end_event = None

    # --- setup
    def _new_communicator(self, n: int, key: str, creator: bool, rank: int):
        ctx = self.ctx
        if creator:
            ctx.client.set(key, unique_id_to_wire(self.nccl.get_unique_id()))
        uid = unique_id_from_wire(ctx.client.get(key, timeout=ctx.timeout))
        if self._stream is None:
            self._stream = self.cp.cuda.Stream(non_blocking=True)
        return self.nccl.NcclCommunicator(n, uid, rank)

    def _communicator(self):
        if self._comm is None:
            ctx = self.ctx
            self._comm = self._new_communicator(
                len(ctx.ranks), f"{ctx.prefix}/nccl-id", ctx.rank == 0, ctx.rank
            )
        return self._comm

    def _pair(self, peer: int):
        """The two-rank communicator shared with global rank ``peer`` and the peer's index in it."""
        me = self.ctx.global_rank
        lo, hi = min(me, peer), max(me, peer)
        comm = self._pairs.get(peer)
        if comm is None:
            key = f"{self.ctx.prefix}/nccl-pair/{lo}-{hi}"
            comm = self._pairs[peer] = self._new_communicator(2, key, me == lo, int(me == hi))
        return comm, int(peer == hi)

    def close(self) -> None:
        super().close()
        for comm in [self._comm, *self._pairs.values()]:
            if comm is not None:
                comm.destroy()
        self._comm, self._pairs = None, {}

    # --- stream ordering
    def _after_caller(self) -> None:
        """Make the NCCL stream wait for everything queued on the caller's stream so far."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.cp.cuda.get_current_stream())
        self._stream.wait_event(ev)

    def _begin(self, fp: dict, on_headers=None):
        self.host.exchange_headers(dict(fp, backend=self.name), on_headers)
        comm = self._communicator()
        self._after_caller()
        return comm

    def _end(self) -> None:
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self._stream)
        self._end_event = ev

    def run(self, fn):
        """Run ``fn`` now; the caller's stream then waits for its NCCL kernels (not the host)."""
        with self._device:
            self._end_event = None
            out = fn()
            if self._end_event is not None:
                self.cp.cuda.get_current_stream().wait_event(self._end_event)
            return out

    def submit(self, fn) -> Work:
        """Enqueue ``fn``'s NCCL kernels; ``Work.wait()`` makes the caller's stream wait."""
        with self._device:
            self._end_event = None
            out = fn()
            ev = self._end_event
        if ev is None:
            return Work.ready(out)

        def wait():
            with self._device:
                self.cp.cuda.get_current_stream().wait_event(ev)
            return out

        return Work(wait, lambda: bool(ev.done))

    def _codes(self, dtype, op: ReduceOp | None = None):
        name = dtype_name(dtype)
        if name not in _DTYPE_CODES:
            raise TypeError(f"nccl backend: dtype {name} is not supported")
        code = getattr(self.nccl, _DTYPE_CODES[name])
        if op is None:
            return code
        if name == "bool":
            op = BOOL_AS_BYTES_OPS.get(op, op)
        return code, getattr(self.nccl, _OP_CODES[op])

    # --- collectives
    def all_reduce(self, x, op: ReduceOp, seq: int) -> None:
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        comm = self._begin(fingerprint("all_reduce", seq, None, sig))
        if x.size:
            dt, code = self._codes(x.dtype, op)
            comm.allReduce(x.data.ptr, x.data.ptr, x.size, dt, code, self._stream.ptr)
        self._end()

    def broadcast(self, x, root: int, seq: int):
        ranks = self.ctx.ranks
        box = {"out": x}
        fp = dict(fingerprint("broadcast", seq, ranks[root]), meta=array_meta(x))

        def on_headers(headers):
            check_broadcast_buffers(headers, root, ranks, seq)
            if box["out"] is None:
                shape, dt = headers[root]["meta"]
                box["out"] = self.cp.empty(shape, dtype=dt)

        comm = self._begin(fp, on_headers)
        out = box["out"]
        if out.size:
            ptr = out.data.ptr
            comm.broadcast(ptr, ptr, out.size, self._codes(out.dtype), root, self._stream.ptr)
        self._end()
        return out

    def reduce(self, x, op: ReduceOp, root: int, seq: int) -> None:
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        comm = self._begin(fingerprint("reduce", seq, self.ctx.ranks[root], sig))
        if x.size:
            dt, code = self._codes(x.dtype, op)
            comm.reduce(x.data.ptr, x.data.ptr, x.size, dt, code, root, self._stream.ptr)
        self._end()

    def _grouped(self, comm, sends: dict, recvs: dict) -> None:
        """Grouped NCCL sends/recvs: ``sends``/``recvs`` map peer index -> array."""
        nccl, s = self.nccl, self._stream.ptr
        nccl.groupStart()
        try:
            for j, a in sends.items():
                if a.size:
                    comm.send(a.data.ptr, a.size, self._codes(a.dtype), j, s)
            for j, a in recvs.items():
                if a.size:
                    comm.recv(a.data.ptr, a.size, self._codes(a.dtype), j, s)
        finally:
            nccl.groupEnd()

    def _exchange(self, op, seq, root, sig, sends: list) -> list:
        """Header exchange, then grouped send/recv; returns the arrays received (per source)."""
        cp, me = self.cp, self.ctx.rank
        outs: list = [None] * len(self.ctx.ranks)

        def on_headers(headers):
            for src, h in enumerate(headers):
                m = h["meta"][me]
                if m is not None:
                    outs[src] = cp.empty(m[0], dtype=m[1])

        fp = dict(fingerprint(op, seq, root, sig), meta=[array_meta(a) for a in sends])
        comm = self._begin(fp, on_headers)
        if sends[me] is not None:
            self._copy_on_stream(outs[me], sends[me])
        self._grouped(
            comm,
            {j: a for j, a in enumerate(sends) if a is not None and j != me},
            {j: a for j, a in enumerate(outs) if a is not None and j != me},
        )
        self._end()
        return outs

    def _copy_on_stream(self, dst, src) -> None:
        with self._stream:
            dst[...] = src

    def all_gather(self, x, seq: int) -> list:
        sends = [x] * len(self.ctx.ranks)
        return self._exchange("all_gather", seq, None, dtype_name(x.dtype), sends)

    def gather(self, x, root: int, seq: int):
        sends = [x if j == root else None for j in range(len(self.ctx.ranks))]
        outs = self._exchange("gather", seq, self.ctx.ranks[root], dtype_name(x.dtype), sends)
        return outs if self.ctx.rank == root else None

    def scatter(self, chunks, root: int, seq: int):
        n = len(self.ctx.ranks)
        sends = list(chunks) if self.ctx.rank == root else [None] * n
        return self._exchange("scatter", seq, self.ctx.ranks[root], None, sends)[root]

    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int):
        cp, me = self.cp, self.ctx.rank
        sig = [[array_meta(c) for c in chunks], op.value]
        dt, code = self._codes(chunks[0].dtype, op)
        out = cp.empty_like(chunks[me])
        if len({c.shape for c in chunks}) == 1:
            # packed on the caller's stream, *before* _begin orders the NCCL stream after it
            flat = FlatBuffer.of(chunks, xp=cp).data
            comm = self._begin(fingerprint("reduce_scatter", seq, None, sig))
            if out.size:
                comm.reduceScatter(flat.data.ptr, out.data.ptr, out.size, dt, code,
                                   self._stream.ptr)
            self._end()
            return out
        comm = self._begin(fingerprint("reduce_scatter", seq, None, sig))
        self.nccl.groupStart()  # ragged chunks: one reduce per destination, grouped
        try:
            for j, c in enumerate(chunks):
                if c.size:
                    dst = out if j == me else c
                    comm.reduce(c.data.ptr, dst.data.ptr, c.size, dt, code, j, self._stream.ptr)
        finally:
            self.nccl.groupEnd()
        self._end()
        return out

    def all_to_all(self, chunks: list, seq: int) -> list:
        return self._exchange("all_to_all", seq, None, dtype_name(chunks[0].dtype), list(chunks))

    def barrier(self, seq: int) -> None:
        self.host.barrier(seq)

    # --- point to point: the header goes over the host channel, the payload over a pair comm
    def send(self, x, dst: int, header: dict) -> None:
        channel = self.ctx.backend(self.ctx.host_route)
        channel.send(None, dst, dict(header, via="nccl", meta=array_meta(x)))
        comm, peer = self._pair(dst)
        self._after_caller()
        if x.size:
            comm.send(x.data.ptr, x.size, self._codes(x.dtype), peer, self._stream.ptr)
        self._end()

    def recv(self, src: int):
        header, y = self.ctx.backend(self.ctx.host_route).recv(src)
        if header.get("via") == "nccl":
            y = self.recv_payload(src, header)
        return header, y

    def recv_payload(self, src: int, header: dict):
        """The CuPy payload announced by ``header`` (received on the host channel)."""
        shape, dtype = header["meta"]
        out = self.cp.empty(shape, dtype=np.dtype(dtype))
        comm, peer = self._pair(src)
        self._after_caller()
        if out.size:
            comm.recv(out.data.ptr, out.size, self._codes(out.dtype), peer, self._stream.ptr)
        self._end()
        return out
