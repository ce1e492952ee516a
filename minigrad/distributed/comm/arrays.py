"""Array-level collectives and point-to-point messages: the one implementation behind every API.

The PyTorch/OneFlow functions on ``minigrad.distributed`` (:mod:`.collectives`), MegEngine's
differentiable ``dist.functional`` and the data-parallel helpers all call these functions, so they
share one set of conventions:

* arrays are NumPy or CuPy (any dtype of :data:`DTYPES`, native byte order);
* ``group=None`` is WORLD; ``root``/``src``/``dst`` are *global* ranks, and a missing root is the
  group's first rank (its rank 0);
* ``op`` is a :class:`ReduceOp` or its name (``"sum"``, ``"avg"``, ``"product"``, ``"min"``,
  ``"max"``);
* like PyTorch, ``all_reduce``, ``broadcast`` (given a buffer), ``reduce`` (on the root) and
  ``recv(out=...)`` work in place and return the array they filled; the others return new arrays;
* ``async_op=True`` returns a :class:`Work` whose ``wait()`` returns what the call would have;
  the array must not be touched until then. Calls of a group run in the order they were issued;
* ``check`` (a string, optional) becomes part of the fingerprint the members compare before any
  data moves: ranks that pass different strings raise :class:`CollectiveMismatchError` on every
  rank, naming each rank's string (``exc.calls[j]["check"]``);
* errors name the op, the rank and the values, with dtypes spelled ``float32``.

The ``*_along`` functions are the same collectives on one array cut along an axis (what tensor
and sequence parallelism and global tensors need): :func:`split_along`, :func:`all_gather_along`,
:func:`reduce_scatter_along`, :func:`all_to_all_along`.

The backend comes from :func:`~minigrad.distributed.comm.providers.choose_backend` (the group's
setting and the array's kind); CuPy arrays given to a host backend are staged through host memory
here. Point-to-point: the sender's array kind picks the route, the receiver follows the header the
sender sent on the host channel, so both ends always agree.

Example::

    x = np.ones(3, np.float32)
    comm.all_reduce(x)                                        # x is now [n, n, n] on every rank
    parts = comm.all_gather(np.arange(dist.get_rank() + 1))   # shapes may differ per rank
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from minigrad.backend.device import as_device, get_default_device_obj
from minigrad.backend.xp import cupy_or_none, get_array_module, is_cupy_array, on_device_of
from minigrad.distributed.comm import recorder
from minigrad.distributed.comm.group import (
    WORLD,
    Group,
    GroupContext,
    get_rank,
    get_world_size,
    is_distributed,
    resolve_group,
)
from minigrad.distributed.comm.providers.base import (
    CollectiveError,
    ReduceOp,
    Work,
    contiguous,
    divide_by_count,
    dtype_name,
)

DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")

__all__ = [
    "DTYPES",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_along",
    "all_gather_into",
    "all_reduce",
    "all_to_all",
    "all_to_all_along",
    "barrier",
    "broadcast",
    "gather",
    "group_barrier",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_along",
    "scatter",
    "send",
    "shared_empty",
    "split_along",
]


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (never imports CuPy)."""
    return is_cupy_array(x)


def check_array(where: str, x: Any) -> None:
    """Raise a clear TypeError unless ``x`` is a NumPy/CuPy array of a supported dtype."""
    if type(x) is np.ndarray and x.dtype in _HOST_DTYPES:  # the common case, on every call's path
        return
    if not isinstance(x, np.ndarray) and not is_cupy(x):
        raise TypeError(f"{where}: expected a NumPy or CuPy array, got {type(x).__name__}")
    name = dtype_name(x.dtype)
    if name not in DTYPES:
        raise TypeError(f"{where}: dtype {name} is not supported (supported: {', '.join(DTYPES)})")
    if not x.dtype.isnative:
        raise TypeError(
            f"{where}: {name} array in non-native byte order; convert it with "
            f"x.astype(x.dtype.newbyteorder('='))"
        )


#: the dtypes of host arrays that need no further check (native byte order only)
_HOST_DTYPES = frozenset(np.dtype(name) for name in DTYPES)
_HOST_CONTEXT = on_device_of(None)  # what on_device_of gives for host arrays: no device switch


def _default_is_gpu() -> bool:
    return get_default_device_obj().is_gpu


