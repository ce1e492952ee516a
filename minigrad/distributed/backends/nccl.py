"""The ``"nccl"`` backend: collectives on CuPy arrays with ``cupy.cuda.nccl``.

The communicator is created lazily at a group's first GPU collective (all members make that call
together): the group's first member creates the unique id and shares it through the store.
Fingerprints and shapes travel over the group's host transport (a header-only exchange of the cpu
backend, tens of microseconds), so mismatches raise on every rank and receivers learn shapes, and
NCCL only ever sees matching calls. NCCL runs on a dedicated stream that first waits for the
caller's current stream; synchronous calls make the current stream wait for the result, and
:meth:`all_reduce_async` returns a Work holding a CUDA event, so gradient all-reduce overlaps the
rest of backward. CuPy is imported only here, on first use: CPU-only installs never touch it.
"""

from __future__ import annotations

import json
from typing import Any

from minigrad.backend.xp import cupy_or_none
from minigrad.distributed.backends import CollectiveError, Work, fingerprint


def _nccl_module():
    cp = cupy_or_none()
    if cp is None:
        return None
    try:
        from cupy.cuda import nccl  # noqa: PLC0415  (optional dependency)
    except Exception:
        return None
    return nccl if getattr(nccl, "available", True) else None


def is_available() -> bool:
    """CuPy with NCCL bindings and at least one CUDA device."""
    nccl = _nccl_module()
    if nccl is None:
        return False
    try:
        return cupy_or_none().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _dtype_code(nccl, dtype) -> int:
    table = {
        "float16": nccl.NCCL_FLOAT16,
        "float32": nccl.NCCL_FLOAT32,
        "float64": nccl.NCCL_FLOAT64,
        "int8": nccl.NCCL_INT8,
        "uint8": nccl.NCCL_UINT8,
        "bool": nccl.NCCL_UINT8,
        "int32": nccl.NCCL_INT32,
        "int64": nccl.NCCL_INT64,
    }
    name = str(dtype)
    if name not in table:
        raise TypeError(f"nccl backend: dtype {name} is not supported")
    return table[name]


def _op_code(nccl, op: str, dtype) -> int:
    if str(dtype) == "bool" and op == "sum":
        op = "max"  # NumPy's bool sum is logical or
    return {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}[op]


def _meta(a) -> list | None:
    return None if a is None else [list(a.shape), a.dtype.str]


