"""The ``"mpi"`` backend: collectives and messages through MPI (``mpi4py``; ``pip install -e
".[mpi]"`` brings mpi4py and the MPICH library).

Use it where MPI is how jobs start (``mpiexec -n 4 python train.py``, Slurm's ``srun``): the
process group's ranks are ``MPI_COMM_WORLD``'s, the WORLD group talks on a duplicate of it and each
sub-group on a communicator made with ``MPI_Comm_create_group`` by its members only.

Every call first agrees on its fingerprint: each member contributes a fixed-size JSON header
(:data:`HEADER_SLOT` bytes; longer ones follow in a second round) to one small ``Iallgather``, which
also tells receivers the shapes they are about to get; mismatched calls raise on every rank with
the same message as the other backends. Data then moves with the matching nonblocking MPI
collective, whose request is polled by the same :class:`~.waiting.Waiter` and watchdog as the cpu
backend's waits, so MPI calls get the same warning and timeout (a blocking MPI call could never time
out). MPI cannot tell which ranks have not arrived: a rank that waits for more than
:data:`PUBLISH_AFTER` seconds records its position in the store, and the watchdog names the members
that have not recorded reaching this call.

Reductions use MPI's own (``float16``, which MPI lacks, is reduced in float32). With more than two
ranks MPI does not promise the same summation order on every rank, so float results may differ in
the last bit between ranks (the cpu backend's are bitwise identical). CuPy arrays are passed to MPI
directly when the library is CUDA-aware (:func:`cuda_aware`), otherwise staged through host memory.
"""

from __future__ import annotations

import ctypes
import json
import math

import numpy as np

from minigrad.distributed.comm.flat_buffer import FlatBuffer
from minigrad.distributed.comm.providers import base
from minigrad.distributed.comm.providers.base import (
    BOOL_AS_BYTES_OPS,
    Backend,
    CollectiveError,
    ReduceOp,
    array_meta,
    as_bytes,
    dtype_name,
)
from minigrad.distributed.comm.providers.waiting import Waiter, Watchdog
from minigrad.distributed.runtime.store import StoreTimeout
from minigrad.distributed.runtime.wire import encode_header

HEADER_SLOT = 512  # bytes per member in the header round: fits the headers of most calls
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

    def close(self) -> None:
        super().close()
        self.comm.Free()

    # --- waiting
    def _what(self, fp: dict):
        """The description of a call for the watchdog's messages (built only when needed)."""
        return lambda: f"{base.describe(fp)} in group {self.ctx.ranks} (backend mpi)"

    def _wait(self, request, what, seq: int) -> None:
        """Poll ``request`` until it completes, under the group's watchdog."""
        for _ in range(QUICK_POLLS):
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
        except BaseException:
            ctx.broken = True  # the request may still be pending: the communicator is unusable
            raise

    def _agree(self, fp: dict) -> list[dict]:
        """Every member's header (fingerprint + metadata), checked: one small Iallgather.

        A header is JSON padded with zero bytes to :data:`HEADER_SLOT`; a longer one is sent as
        ``#<length>`` and follows in a second, sized round that every member then joins.
        """
        ctx, n = self.ctx, len(self.ctx.ranks)
        what = self._what(fp)
        raw = encode_header(fp)
        fits = len(raw) <= HEADER_SLOT
        mine = (raw if fits else b"#%d" % len(raw)).ljust(HEADER_SLOT, b"\0")
        slots = np.empty(n * HEADER_SLOT, np.uint8)
        self._wait(self.comm.Iallgather(np.frombuffer(mine, np.uint8), slots), what, fp["seq"])
        got = slots.tobytes()
        if fits and got == mine * n:  # the usual case: every member sent this very header
            return [fp] * n
        blobs = [got[j * HEADER_SLOT : (j + 1) * HEADER_SLOT].rstrip(b"\0") for j in range(n)]
        if any(b.startswith(b"#") for b in blobs):
            blobs = self._long_headers(raw, blobs, what, fp["seq"])
        headers = [json.loads(b) for b in blobs]
        base.check_fingerprints(headers, ctx.ranks)
        return headers

    def _long_headers(self, raw: bytes, blobs: list[bytes], what, seq: int) -> list[bytes]:
        lengths = [int(b[1:]) if b.startswith(b"#") else len(b) for b in blobs]
        flat = np.empty(sum(lengths), np.uint8)
        displs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        request = self.comm.Iallgatherv(
            np.frombuffer(raw, np.uint8), [flat, lengths, displs, self.MPI.BYTE]
        )
        self._wait(request, what, seq)
        return [flat[d : d + m].tobytes() for d, m in zip(displs, lengths)]

    def _typed(self, x, op: ReduceOp):
        """``(buffer spec, MPI op)`` for a reduction on ``x`` (float16 is handled by the caller)."""
        name = dtype_name(x.dtype)
        if name not in _MPI_TYPES:
            raise TypeError(f"mpi backend: dtype {name} is not supported")
        if name == "bool":
            op = BOOL_AS_BYTES_OPS.get(op, op)
            x = x.view(np.uint8)
        MPI = self.MPI
        return [x, getattr(MPI, _MPI_TYPES[name])], getattr(MPI, _MPI_OPS[op])

    def _reduction(self, kind: str, x, op: ReduceOp, seq: int, root: int | None,
                   check: str | None) -> None:
        sig = [list(x.shape), dtype_name(x.dtype), op.value]
        rank_root = None if root is None else self.ctx.ranks[root]
        fp = base.fingerprint(kind, seq, rank_root, sig, check)
        self._agree(fp)
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
        self._agree(base.fingerprint("barrier", seq, None, None, check))

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
