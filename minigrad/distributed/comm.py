"""Array-level collectives: the API the differentiable ``dist.functional`` layer builds on.

Arrays are NumPy or CuPy; results are new arrays of the input's backend. ``group=None`` means
WORLD; ``root``/``src``/``dst`` are *global* ranks. The backend is picked per call: a CuPy array
goes through NCCL when the process group's backend is "nccl"/"auto" and NCCL is usable; otherwise
through the "cpu" backend (CuPy arrays are staged through host memory, so several ranks may share
one GPU in tests). Every collective carries a fingerprint checked on all ranks (see
:mod:`minigrad.distributed.backends`).

Example::

    total = comm.all_reduce(np.ones(3, np.float32))          # [n, n, n] on every rank
    parts = comm.all_gather(np.arange(dist.get_rank() + 1))   # shapes may differ per rank
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minigrad.backend.xp import cupy_or_none
from minigrad.distributed.backends import Work, nccl_available
from minigrad.distributed.group import Group, GroupContext, _resolve, _state, get_p2p

REDUCE_OPS = ("sum", "max", "min")
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")

__all__ = [
    "Work",
    "all_gather",
    "all_reduce",
    "all_reduce_async",
    "all_to_all",
    "barrier",
    "broadcast",
    "gather",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
]


def _is_cupy(x: Any) -> bool:
    cp = cupy_or_none() if type(x).__module__.startswith("cupy") else None
    return cp is not None and isinstance(x, cp.ndarray)


def _check_array(op: str, x: Any) -> None:
    dt = getattr(x, "dtype", None)
    if dt is None or not hasattr(x, "shape"):
        raise TypeError(f"{op}: expected a NumPy or CuPy array, got {type(x).__name__}")
    if np.dtype(dt).name not in DTYPES:
        raise TypeError(f"{op}: dtype {np.dtype(dt).name} is not supported (supported: {DTYPES})")


def _check_op(name: str, op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"{name}: unknown reduce op {op!r}, expected one of {REDUCE_OPS}")


def _use_nccl(x: Any) -> bool:
    return _is_cupy(x) and _state.backend in ("auto", "nccl") and nccl_available()


def _default_is_gpu() -> bool:
    from minigrad.backend.device import get_default_device_obj

    try:
        return get_default_device_obj().is_gpu
    except (RuntimeError, ValueError):
        return False


class _Call:
    """One collective call: group context, sequence number, and host staging for CuPy inputs."""

    def __init__(
        self, name: str, group: Group | None, *arrays: Any, root: int | None = None,
        host_only: bool = False,
    ):
        self.group = _resolve(group)
        self.ctx: GroupContext = self.group.context()
        if root is not None and root not in self.ctx.ranks:
            raise ValueError(f"{name}: root rank {root} is not in group {self.ctx.ranks}")
        for a in arrays:
            if a is not None:
                _check_array(name, a)
        first = next((a for a in arrays if a is not None), None)
        if first is not None:
            self.gpu, self.nccl = _is_cupy(first), _use_nccl(first)
        else:  # e.g. a non-root of broadcast: follow the default device, like the root will
            self.gpu = not host_only and _default_is_gpu()
            self.nccl = self.gpu and _state.backend in ("auto", "nccl") and nccl_available()
        if self.nccl:
            self.backend = self.ctx.backend("nccl")
        else:
            self.backend = self.ctx.backend("cpu")
            self.backend.flush()
        self.seq = self.ctx.next_seq()

    def host(self, x: Any) -> Any:
        if x is None or self.nccl or not self.gpu:
            return x
        return cupy_or_none().asnumpy(x)

    def out(self, y: Any) -> Any:
        if y is None or self.nccl or not self.gpu:
            return y
        return cupy_or_none().asarray(y)

    def index_of(self, rank: int) -> int:
        return self.ctx.ranks.index(rank)


def all_reduce(x: Any, op: str = "sum", group: Group | None = None) -> Any:
    """Reduce ``x`` elementwise over the group's ranks; every rank gets the result."""
    _check_op("all_reduce", op)
    c = _Call("all_reduce", group, x)
    return c.out(c.backend.all_reduce(c.host(x), op, c.seq))


def all_reduce_async(x: Any, op: str = "sum", group: Group | None = None,
                     donate: bool = False) -> Work:
    """Start an all-reduce and return a :class:`Work`; ``Work.wait()`` returns the result.

    Used to overlap bucketed gradient all-reduce with the rest of backward. Collectives issued
    later on the same group run after it (order is preserved). ``donate=True`` hands ``x`` over:
    the result may be written into it instead of a copy (saves two passes over a big bucket).
    """
    _check_op("all_reduce_async", op)
    c = _Call("all_reduce_async", group, x)
    if c.gpu and not c.nccl:
        host = c.host(x)
        work = c.backend.all_reduce_async(host, op, c.seq, donate=host is not x)
        return Work(lambda: c.out(work.wait()), work.is_completed)
    return c.backend.all_reduce_async(x, op, c.seq, donate=donate)