class NcclBackend:
    """NCCL collectives for one group; same method signatures as ``CpuBackend``."""

    name = "nccl"

    def __init__(self, ctx):
        self.ctx = ctx
        self.nccl = _nccl_module()
        if self.nccl is None:
            raise CollectiveError(
                f"rank {ctx.rank}: the nccl backend needs CuPy built with NCCL "
                f"(pip install -e '.[cuda12]')"
            )
        self.cp = cupy_or_none()
        self.host = ctx.backend("cpu")  # fingerprints, shapes and barriers
        self._comm = None
        self._stream = None
        self._device = None

    # --- setup
    def _communicator(self):
        if self._comm is None:
            cp, ctx = self.cp, self.ctx
            key = f"{ctx.prefix}/nccl-id"
            if ctx.index == 0:
                ctx.client.set(key, [int(v) for v in self.nccl.get_unique_id()])
            uid = tuple(ctx.client.get(key, timeout=ctx.timeout))
            self._device = cp.cuda.Device()
            self._comm = self.nccl.NcclCommunicator(len(ctx.ranks), uid, ctx.index)
            self._stream = cp.cuda.Stream(non_blocking=True)
        return self._comm

    def close(self) -> None:
        if self._comm is not None:
            try:
                self._comm.destroy()
            except Exception:
                pass
            self._comm = None

    def _begin(self, fp: dict, on_headers=None):
        """Exchange fingerprints over the host transport, then order NCCL after the caller."""
        self.host.flush()
        self.host._run(fp, [None] * len(self.ctx.ranks), on_headers)
        comm = self._communicator()
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.cp.cuda.get_current_stream())
        self._stream.wait_event(ev)
        return comm

    def _end(self) -> Any:
        """Make the caller's stream wait for the NCCL stream; return the event."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self._stream)
        self.cp.cuda.get_current_stream().wait_event(ev)
        return ev

    # --- collectives
    def all_reduce(self, x, op: str = "sum", seq: int = 0):
        out, _ = self._all_reduce(x, op, seq)
        return out

    def _all_reduce(self, x, op, seq):
        cp, nccl = self.cp, self.nccl
        x = cp.ascontiguousarray(x)
        fp = fingerprint("all_reduce", seq, None, [list(x.shape), x.dtype.str, op])
        comm = self._begin(fp)
        out = cp.empty_like(x)
        if x.size:
            comm.allReduce(
                x.data.ptr, out.data.ptr, x.size, _dtype_code(nccl, x.dtype),
                _op_code(nccl, op, x.dtype), self._stream.ptr,
            )
        return out, self._end()

    def all_reduce_async(self, x, op: str, seq: int, donate: bool = False) -> Work:
        out, ev = self._all_reduce(x, op, seq)
        keep = (x, out)  # inputs stay alive until the caller waited

        def wait():
            self.cp.cuda.get_current_stream().wait_event(ev)
            return keep[1]

        return Work(wait, lambda: bool(ev.done))

    def broadcast(self, x, root_index: int, seq: int = 0):
        cp, nccl, me = self.cp, self.nccl, self.ctx.index
        root = self.ctx.ranks[root_index]
        box = {}
        if me == root_index:
            x = cp.ascontiguousarray(x)
            fp = dict(fingerprint("broadcast", seq, root), meta=_meta(x))
        else:
            fp = fingerprint("broadcast", seq, root)

        def on_headers(headers):
            shape, dt = headers[root_index]["meta"]
            box["out"] = cp.empty(shape, dtype=dt)

        comm = self._begin(fp, on_headers)
        out = box["out"]
        src = x if me == root_index else out
        if out.size:
            comm.broadcast(
                src.data.ptr, out.data.ptr, out.size, _dtype_code(nccl, out.dtype), root_index,
                self._stream.ptr,
            )
        self._end()
        return out

    def _p2p_group(self, comm, sends: dict, recvs: dict) -> None:
        """Issue grouped NCCL sends/recvs: ``sends``/``recvs`` map group index -> array."""
        nccl, s = self.nccl, self._stream.ptr
        nccl.groupStart()
        try:
            for j, a in sends.items():
                if a.size:
                    comm.send(a.data.ptr, a.size, _dtype_code(nccl, a.dtype), j, s)
            for j, a in recvs.items():
                if a.size:
                    comm.recv(a.data.ptr, a.size, _dtype_code(nccl, a.dtype), j, s)
        finally:
            nccl.groupEnd()

    def _exchange(self, op, seq, root, sig, sends: list):
        """Header exchange then grouped send/recv; returns arrays received (per source)."""
        cp, me, n = self.cp, self.ctx.index, len(self.ctx.ranks)
        sends = [None if a is None else cp.ascontiguousarray(a) for a in sends]
        fp = dict(fingerprint(op, seq, root, sig), meta=[_meta(a) for a in sends])
        outs: list = [None] * n

        def on_headers(headers):
            for src, h in enumerate(headers):
                m = h["meta"][me]
                if m is not None:
                    outs[src] = cp.empty(m[0], dtype=m[1])

        comm = self._begin(fp, on_headers)
        if sends[me] is not None:
            outs[me][...] = sends[me]
        self._p2p_group(
            comm,
            {j: a for j, a in enumerate(sends) if a is not None and j != me},
            {j: a for j, a in enumerate(outs) if a is not None and j != me},
        )
        self._end()
        return outs

    def all_gather(self, x, seq: int = 0) -> list:
        n = len(self.ctx.ranks)
        return self._exchange("all_gather", seq, None, x.dtype.str, [x] * n)

    def gather(self, x, root_index: int, seq: int = 0):
        n, me = len(self.ctx.ranks), self.ctx.index
        sends = [x if j == root_index else None for j in range(n)]
        outs = self._exchange("gather", seq, self.ctx.ranks[root_index], x.dtype.str, sends)
        return outs if me == root_index else None

    def scatter(self, chunks, root_index: int, seq: int = 0):
        n, me = len(self.ctx.ranks), self.ctx.index
        root = self.ctx.ranks[root_index]
        if me == root_index:
            if chunks is None or len(chunks) != n:
                raise ValueError(f"scatter: root rank {root} must pass {n} chunks")
            sends = list(chunks)
        else:
            sends = [None] * n
        return self._exchange("scatter", seq, root, None, sends)[root_index]

    def reduce(self, x, op: str, root_index: int, seq: int = 0):
        cp, nccl, me = self.cp, self.nccl, self.ctx.index
        x = cp.ascontiguousarray(x)
        root = self.ctx.ranks[root_index]
        comm = self._begin(fingerprint("reduce", seq, root, [list(x.shape), x.dtype.str, op]))
        out = cp.empty_like(x)
        if x.size:
            comm.reduce(
                x.data.ptr, out.data.ptr, x.size, _dtype_code(nccl, x.dtype),
                _op_code(nccl, op, x.dtype), root_index, self._stream.ptr,
            )
        self._end()
        return out if me == root_index else None

    def reduce_scatter(self, chunks: list, op: str, seq: int = 0):
        cp, nccl, me, n = self.cp, self.nccl, self.ctx.index, len(self.ctx.ranks)
        if len(chunks) != n:
            raise ValueError(f"reduce_scatter: expected {n} chunks, got {len(chunks)}")
        chunks = [cp.ascontiguousarray(c) for c in chunks]
        sig = [[_meta(c) for c in chunks], op]
        comm = self._begin(fingerprint("reduce_scatter", seq, None, sig))
        dt = _dtype_code(nccl, chunks[0].dtype)
        code = _op_code(nccl, op, chunks[0].dtype)
        if len({c.shape for c in chunks}) == 1:
            flat = cp.concatenate([c.reshape(-1) for c in chunks])
            out = cp.empty_like(chunks[me])
            if out.size:
                comm.reduceScatter(
                    flat.data.ptr, out.data.ptr, out.size, dt, code, self._stream.ptr
                )
        else:  # ragged chunks: one reduce per destination, grouped
            out = cp.empty_like(chunks[me])
            nccl.groupStart()
            try:
                for j, c in enumerate(chunks):
                    if c.size:
                        recv = out if j == me else c
                        comm.reduce(
                            c.data.ptr, recv.data.ptr, c.size, dt, code, j, self._stream.ptr
                        )
            finally:
                nccl.groupEnd()
        self._end()
        return out

    def all_to_all(self, chunks: list, seq: int = 0) -> list:
        n = len(self.ctx.ranks)
        if len(chunks) != n:
            raise ValueError(f"all_to_all: expected {n} chunks, got {len(chunks)}")
        return self._exchange("all_to_all", seq, None, chunks[0].dtype.str, list(chunks))

    def barrier(self, seq: int = 0) -> None:
        self.host.barrier(seq)

    # --- point-to-point (global ranks; headers over the host p2p channel)
    def send(self, x, dst: int) -> None:
        import numpy as np

        from minigrad.distributed.group import get_p2p

        cp = self.cp
        x = cp.ascontiguousarray(x)
        comm = self._communicator()
        meta = json.dumps(_meta(x)).encode()
        get_p2p().send(np.frombuffer(meta, np.uint8), dst)  # shape/dtype ride the host channel
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(cp.cuda.get_current_stream())
        self._stream.wait_event(ev)
        if x.size:
            comm.send(x.data.ptr, x.size, _dtype_code(self.nccl, x.dtype), dst, self._stream.ptr)
        self._end()

    def recv(self, src: int):
        import numpy as np

        from minigrad.distributed.group import get_p2p

        cp = self.cp
        comm = self._communicator()
        shape, dtype = json.loads(get_p2p().recv(src).tobytes())
        out = cp.empty(shape, dtype=np.dtype(dtype))
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(cp.cuda.get_current_stream())
        self._stream.wait_event(ev)
        if out.size:
            dt = _dtype_code(self.nccl, out.dtype)
            comm.recv(out.data.ptr, out.size, dt, src, self._stream.ptr)
        self._end()
        return out