class _Call:
    """One call: its group context, the backend chosen for the array kind, the sequence number, and
    host staging of CuPy arrays for backends that cannot read device memory."""

    def __init__(self, name: str, group: Group | None, arrays: list, root: int | None = None,
                 on_gpu: bool | None = None, backend: str | None = None, async_op: bool = False,
                 check: str | None = None):
        if check is not None and not isinstance(check, str):
            raise TypeError(f"{name}: check must be a string or None, got {type(check).__name__}")
        self.name, self.check = name, check
        self.group = resolve_group(group)
        self.ctx: GroupContext = self.group.context()
        host = True  # every array is a NumPy array of a supported dtype in native byte order
        for a in arrays:
            if type(a) is not np.ndarray or a.dtype not in _HOST_DTYPES:
                check_array(name, a)
                host = False
        ranks = self.ctx.ranks
        if root is None:
            self.root, self.root_index = ranks[0], 0
        else:
            if root not in ranks:
                raise ValueError(f"{name}: root rank {root} is not in group {ranks}")
            self.root = int(root)
            self.root_index = ranks.index(self.root)
        self.is_root = self.ctx.rank == self.root_index
        if on_gpu is None:
            on_gpu = (not host and is_cupy(arrays[0])) if arrays else _default_is_gpu()
        self.on_gpu = on_gpu
        self.backend = self.ctx.backend(backend or self.ctx.route(on_gpu))
        self.stage = on_gpu and not self.backend.accepts_gpu_arrays
        # staged results go back to the inputs' GPU (CuPy would put them on the current one)
        self.on_device = _HOST_CONTEXT if host else on_device_of(arrays[0] if arrays else None)
        self.ctx.flush(keep=self.backend if async_op else None)
        self.seq = self.ctx.next_seq()
        self.record = recorder.begin(name, ranks, self.seq, arrays, self.backend.name)

    def buffer(self, x):
        """A C-contiguous array the backend can read and write, standing for ``x``."""
        return cupy_or_none().asnumpy(x) if self.stage else contiguous(x)

    def write_back(self, x, buf) -> None:
        """Make ``x`` hold ``buf``'s values when the backend worked on a copy."""
        if buf is not x:
            with self.on_device:
                x[...] = get_array_module(x).asarray(buf)

    def output(self, y):
        """A result array, moved back to the GPU when it was staged."""
        if not self.stage or y is None:
            return y
        with self.on_device:
            return cupy_or_none().asarray(y)

    def execute(self, body: Callable[[], Any], finish: Callable[[Any], Any], async_op: bool):
        """Run ``body`` on the backend now or asynchronously; ``finish`` runs on this thread.
        The call's record (:mod:`.recorder`) gets its end time; a failure dumps the flight
        recorder."""
        record = self.record
        if not async_op:
            try:
                out = finish(self.backend.run(body))
            except CollectiveError as exc:
                recorder.on_failure(exc)
                raise
            recorder.finish(record)
            return out

        def done(result):
            try:
                out = finish(result)
            except CollectiveError as exc:
                recorder.on_failure(exc)
                raise
            recorder.finish(record)
            return out

        return self.backend.submit(body).then(done)


def _reduction_op(where: str, op, x) -> tuple[ReduceOp, ReduceOp]:
    """``(op, what the backend runs)``: AVG runs as SUM, divided afterwards."""
    op = ReduceOp.parse(op, where)
    if op is ReduceOp.AVG:
        if x is not None and x.dtype == np.bool_:
            raise TypeError(f"{where}: ReduceOp.AVG is not defined for bool arrays")
        return op, ReduceOp.SUM
    return op, op


def all_reduce(x, op=ReduceOp.SUM, group: Group | None = None, async_op: bool = False,
               backend: str | None = None, *, check: str | None = None):
    """Reduce ``x`` elementwise over the group's ranks, in place; returns ``x`` (or a Work).

    ``backend`` overrides the group's routing for this call (``make_allreduce_cb(backend=...)``).
    """
    if (type(x) is np.ndarray and not async_op and backend is None and x.dtype in _HOST_DTYPES
            and x.flags.c_contiguous):
        return _all_reduce_host(x, op, group, check)
    op, native = _reduction_op("all_reduce", op, x)
    c = _Call("all_reduce", group, [x], backend=backend, async_op=async_op, check=check)
    buf = c.buffer(x)
    if op is ReduceOp.AVG and c.backend.averages:
        native = op

    def finish(_):
        c.write_back(x, buf)
        if op is not native:
            divide_by_count(x, c.ctx.size)
        return x

    return c.execute(lambda: c.backend.all_reduce(buf, native, c.seq, c.check), finish, async_op)