def broadcast(x: Any, root: int = 0, group: Group | None = None) -> Any:
    """Copy the root's array to every rank; non-roots may pass None (shape/dtype discovered)."""
    c = _Call("broadcast", group, x, root=root)
    i = c.index_of(root)
    if c.ctx.index == i and x is None:
        raise ValueError(f"broadcast: the root rank {root} must pass an array, got None")
    return c.out(c.backend.broadcast(c.host(x), i, c.seq))


def all_gather(x: Any, group: Group | None = None) -> list:
    """Every rank's array, in group order, on every rank (shapes may differ per rank)."""
    c = _Call("all_gather", group, x)
    return [c.out(y) for y in c.backend.all_gather(c.host(x), c.seq)]


def reduce(x: Any, op: str = "sum", root: int = 0, group: Group | None = None) -> Any | None:
    """Reduce onto ``root``; other ranks get None."""
    _check_op("reduce", op)
    c = _Call("reduce", group, x, root=root)
    return c.out(c.backend.reduce(c.host(x), op, c.index_of(root), c.seq))


def gather(x: Any, root: int = 0, group: Group | None = None) -> list | None:
    """All ranks' arrays (group order) on ``root``; None elsewhere."""
    c = _Call("gather", group, x, root=root)
    ys = c.backend.gather(c.host(x), c.index_of(root), c.seq)
    return None if ys is None else [c.out(y) for y in ys]


def scatter(chunks: list | None, root: int = 0, group: Group | None = None) -> Any:
    """``root`` sends ``chunks[i]`` to the group's i-th rank; others pass None."""
    arrays = list(chunks) if chunks is not None else []
    c = _Call("scatter", group, *arrays, root=root)
    i = c.index_of(root)
    if c.ctx.index != i:
        chunks = None
    elif chunks is None:
        raise ValueError(f"scatter: the root rank {root} must pass a list of chunks, got None")
    host = None if chunks is None else [c.host(a) for a in chunks]
    return c.out(c.backend.scatter(host, i, c.seq))


def reduce_scatter(chunks: list, op: str = "sum", group: Group | None = None) -> Any:
    """Reduce ``chunks[i]`` over the ranks onto the group's i-th rank."""
    _check_op("reduce_scatter", op)
    c = _Call("reduce_scatter", group, *chunks)
    return c.out(c.backend.reduce_scatter([c.host(a) for a in chunks], op, c.seq))


def all_to_all(chunks: list, group: Group | None = None) -> list:
    """``result[i]`` is the group's i-th rank's ``chunks[my index]``."""
    c = _Call("all_to_all", group, *chunks)
    return [c.out(y) for y in c.backend.all_to_all([c.host(a) for a in chunks], c.seq)]


def barrier(group: Group | None = None) -> None:
    """Block until every member of the group arrived."""
    c = _Call("barrier", group, host_only=True)
    c.backend.barrier(c.seq)


def _p2p_peer(name: str, peer: int) -> None:
    if not 0 <= peer < _state.world_size or peer == _state.rank and _state.world_size > 1:
        raise ValueError(
            f"{name}: peer rank must be another rank in [0, {_state.world_size}), got {peer} "
            f"on rank {_state.rank}"
        )


def send(x: Any, dst: int) -> None:
    """Send ``x`` to global rank ``dst``; returns once the data is buffered (maybe not yet read)."""
    _check_array("send", x)
    _p2p_peer("send", dst)
    if _use_nccl(x):
        _resolve(None).context().backend("nccl").send(x, dst)
        return
    get_p2p().send(cupy_or_none().asnumpy(x) if _is_cupy(x) else x, dst)


def recv(src: int, device: Any = None) -> Any:
    """Receive the next array sent by global rank ``src`` (shape and dtype travel with it).

    The result is a NumPy array, or a CuPy array when ``device`` is a GPU (or NCCL is in use and the
    default device is a GPU).
    """
    _p2p_peer("recv", src)
    if device is None:
        from minigrad.backend.device import get_default_device_obj

        try:
            dev = get_default_device_obj()
        except (RuntimeError, ValueError):
            dev = None
    else:
        from minigrad.backend.device import as_device

        dev = as_device(device)
    gpu = dev is not None and dev.is_gpu
    if gpu and _state.backend in ("auto", "nccl") and nccl_available():
        return _resolve(None).context().backend("nccl").recv(src)
    y = get_p2p().recv(src)
    return dev.put(y) if gpu else y
