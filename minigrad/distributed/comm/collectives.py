"""PyTorch/OneFlow-style collectives on ``minigrad.distributed``: in place, on Tensors and arrays.

Scripts written for ``torch.distributed`` or ``oneflow.comm`` run unchanged::

    t = mg.tensor(np.ones(4, np.float32))
    dist.all_reduce(t)                              # t == world_size on every rank
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    work = dist.all_reduce(t, async_op=True); ...; work.wait()
    out = [mg.tensor(np.zeros(4, np.float32)) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)

Every argument may be a minigrad Tensor or a NumPy/CuPy array; results are written into the
tensors the caller passes (like PyTorch, into the tensor's own storage: do not pass a tensor that a
recording still needs for backward). Functions return None, or a :class:`Work` with
``async_op=True``. They are thin: the work is done once, in :mod:`.arrays`, with its conventions
(``group=None`` is WORLD, ``src``/``dst`` are global ranks and default to the group's first rank,
dtypes named ``float32`` in errors). Objects travel through a safe encoding (:mod:`.objects`), never
pickle.
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import Group, get_rank, resolve_group
from minigrad.distributed.comm.providers.base import ReduceOp, Work, dtype_name
from minigrad.distributed.runtime.objects import decode, encode


def _array(t, where: str):
    """The backend array of a Tensor (its own storage) or an array."""
    if isinstance(t, Tensor):
        return t.data
    comm.check_array(where, t)
    return t


def _store(dest, value, where: str) -> None:
    """Write ``value`` into the caller's tensor or array ``dest`` (shapes and dtypes must match)."""
    d = _array(dest, where)
    if tuple(d.shape) != tuple(value.shape) or d.dtype != value.dtype:
        raise ValueError(
            f"{where}: output is {list(d.shape)} {dtype_name(d.dtype)}, the result "
            f"{list(value.shape)} {dtype_name(value.dtype)}"
        )
    d[...] = value


def _finish(result, async_op: bool, then):
    """Apply ``then`` to a result now, or when an async Work is waited for."""
    if async_op:
        return result.then(then)
    then(result)
    return None


def _outputs(where: str, outputs, n: int) -> list:
    outputs = list(outputs)
    if len(outputs) != n:
        raise ValueError(f"{where}: expected {n} output tensors (one per rank), got {len(outputs)}")
    return outputs


def all_reduce(tensor, op=ReduceOp.SUM, group: Group | None = None, async_op: bool = False):
    """Reduce ``tensor`` over the group, in place (SUM, AVG, PRODUCT, MIN or MAX)."""
    w = comm.all_reduce(_array(tensor, "all_reduce"), op, group, async_op)
    return w if async_op else None


def broadcast(tensor, src: int | None = None, group: Group | None = None, async_op: bool = False):
    """Copy ``src``'s ``tensor`` into every rank's ``tensor``."""
    w = comm.broadcast(_array(tensor, "broadcast"), src, group, async_op)
    return w if async_op else None


def reduce(tensor, dst: int | None = None, op=ReduceOp.SUM, group: Group | None = None,
           async_op: bool = False):
    """Reduce ``tensor`` over the group into ``dst``'s ``tensor`` (others are left unchanged)."""
    w = comm.reduce(_array(tensor, "reduce"), op, dst, group, async_op)
    return w if async_op else None


def all_gather(tensor_list, tensor, group: Group | None = None, async_op: bool = False):
    """``tensor_list[i]`` receives rank i's ``tensor`` (the list holds one tensor per rank)."""
    outputs = _outputs("all_gather", tensor_list, resolve_group(group).size)

    def fill(ys):
        for i, (d, y) in enumerate(zip(outputs, ys)):
            _store(d, y, f"all_gather (output {i})")

    return _finish(comm.all_gather(_array(tensor, "all_gather"), group, async_op), async_op, fill)