def _all_reduce_host(x: np.ndarray, op, group: Group | None, check: str | None) -> np.ndarray:
    """:func:`all_reduce` of a C-contiguous NumPy array, waited for: the common case (small
    gradients, metrics, loss scales) with the per-call work cut to what it needs. Same checks,
    fingerprint, sequence number and flight-recorder record as the general path of :class:`_Call`.
    """
    if op is ReduceOp.SUM:
        native = op
    else:
        op, native = _reduction_op("all_reduce", op, x)
    if check is not None and not isinstance(check, str):
        raise TypeError(f"all_reduce: check must be a string or None, got {type(check).__name__}")
    ctx = (WORLD if group is None else group).context()
    be = ctx.host_backend()
    ctx.flush()  # every backend of the group, this one included (what Backend.run would do)
    seq = ctx.next_seq()
    record = recorder.begin("all_reduce", ctx.ranks, seq, (x,), be.name)
    if op is ReduceOp.AVG and be.averages:
        native = op
    try:
        be.all_reduce(x, native, seq, check)
    except CollectiveError as exc:
        recorder.on_failure(exc)
        raise
    if op is not native:
        divide_by_count(x, ctx.size)
    recorder.finish(record)
    return x


def shared_empty(count: int, dtype, group: Group | None = None) -> np.ndarray:
    """A new 1-D NumPy array of ``count`` elements that the group's collectives read in place on
    every member: on one host, an all-reduce of such arrays (each member passing its own, in the
    same call) copies nothing through exchange buffers; each member reduces its part of all of
    them and copies the others' parts (``providers/cpu/shared_heap.py``; PyTorch's "symmetric
    memory"). The data-parallel gradient buckets live in such arrays.

    Where the group has no shared memory (members on several hosts, the ``mpi`` backend, one
    member, not initialised, the heap or /dev/shm full) it is an ordinary ``np.empty`` array:
    every collective works on either kind, and members may mix them.

    Example::

        g = comm.shared_empty(1 << 20, "float32")
        g[:] = local_gradients
        comm.all_reduce(g, "avg")
    """
    dtype = np.dtype(dtype)
    count = int(count)
    if count < 0:
        raise ValueError(f"shared_empty: count must be >= 0, got {count}")
    if is_distributed():
        array = resolve_group(group).context().host_backend().shared_empty(count, dtype)
        if array is not None:
            return array
    return np.empty(count, dtype)


def broadcast(x, root: int | None = None, group: Group | None = None, async_op: bool = False, *,
              check: str | None = None):
    """Copy the root's array to every rank. Non-roots pass a buffer of the same shape and dtype
    (filled in place and returned) or None (a new array is returned, on the default device)."""
    c = _Call("broadcast", group, [] if x is None else [x], root=root, async_op=async_op,
              check=check)
    if c.is_root and x is None:
        raise ValueError(f"broadcast: the root rank {c.root} must pass an array, got None")
    buf = None if x is None else c.buffer(x)

    def finish(y):
        if x is None:
            return c.output(y)
        c.write_back(x, y)
        return x

    body = lambda: c.backend.broadcast(buf, c.root_index, c.seq, c.check)
    return c.execute(body, finish, async_op)


def reduce(x, op=ReduceOp.SUM, root: int | None = None, group: Group | None = None,
           async_op: bool = False, *, check: str | None = None):
    """Reduce ``x`` over the group into the root's ``x`` (in place); returns ``x`` on the root and
    None on the other ranks (whose ``x`` is unchanged)."""
    op, native = _reduction_op("reduce", op, x)
    c = _Call("reduce", group, [x], root=root, async_op=async_op, check=check)
    buf = c.buffer(x)

    def finish(_):
        if not c.is_root:
            return None
        c.write_back(x, buf)
        if op is ReduceOp.AVG:
            divide_by_count(x, c.ctx.size)
        return x

    body = lambda: c.backend.reduce(buf, native, c.root_index, c.seq, c.check)
    return c.execute(body, finish, async_op)


def all_gather(x, group: Group | None = None, async_op: bool = False, *,
               check: str | None = None):
    """Every rank's array, in group order, on every rank (shapes may differ per rank)."""
    c = _Call("all_gather", group, [x], async_op=async_op, check=check)
    buf = c.buffer(x)
    finish = lambda ys: [c.output(y) for y in ys]
    return c.execute(lambda: c.backend.all_gather(buf, c.seq, c.check), finish, async_op)


