"""The ``"nccl"`` backend: collectives and messages on CuPy arrays with ``cupy.cuda.nccl``.

Calls are agreed on first: fingerprints and shapes travel over the group's host transport (a
header-only exchange of the cpu backend, tens of microseconds), so mismatches raise on every rank,
receivers learn shapes, and NCCL only ever sees matching calls.

Streams: each NCCL communicator runs on a stream of its own (as PyTorch does). Inputs are prepared
(packed, made contiguous) on the caller's current stream *before* the backend records an event there
that the NCCL stream waits on, so NCCL never reads a buffer before it is filled. After the NCCL
kernels the backend records an "end" event of that call (one per call, never shared between threads:
a background ``isend`` must not replace the event a collective's caller waits on); a synchronous
call (:meth:`run`) makes the caller's stream wait on it, an asynchronous one (:meth:`submit`)
returns a :class:`Work` whose ``wait()`` does - so gradient all-reduce overlaps the rest of
backward. Neither blocks the host. Until then the Work also keeps alive every array NCCL reads or
writes (the inputs, contiguous copies of them, the packed buffer of ``reduce_scatter``): freed
earlier, CuPy's pool would hand their memory to the caller's next allocation while NCCL still
reads it.

Communicators: a group's communicator is created at its first collective, which all members make
together (the first member creates the unique id and shares it through the store). Point-to-point
messages use one two-rank communicator per *direction* of a pair (``src -> dst``), created by the
two peers at the first message that way, so a send never needs ranks that do not take part in it.

Order rule (why one stream per communicator, and one communicator per direction): NCCL runs the
kernels of one stream in the order they were enqueued, and a collective or a send/recv completes
only when every member enqueued its part. Collectives are enqueued by the calling thread in the
order the header exchange agreed on; messages ``src -> dst`` by the sender's send thread and the
receiver's receive thread, both in message order. So every communicator receives its calls in the
same order on all its members, and calls on different communicators (a collective, a send, a
receive issued from different threads) never queue behind one another: with one shared stream,
rank 0 could enqueue a collective before a send while rank 1 enqueues the receive first, and both
would wait forever. CuPy is imported only here, on first use.
"""

from __future__ import annotations

import threading
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