def all_gather_into_tensor(output_tensor, input_tensor, group: Group | None = None,
                           async_op: bool = False):
    """All ranks' ``input_tensor`` in one output: concatenated along dim 0 (output shape
    ``(n * d0, ...)``) or stacked (``(n, d0, ...)``), chosen by the output's shape."""
    x = _array(input_tensor, "all_gather_into_tensor")
    out = _array(output_tensor, "all_gather_into_tensor")
    n = resolve_group(group).size
    stacked = tuple(out.shape) == (n, *x.shape)
    if not stacked and (x.ndim == 0 or tuple(out.shape) != (n * x.shape[0], *x.shape[1:])):
        concat = [n * x.shape[0], *x.shape[1:]] if x.ndim else "(none for 0-d)"
        raise ValueError(
            f"all_gather_into_tensor: output shape {list(out.shape)} is neither the stacked "
            f"{[n, *x.shape]} nor the concatenated {concat} form for input {list(x.shape)} on "
            f"{n} ranks"
        )

    if out.flags.c_contiguous and dtype_name(out.dtype) == dtype_name(x.dtype):
        # either form is the ranks' inputs back to back: gathered straight into the output
        return _finish(comm.all_gather_into(out, x, group, async_op), async_op, lambda _: None)

    def fill(ys):
        for i, y in enumerate(ys):
            part = out[i, ...] if stacked else out[i * x.shape[0] : (i + 1) * x.shape[0]]
            _store(part, y, "all_gather_into_tensor")

    return _finish(comm.all_gather(x, group, async_op), async_op, fill)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group: Group | None = None,
                   async_op: bool = False):
    """``output`` on rank i receives ``input_list[i]`` reduced over the ranks."""
    inputs = [_array(t, "reduce_scatter") for t in input_list]
    fill = lambda y: _store(output, y, "reduce_scatter")
    return _finish(comm.reduce_scatter(inputs, op, group, async_op), async_op, fill)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group: Group | None = None,
                          async_op: bool = False):
    """Like :func:`reduce_scatter` with the inputs in one tensor: ``input`` is ``(n * d0, ...)``
    (chunk i = rows ``i*d0 ... (i+1)*d0``) or ``(n, d0, ...)`` (chunk i = ``input[i]``)."""
    x, out = _array(input, "reduce_scatter_tensor"), _array(output, "reduce_scatter_tensor")
    n = resolve_group(group).size
    if tuple(x.shape) == (n, *out.shape):
        chunks = [x[i, ...] for i in range(n)]
    elif out.ndim and tuple(x.shape) == (n * out.shape[0], *out.shape[1:]):
        chunks = [x[i * out.shape[0] : (i + 1) * out.shape[0]] for i in range(n)]
    else:
        raise ValueError(
            f"reduce_scatter_tensor: input shape {list(x.shape)} must be {n} x the output shape "
            f"{list(out.shape)}, stacked or concatenated along dim 0"
        )
    fill = lambda y: _store(output, y, "reduce_scatter_tensor")
    return _finish(comm.reduce_scatter(chunks, op, group, async_op), async_op, fill)


def gather(tensor, gather_list=None, dst: int | None = None, group: Group | None = None,
           async_op: bool = False):
    """``gather_list[i]`` on ``dst`` receives rank i's ``tensor`` (other ranks pass None)."""
    g = resolve_group(group)
    is_dst = get_rank() == (g.root if dst is None else dst)
    outputs = _outputs("gather", gather_list or [], g.size) if is_dst else None

    def fill(ys):
        for i, (d, y) in enumerate(zip(outputs or [], ys or [])):
            _store(d, y, f"gather (output {i})")

    return _finish(comm.gather(_array(tensor, "gather"), dst, group, async_op), async_op, fill)


def scatter(tensor, scatter_list=None, src: int | None = None, group: Group | None = None,
            async_op: bool = False):
    """Rank i's ``tensor`` receives ``scatter_list[i]`` of ``src`` (other ranks pass None)."""
    chunks = None if scatter_list is None else [_array(t, "scatter") for t in scatter_list]
    fill = lambda y: _store(tensor, y, "scatter")
    return _finish(comm.scatter(chunks, src, group, async_op), async_op, fill)


def all_to_all(output_tensor_list, input_tensor_list, group: Group | None = None,
               async_op: bool = False):
    """``output_tensor_list[j]`` receives rank j's ``input_tensor_list[my rank]``."""
    outputs = _outputs("all_to_all", output_tensor_list, resolve_group(group).size)
    inputs = [_array(t, "all_to_all") for t in input_tensor_list]

    def fill(ys):
        for j, (d, y) in enumerate(zip(outputs, ys)):
            _store(d, y, f"all_to_all (output {j})")

    return _finish(comm.all_to_all(inputs, group, async_op), async_op, fill)


def _splits(where: str, sizes, total: int, n: int) -> list[int]:
    if sizes is None:
        if total % n:
            raise ValueError(f"{where}: dim 0 of size {total} does not split evenly over {n} ranks")
        return [total // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != total:
        raise ValueError(f"{where}: split sizes {sizes} must be {n} numbers summing to {total}")
    return sizes


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group: Group | None = None, async_op: bool = False):
    """All-to-all on one tensor: ``input`` is split along dim 0 (evenly, or by
    ``input_split_sizes``), piece j goes to rank j, and the pieces received are concatenated
    along dim 0 into ``output`` (split by ``output_split_sizes``)."""
    x, out = _array(input, "all_to_all_single"), _array(output, "all_to_all_single")
    n = resolve_group(group).size
    bounds = np.cumsum([0] + _splits("all_to_all_single (input)", input_split_sizes, x.shape[0], n))
    out_sizes = _splits("all_to_all_single (output)", output_split_sizes, out.shape[0], n)
    chunks = [x[bounds[j] : bounds[j + 1]] for j in range(n)]

    def fill(ys):
        got = [int(y.shape[0]) for y in ys]
        if got != out_sizes:
            raise ValueError(f"all_to_all_single: received pieces of {got} rows, "
                             f"output split sizes are {out_sizes}")
        start = 0
        for y in ys:
            _store(out[start : start + y.shape[0]], y, "all_to_all_single")
            start += y.shape[0]

    return _finish(comm.all_to_all(chunks, group, async_op), async_op, fill)