def all_gather_into(out, x, group: Group | None = None, async_op: bool = False, *,
                    check: str | None = None):
    """Every rank's ``x`` back to back in ``out``, in group order (PyTorch's
    ``all_gather_into_tensor``): ``out`` is C-contiguous with ``n * x.size`` elements of ``x``'s
    dtype, and every rank's ``x`` has the same size. Returns ``out`` (a Work when ``async_op``).

    Unlike :func:`all_gather` no array per rank is made: the pieces are written straight into
    ``out``, and on one host, when each rank's ``x`` comes from :func:`shared_empty`, each rank
    copies the others' ``x`` from their memory. ``x`` may be a view of ``out`` (gather in place).

    Example::

        full = np.empty(world * shard.size, shard.dtype)
        comm.all_gather_into(full, shard)
    """
    for a in (x, out):
        check_array("all_gather_into", a)
    n = resolve_group(group).size
    if dtype_name(out.dtype) != dtype_name(x.dtype) or out.size != n * x.size:
        raise ValueError(
            f"all_gather_into: out must hold {n} x {x.size} = {n * x.size} elements of "
            f"{dtype_name(x.dtype)} (the input on {n} ranks), got {out.size} of "
            f"{dtype_name(out.dtype)}")
    if not out.flags.c_contiguous or not getattr(out.flags, "writeable", True):  # CuPy: always
        raise ValueError("all_gather_into: out must be a writable C-contiguous array")
    c = _Call("all_gather_into", group, [x, out], async_op=async_op, check=check)
    buf, out_buf = c.buffer(x), c.buffer(out)  # out itself unless staged from the GPU

    def finish(_):
        c.write_back(out, out_buf)
        return out

    body = lambda: c.backend.all_gather_into(buf, out_buf.reshape(-1), c.seq, c.check)
    return c.execute(body, finish, async_op)


def gather(x, root: int | None = None, group: Group | None = None, async_op: bool = False, *,
           check: str | None = None):
    """All ranks' arrays (group order) on ``root``; None on the other ranks."""
    c = _Call("gather", group, [x], root=root, async_op=async_op, check=check)
    buf = c.buffer(x)
    finish = lambda ys: None if ys is None else [c.output(y) for y in ys]
    body = lambda: c.backend.gather(buf, c.root_index, c.seq, c.check)
    return c.execute(body, finish, async_op)


def scatter(chunks: list | None, root: int | None = None, group: Group | None = None,
            async_op: bool = False, *, check: str | None = None):
    """``root`` sends ``chunks[i]`` to the group's i-th rank; the others pass None (or anything:
    only the root's chunks are read)."""
    group_ranks = resolve_group(group).ranks
    is_root = get_rank() == (group_ranks[0] if root is None else root)
    arrays = list(chunks) if is_root and chunks is not None else []
    c = _Call("scatter", group, arrays, root=root, async_op=async_op, check=check)
    if c.is_root and (chunks is None or len(chunks) != c.ctx.size):
        got = None if chunks is None else f"{len(chunks)} chunks"
        raise ValueError(f"scatter: root rank {c.root} must pass {c.ctx.size} chunks, got {got}")
    bufs = [c.buffer(a) for a in arrays] if c.is_root else None
    body = lambda: c.backend.scatter(bufs, c.root_index, c.seq, c.check)
    return c.execute(body, c.output, async_op)


def _chunk_list(name: str, chunks, c: _Call) -> list:
    if len(chunks) != c.ctx.size:
        raise ValueError(
            f"{name}: expected {c.ctx.size} chunks (one per group member), got {len(chunks)}"
        )
    kinds = {dtype_name(a.dtype) for a in chunks}
    if len(kinds) > 1:
        raise TypeError(f"{name}: chunks must share one dtype, got {sorted(kinds)}")
    return [c.buffer(a) for a in chunks]


def reduce_scatter(chunks: list, op=ReduceOp.SUM, group: Group | None = None,
                   async_op: bool = False, *, check: str | None = None):
    """``chunks[i]`` reduced over the ranks lands on the group's i-th rank (a new array). Chunks
    may differ in shape from each other, as long as every rank passes the same shapes."""
    op, native = _reduction_op("reduce_scatter", op, chunks[0] if chunks else None)
    c = _Call("reduce_scatter", group, list(chunks), async_op=async_op, check=check)
    bufs = _chunk_list("reduce_scatter", chunks, c)

    def finish(y):
        if op is ReduceOp.AVG:
            divide_by_count(y, c.ctx.size)
        return c.output(y)

    body = lambda: c.backend.reduce_scatter(bufs, native, c.seq, c.check)
    return c.execute(body, finish, async_op)