class _PendingCall:
    """What one call left on NCCL streams: the event recorded after its kernels (None when it
    enqueued none) and the arrays those kernels read or write, kept alive until the caller's stream
    waited on the event."""

    __slots__ = ("event", "arrays")

    def __init__(self):
        self.event = None
        self.arrays: list = []


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
        self._pairs: dict[tuple[int, bool], Any] = {}  # (peer, sending) -> communicator
        self._streams: dict[int, Any] = {}  # id(communicator) -> the stream NCCL runs it on
        self._calls = threading.local()  # .current: the _PendingCall this thread is making

    # --- setup
    def _new_communicator(self, n: int, key: str, creator: bool, rank: int):
        ctx = self.ctx
        if creator:
            ctx.client.set(key, unique_id_to_wire(self.nccl.get_unique_id()))
        uid = unique_id_from_wire(ctx.client.get(key, timeout=ctx.timeout))
        comm = self.nccl.NcclCommunicator(n, uid, rank)
        self._streams[id(comm)] = self.cp.cuda.Stream(non_blocking=True)
        return comm

    def _communicator(self):
        if self._comm is None:
            ctx = self.ctx
            self._comm = self._new_communicator(
                len(ctx.ranks), f"{ctx.prefix}/nccl-id", ctx.rank == 0, ctx.rank
            )
        return self._comm

    def _pair(self, peer: int, sending: bool):
        """The two-rank communicator of the messages from this rank to global rank ``peer``
        (``sending``) or from ``peer`` to this rank, and the peer's index in it (the sender is 0,
        the receiver 1; the sender creates it)."""
        me = self.ctx.global_rank
        src, dst = (me, peer) if sending else (peer, me)
        comm = self._pairs.get((peer, sending))
        if comm is None:
            key = f"{self.ctx.prefix}/nccl-pair/{src}-{dst}"
            comm = self._new_communicator(2, key, sending, int(not sending))
            self._pairs[(peer, sending)] = comm
        return comm, int(sending)

    def _stream(self, comm):
        """The stream NCCL runs ``comm``'s calls on (one per communicator)."""
        return self._streams[id(comm)]

    def close(self) -> None:
        super().close()
        for comm in [self._comm, *self._pairs.values()]:
            if comm is not None:
                comm.destroy()
        self._comm, self._pairs, self._streams = None, {}, {}

    # --- stream ordering
    def _after_caller(self, comm) -> None:
        """Make ``comm``'s stream wait for everything queued on the caller's stream so far."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.cp.cuda.get_current_stream())
        self._stream(comm).wait_event(ev)

    def _begin(self, fp: dict, on_headers=None):
        self.host.exchange_headers(dict(fp, backend=self.name), on_headers)
        comm = self._communicator()
        self._after_caller(comm)
        return comm

    def _end(self, comm, *used) -> None:
        """Record the end event of this thread's call after its kernels on ``comm``'s stream, and
        keep the arrays ``used`` by those kernels alive until the caller's stream waited on it."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self._stream(comm))
        call = getattr(self._calls, "current", None)
        if call is not None:
            call.event = ev
            call.arrays.extend(a for a in used if a is not None)

    def _enqueue(self, fn) -> tuple[Any, _PendingCall]:
        """Run ``fn`` on this rank's GPU, collecting its end event and the arrays it uses."""
        call, outer = _PendingCall(), getattr(self._calls, "current", None)
        self._calls.current = call
        try:
            with self._device:
                return fn(), call
        finally:
            self._calls.current = outer

    def run(self, fn):
        """Run ``fn`` now; the caller's stream then waits for its NCCL kernels (not the host)."""
        out, call = self._enqueue(fn)
        if call.event is not None:
            with self._device:
                self.cp.cuda.get_current_stream().wait_event(call.event)
        return out

    def submit(self, fn) -> Work:
        """Enqueue ``fn``'s NCCL kernels; ``Work.wait()`` makes the caller's stream wait (the
        arrays NCCL uses stay alive until then)."""
        out, call = self._enqueue(fn)
        if call.event is None:
            return Work.ready(out)
        ev = call.event

        def wait():
            with self._device:
                self.cp.cuda.get_current_stream().wait_event(ev)
            call.arrays.clear()  # the caller's stream now follows NCCL: reusing them is safe
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
    def all_reduce(self, x, op: ReduceOp, seq: int, check: str | None = None) -> None:
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        comm = self._begin(fingerprint("all_reduce", seq, None, sig, check))
        if x.size:
            dt, code = self._codes(x.dtype, op)
            comm.allReduce(x.data.ptr, x.data.ptr, x.size, dt, code, self._stream(comm).ptr)
        self._end(comm, x)

    def broadcast(self, x, root: int, seq: int, check: str | None = None):
        ranks = self.ctx.ranks
        box = {"out": x}
        fp = dict(fingerprint("broadcast", seq, ranks[root], None, check), meta=array_meta(x))

        def on_headers(headers):
            check_broadcast_buffers(headers, root, ranks, seq)
            if box["out"] is None:
                shape, dt = headers[root]["meta"]
                box["out"] = self.cp.empty(shape, dtype=dt)

        comm = self._begin(fp, on_headers)
        out = box["out"]
        if out.size:
            ptr = out.data.ptr
            s = self._stream(comm).ptr
            comm.broadcast(ptr, ptr, out.size, self._codes(out.dtype), root, s)
        self._end(comm, out)
        return out

    def reduce(self, x, op: ReduceOp, root: int, seq: int, check: str | None = None) -> None:
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        comm = self._begin(fingerprint("reduce", seq, self.ctx.ranks[root], sig, check))
        if x.size:
            dt, code = self._codes(x.dtype, op)
            comm.reduce(x.data.ptr, x.data.ptr, x.size, dt, code, root, self._stream(comm).ptr)
        self._end(comm, x)

    def all_gather_into(self, x, out, seq: int, check: str | None = None) -> None:
        """``ncclAllGather`` of ``x`` straight into ``out`` (flat, ``n * x.size`` elements), on
        the NCCL stream like every collective here."""
        sig = [dtype_name(x.dtype), int(x.size)]
        comm = self._begin(fingerprint("all_gather_into", seq, None, sig, check))
        if x.size:
            comm.allGather(x.data.ptr, out.data.ptr, x.size, self._codes(x.dtype),
                           self._stream(comm).ptr)
        self._end(comm, x, out)

    def _grouped(self, comm, sends: dict, recvs: dict) -> None:
        """Grouped NCCL sends/recvs: ``sends``/``recvs`` map peer index -> array."""
        nccl, s = self.nccl, self._stream(comm).ptr
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

    def exchange(self, fp: dict, sends: list) -> list:
        """Header exchange, then grouped send/recv; returns the arrays received (per source)."""
        cp, me = self.cp, self.ctx.rank
        outs: list = [None] * len(self.ctx.ranks)

        def on_headers(headers):
            for src, h in enumerate(headers):
                m = h["meta"][me]
                if m is not None:
                    outs[src] = cp.empty(m[0], dtype=m[1])

        comm = self._begin(fp, on_headers)
        if sends[me] is not None:
            with self._stream(comm):  # the copy to itself, ordered like the NCCL kernels
                outs[me][...] = sends[me]
        self._grouped(
            comm,
            {j: a for j, a in enumerate(sends) if a is not None and j != me},
            {j: a for j, a in enumerate(outs) if a is not None and j != me},
        )
        self._end(comm, *sends, *outs)
        return outs

    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int, check: str | None = None):
        cp, me = self.cp, self.ctx.rank
        fp = fingerprint("reduce_scatter", seq, None, [[array_meta(c) for c in chunks], op.value],
                         check)
        dt, code = self._codes(chunks[0].dtype, op)
        out = cp.empty_like(chunks[me])
        if len({c.shape for c in chunks}) == 1:
            # packed on the caller's stream, *before* _begin orders the NCCL stream after it
            flat = FlatBuffer.of(chunks, xp=cp).data
            comm = self._begin(fp)
            if out.size:
                comm.reduceScatter(flat.data.ptr, out.data.ptr, out.size, dt, code,
                                   self._stream(comm).ptr)
            self._end(comm, flat, out)  # the packed copy too: NCCL reads it after we return
            return out
        comm = self._begin(fp)
        s = self._stream(comm).ptr
        self.nccl.groupStart()  # ragged chunks: one reduce per destination, grouped
        try:
            for j, c in enumerate(chunks):
                if c.size:
                    dst = out if j == me else c
                    comm.reduce(c.data.ptr, dst.data.ptr, c.size, dt, code, j, s)
        finally:
            self.nccl.groupEnd()
        self._end(comm, *chunks, out)
        return out

    def barrier(self, seq: int, check: str | None = None) -> None:
        self.host.barrier(seq, check)

    # --- point to point: the header goes over the host channel, the payload over a pair comm
    def send(self, x, dst: int, header: dict) -> None:
        channel = self.ctx.backend(self.ctx.host_route)
        channel.send(None, dst, dict(header, via="nccl", meta=array_meta(x)))
        comm, peer = self._pair(dst, sending=True)
        self._after_caller(comm)
        if x.size:
            comm.send(x.data.ptr, x.size, self._codes(x.dtype), peer, self._stream(comm).ptr)
        self._end(comm, x)

    def recv(self, src: int):
        header, y = self.ctx.backend(self.ctx.host_route).recv(src)
        if header.get("via") == "nccl":
            y = self.recv_payload(src, header)
        return header, y

    def recv_payload(self, src: int, header: dict):
        """The CuPy payload announced by ``header`` (received on the host channel)."""
        shape, dtype = header["meta"]
        out = self.cp.empty(shape, dtype=np.dtype(dtype))
        comm, peer = self._pair(src, sending=False)
        self._after_caller(comm)
        if out.size:
            comm.recv(out.data.ptr, out.size, self._codes(out.dtype), peer,
                      self._stream(comm).ptr)
        self._end(comm, out)
        return out