def barrier(group: Group | None = None, async_op: bool = False):
    """Block until every rank of the group has entered the barrier."""
    return comm.barrier(group, async_op)


def _no_tag(where: str, tag: int) -> None:
    if tag != 0:
        raise ValueError(f"{where}: message tags are not supported (got tag={tag}); messages "
                         f"between two ranks arrive in the order they were sent")


def send(tensor, dst: int, group: Group | None = None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst`` (returns once it is buffered)."""
    _no_tag("send", tag)
    comm.send(_array(tensor, "send"), dst, group)


def recv(tensor, src: int, group: Group | None = None, tag: int = 0) -> int:
    """Receive the next message from ``src`` into ``tensor``; returns ``src`` (like PyTorch)."""
    _no_tag("recv", tag)
    comm.recv(src, out=_array(tensor, "recv"), group=group)
    return src


def isend(tensor, dst: int, group: Group | None = None, tag: int = 0) -> Work:
    """Start sending ``tensor`` to ``dst``; do not modify it before ``wait()``."""
    _no_tag("isend", tag)
    return comm.isend(_array(tensor, "isend"), dst, group)


def irecv(tensor, src: int, group: Group | None = None, tag: int = 0) -> Work:
    """Start receiving from ``src`` into ``tensor``; it holds the message after ``wait()``."""
    _no_tag("irecv", tag)
    return comm.irecv(src, out=_array(tensor, "irecv"), group=group)


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv` (``op`` is isend or irecv)."""

    def __init__(self, op, tensor, peer: int, group: Group | None = None, tag: int = 0):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be dist.isend or dist.irecv")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, int(peer), group, tag

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every operation of the list and return their Works (PyTorch's batching: sends and
    receives are all in flight together, so exchanges in rings cannot deadlock)."""
    return [p.op(p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]


def _pack_objects(obj) -> tuple[np.ndarray, TypeError | None]:
    """``obj`` encoded for the wire; an object that cannot be sent becomes an error message that
    travels instead, so the other ranks raise too rather than wait for data that never comes."""
    try:
        data, error = encode({"objects": obj}), None
    except TypeError as exc:
        data, error = encode({"error": str(exc)}), exc
    return np.frombuffer(data, np.uint8).copy(), error


def _unpack_objects(data: np.ndarray, where: str, sender: int):
    envelope = decode(data.tobytes())
    if "error" in envelope:
        raise TypeError(f"{where}: rank {sender} could not send its objects: {envelope['error']}")
    return envelope["objects"]


def broadcast_object_list(object_list: list, src: int | None = None,
                          group: Group | None = None) -> None:
    """Replace the items of ``object_list`` on every rank with ``src``'s (same length everywhere).
    Objects are limited to the types of :mod:`minigrad.distributed.runtime.objects` (never
    pickle); if ``src`` passes another type, every rank raises TypeError."""
    g = resolve_group(group)
    root = g.root if src is None else src
    data, error = _pack_objects(list(object_list)) if get_rank() == root else (None, None)
    data = comm.broadcast(data, root, group)
    if error is not None:
        raise error
    got = _unpack_objects(data, "broadcast_object_list", root)
    if len(got) != len(object_list):
        raise ValueError(
            f"broadcast_object_list: rank {get_rank()} passed a list of {len(object_list)}, "
            f"rank {root} sent {len(got)} objects"
        )
    object_list[:] = got


def all_gather_object(object_list: list, obj, group: Group | None = None) -> None:
    """``object_list[i]`` becomes rank i's ``obj`` (the list holds one entry per rank)."""
    g = resolve_group(group)
    if len(object_list) != g.size:
        raise ValueError(
            f"all_gather_object: expected a list of {g.size} entries, got {len(object_list)}"
        )
    data, error = _pack_objects(obj)
    gathered = comm.all_gather(data, group)
    if error is not None:
        raise error
    object_list[:] = [
        _unpack_objects(y, "all_gather_object", r) for r, y in zip(g.ranks, gathered)
    ]