def all_to_all(chunks: list, group: Group | None = None, async_op: bool = False, *,
               check: str | None = None):
    """``result[i]`` is the group's i-th rank's ``chunks[my index]`` (new arrays)."""
    c = _Call("all_to_all", group, list(chunks), async_op=async_op, check=check)
    bufs = _chunk_list("all_to_all", chunks, c)
    finish = lambda ys: [c.output(y) for y in ys]
    return c.execute(lambda: c.backend.all_to_all(bufs, c.seq, c.check), finish, async_op)


def barrier(group: Group | None = None, async_op: bool = False, *, check: str | None = None):
    """Block until every member of the group arrived (returns None, or a Work)."""
    c = _Call("barrier", group, [], on_gpu=False, async_op=async_op, check=check)
    return c.execute(lambda: c.backend.barrier(c.seq, c.check), lambda _: None, async_op)


def group_barrier(group: Group | None = None) -> None:
    """MegEngine's name for :func:`barrier`."""
    barrier(group)


# ------------------------------------------------------------------------------ along an axis


def _piece_sizes(where: str, x, axis: int, sizes, group: Group | None) -> list:
    """``sizes`` checked against ``x.shape[axis]``, or equal pieces, one per group member."""
    length = x.shape[axis]
    if sizes is None:
        n = resolve_group(group).size
        if length % n:
            raise ValueError(
                f"{where}: axis {axis} of size {length} is not divisible by the group size {n}"
            )
        return [length // n] * n
    sizes = [int(s) for s in sizes]
    if sum(sizes) != length or min(sizes, default=0) < 0:
        raise ValueError(
            f"{where}: piece sizes {sizes} do not add up to axis {axis} of size {length}"
        )
    return sizes


def split_along(x, axis: int, sizes: list) -> list:
    """``x`` cut along ``axis`` into consecutive pieces of ``sizes[i]`` elements, as C-contiguous
    arrays ready to send (the one cutting rule of every ``*_along`` collective)."""
    sizes = _piece_sizes("split_along", x, axis, sizes, None)
    pieces, start = [], 0
    for n in sizes:
        pieces.append(contiguous(x[(slice(None),) * axis + (slice(start, start + n),)]))
        start += n
    return pieces


def all_gather_along(x, axis: int, group: Group | None = None, *, with_sizes: bool = False,
                     check: str | None = None):
    """Every rank's ``x`` concatenated along ``axis`` in group order, on every rank (the pieces
    may differ in length along ``axis`` only). With ``with_sizes``, ``(result, sizes)``: each
    rank's length along ``axis``, which the adjoint reduce-scatter needs."""
    parts = all_gather(x, group, check=check)
    out = get_array_module(parts[0]).concatenate(parts, axis=axis)
    return (out, [p.shape[axis] for p in parts]) if with_sizes else out


def reduce_scatter_along(x, axis: int, group: Group | None = None, *, sizes: list | None = None,
                         op=ReduceOp.SUM, check: str | None = None):
    """``x`` reduced over the group and cut along ``axis``: the group's i-th rank gets piece i,
    ``sizes[i]`` long (equal pieces when ``sizes`` is None). Every rank passes the same shape."""
    sizes = _piece_sizes("reduce_scatter_along", x, axis, sizes, group)
    return reduce_scatter(split_along(x, axis, sizes), op, group, check=check)


def all_to_all_along(x, split_axis: int, concat_axis: int, group: Group | None = None, *,
                     sizes: list | None = None, check: str | None = None):
    """``x`` cut along ``split_axis`` (into ``sizes``, equal pieces when None), piece i sent to
    the group's i-th rank; the pieces received are concatenated along ``concat_axis`` in group
    order (they may differ in length along it)."""
    sizes = _piece_sizes("all_to_all_along", x, split_axis, sizes, group)
    parts = all_to_all(split_along(x, split_axis, sizes), group, check=check)
    return get_array_module(parts[0]).concatenate(parts, axis=concat_axis)


# ------------------------------------------------------------------------------ point to point


def _peer(where: str, peer: int, group: Group | None) -> GroupContext:
    n, me = get_world_size(), get_rank()
    if not 0 <= peer < n or (peer == me and n > 1):
        raise ValueError(
            f"{where}: peer rank must be another rank in [0, {n}), got {peer} on rank {me}"
        )
    if group is not None and peer not in group.ranks:
        raise ValueError(f"{where}: rank {peer} is not in group {group.ranks}")
    return WORLD.context()


def _send_now(x, dst: int, world: GroupContext, tag) -> Callable[[], None]:
    """Prepare a send on this thread (route, staging); return the transfer to run. ``tag`` (or
    nothing, when None) travels in the message's header."""
    route = world.route(is_cupy(x))
    be = world.backend(route)
    header = {} if tag is None else {"tag": tag}
    if route == "nccl":
        buf = contiguous(x)
        return lambda: be.run(lambda: be.send(buf, dst, header))
    buf = cupy_or_none().asnumpy(x) if is_cupy(x) else contiguous(x)
    return lambda: be.send(buf, dst, header)


def send(x, dst: int, group: Group | None = None, *, tag=None) -> None:
    """Send ``x`` to global rank ``dst``; returns once the data is buffered (maybe not yet read).

    ``tag``: small JSON-serialisable metadata (a dict of numbers, say) carried in the header the
    message sends anyway, so a caller's own fields cost no extra message; ``recv(src,
    with_tag=True)`` returns it."""
    check_array("send", x)
    world = _peer("send", int(dst), group)
    transfer = _logged(_send_now(x, int(dst), world, tag), "send", world, int(dst), x)
    world.peer_worker("send", int(dst)).flush()
    transfer()


def isend(x, dst: int, group: Group | None = None, *, tag=None) -> Work:
    """Start sending ``x`` (and ``tag``, see :func:`send`) to ``dst``; ``Work.wait()`` returns
    once it is buffered. Do not modify ``x`` before that. Messages to one peer arrive in the order
    they were sent."""
    check_array("isend", x)
    world = _peer("isend", int(dst), group)
    transfer = _logged(_send_now(x, int(dst), world, tag), "isend", world, int(dst), x)
    return world.peer_worker("send", int(dst)).submit(transfer)


def _logged(transfer: Callable[[], None], kind: str, world: GroupContext, dst: int, x):
    """``transfer`` with its record in the flight recorder / comm log (:mod:`.recorder`)."""
    record = recorder.begin(kind, (world.global_rank, dst), None, [x], world.route(is_cupy(x)))

    def run() -> None:
        transfer()
        recorder.finish(record)

    return run


def _recv_now(src: int, out, device, world: GroupContext, with_tag: bool = False):
    host = world.backend(world.host_route)
    start = time.time()
    header, y = host.recv(src)
    y = _received_array(src, out, device, world, header, y)
    route = header.get("via", world.host_route)
    record = recorder.begin("recv", (src, world.global_rank), None, [y], route)
    record.start = start
    recorder.finish(record)
    return (y, header.get("tag")) if with_tag else y


def _received_array(src: int, out, device, world: GroupContext, header: dict, y):
    """The received array of a message whose ``header`` came over the host channel: its NCCL
    payload fetched, written into ``out`` or placed on ``device``."""
    if header.get("via") == "nccl":
        nccl = world.backend("nccl")
        y = nccl.run(lambda: nccl.recv_payload(src, header))
    if out is not None:
        if tuple(out.shape) != tuple(y.shape) or out.dtype != y.dtype:
            raise ValueError(
                f"recv from rank {src}: the message is {list(y.shape)} {dtype_name(y.dtype)}, "
                f"the buffer {list(out.shape)} {dtype_name(out.dtype)}"
            )
        out[...] = get_array_module(out).asarray(y)
        return out
    return y if device is None else as_device(device).put(y)


def recv(src: int, out=None, device=None, group: Group | None = None, *,
         with_tag: bool = False):
    """The next array sent by global rank ``src`` (shape and dtype travel with it).

    With ``out`` the data is written into it (shape and dtype must match) and ``out`` returned;
    with ``device`` the result is placed there; otherwise it is a NumPy array, or a CuPy array when
    it came over NCCL. With ``with_tag``, ``(array, tag)``: the sender's ``tag`` (None if it gave
    none).
    """
    if out is not None:
        check_array("recv", out)
    world = _peer("recv", int(src), group)
    world.peer_worker("recv", int(src)).flush()
    return _recv_now(int(src), out, device, world, with_tag)


def irecv(src: int, out=None, device=None, group: Group | None = None, *,
          with_tag: bool = False) -> Work:
    """Start receiving from ``src``; ``Work.wait()`` returns what :func:`recv` would."""
    if out is not None:
        check_array("irecv", out)
    world = _peer("irecv", int(src), group)
    worker = world.peer_worker("recv", int(src))
    return worker.submit(lambda: _recv_now(int(src), out, device, world, with_tag))
