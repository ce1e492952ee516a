"""Differentiable collectives (``dist.functional``, MegEngine's names): each forward is a collective
from :mod:`.arrays` (the ``*_along`` ones where an axis is cut or joined) and each backward is its
adjoint collective, so gradients cross ranks exactly as activations did. Conventions are comm's:
``group=None`` is WORLD, roots are global ranks and default to the group's first rank.

Ops whose result lives only on some ranks (``reduce_sum``/``gather`` on non-roots, ``remote_send``)
return a *token* on the other ranks and register it as an extra backward root of every recording
GradManager: ``gm.backward()`` then pulls the gradient back through them, keeping the backward
communication of all ranks in mirrored order.
"""

from __future__ import annotations

from minigrad.autodiff.function import Function
from minigrad.autodiff.recording import STATE, is_recording
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device import as_device, get_default_device_obj
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import WORLD, get_rank, resolve_group

# MegEngine's ``megengine.distributed.functional`` (= ``megengine.functional.distributed``) names
__all__ = [
    "all_gather",
    "all_reduce_max",
    "all_reduce_min",
    "all_reduce_sum",
    "all_to_all",
    "broadcast",
    "gather",
    "reduce_scatter_sum",
    "reduce_sum",
    "remote_recv",
    "remote_send",
    "scatter",
]

def _root(group, root):
    return group.root if root is None else root


def _token(out: Tensor) -> Tensor:
    """Make a token an extra backward root of every manager recording now (it was recorded:
    collectives are ``records_always``, so a float output is recorded whenever one records)."""
    if is_recording() and out.dtype.kind == "f":
        for gm in STATE.recorders:
            gm.add_backward_root(out)
    return out


def _rooted(op: Function, inp: Tensor, group, root, *args):
    """Run a collective whose result lands on one rank: ``op(inp, group, root, *args)`` with the
    group resolved and ``root`` defaulted to its first rank; the output on ``root``, None on the
    others (whose output becomes a backward root: :func:`_token`)."""
    group = resolve_group(group)
    root = _root(group, root)
    out = op(inp, group, root, *args)
    if get_rank() == root:
        return out
    _token(out)
    return None


class _Collective(Function):
    """Collectives must run on every rank even when this rank's input needs no gradient, so the
    backward communication stays matched: record whenever a GradManager is recording."""

    records_always = True


# -------------------------------------------------------------------------------------------------
# all-reduce family


class AllReduceSum(_Collective):
    """Forward: sum over the ranks. Backward: the sum of the ranks' output gradients."""

    def forward(self, x, group):
        self.group = group
        return comm.all_reduce(x.data.copy(), "sum", group)

    def backward(self, dy):
        return all_reduce_sum(dy, self.group), None


class _AllReduceExtremum(_Collective):
    """Forward: max/min over the ranks. Backward: summed gradient, kept where this rank's input
    was the extremum."""

    def forward(self, x, group, op):
        self.group = group
        out = comm.all_reduce(x.data.copy(), op, group)
        self.mask = x.data == out
        return out

    def backward(self, dy):
        total = all_reduce_sum(dy, self.group)
        return total * self.mask.astype(dy.dtype), None, None


def all_reduce_sum(inp: Tensor, group=WORLD, device=None) -> Tensor:
    """Sum of ``inp`` over the ranks of ``group``, on every rank."""
    return AllReduceSum()(inp, resolve_group(group))


def all_reduce_max(inp: Tensor, group=WORLD, device=None) -> Tensor:
    """Elementwise maximum over the ranks; the gradient flows to the ranks holding the maximum."""
    return _AllReduceExtremum()(inp, resolve_group(group), "max")


def all_reduce_min(inp: Tensor, group=WORLD, device=None) -> Tensor:
    """Elementwise minimum over the ranks; the gradient flows to the ranks holding the minimum."""
    return _AllReduceExtremum()(inp, resolve_group(group), "min")


# -------------------------------------------------------------------------------------------------
# one-to-all and all-to-one


class Broadcast(_Collective):
    """Forward: the root's input on every rank. Backward: the gradients summed onto the root."""

    def forward(self, x, group, root):
        self.group, self.root = group, root
        return comm.broadcast(x.data.copy(), root, group)

    def backward(self, dy):
        g = ReduceSum()(dy, self.group, self.root)
        return (g if get_rank() == self.root else None), None, None


def broadcast(inp, group=WORLD, root: int | None = None) -> Tensor:
    """The root's ``inp`` on every rank (non-roots may pass None: shape and dtype are discovered).
    The gradient is summed back onto the root."""
    group = resolve_group(group)
    root = _root(group, root)
    if inp is None:
        return _BroadcastRecv()(group, root, get_default_device_obj())
    return Broadcast()(inp, group, root)


class _BroadcastRecv(_Collective):
    def forward(self, group, root, device):
        self.group, self.root = group, root
        return device.put(comm.broadcast(None, root, group))

    def backward(self, dy):
        comm.reduce(dy.data.copy(), "sum", self.root, self.group)
        return None, None, None


class ReduceSum(_Collective):
    """Sum onto the root; other ranks get a token whose backward receives the root's gradient."""

    def forward(self, x, group, root):
        self.group, self.root, self.shape, self.dtype = group, root, x.shape, x.dtype
        out = comm.reduce(x.data.copy(), "sum", root, group)
        self.is_root = out is not None
        return out if self.is_root else x.xp.zeros((), x.dtype)

    def backward(self, dy):
        g = comm.broadcast(dy.data.copy() if self.is_root else None, self.root, self.group)
        return g, None, None


def reduce_sum(inp: Tensor, group=WORLD, root: int | None = None):
    """Sum over ``group`` onto ``root`` (its first rank by default); None on the other ranks."""
    return _rooted(ReduceSum(), inp, group, root)


class Gather(_Collective):
    """Forward: inputs concatenated on the root. Backward: the root scatters the gradient."""

    def forward(self, x, group, root, axis):
        self.group, self.root, self.axis = group, root, axis
        parts = comm.gather(x.data, root, group)
        self.is_root = parts is not None
        if not self.is_root:
            return x.xp.zeros((), x.dtype)
        self.sizes = [p.shape[axis] for p in parts]
        return x.xp.concatenate(parts, axis=axis)

    def backward(self, dy):
        if self.is_root:
            g = comm.scatter(comm.split_along(dy.data, self.axis, self.sizes), self.root,
                             self.group)
        else:
            g = comm.scatter(None, self.root, self.group)
        return g, None, None, None


def gather(inp: Tensor, group=WORLD, root: int | None = None, axis: int = 0):
    """Concatenate every rank's ``inp`` along ``axis`` on ``root``; None elsewhere."""
    return _rooted(Gather(), inp, group, root, axis)


class Scatter(_Collective):
    """Forward: the root's chunks, one per rank. Backward: chunk gradients gathered on the root."""

    def forward(self, x, group, root, axis):
        self.group, self.root, self.axis = group, root, axis
        if get_rank() == root:
            n = group.size
            if x.shape[axis] % n:
                raise ValueError(
                    f"scatter: axis {axis} of size {x.shape[axis]} is not divisible by the "
                    f"group size {n}"
                )
            sizes = [x.shape[axis] // n] * n
            return comm.scatter(comm.split_along(x.data, axis, sizes), root, group)
        return comm.scatter(None, root, group)

    def backward(self, dy):
        parts = comm.gather(dy.data, self.root, self.group)
        g = None if parts is None else dy.xp.concatenate(parts, axis=self.axis)
        return g, None, None, None


def scatter(inp, group=WORLD, root: int | None = None, axis: int = 0) -> Tensor:
    """Split the root's ``inp`` along ``axis`` into ``group.size`` chunks; rank i gets chunk i.
    Non-roots may pass None."""
    group = resolve_group(group)
    root = _root(group, root)
    if inp is None:
        if get_rank() == root:
            raise ValueError("scatter: the root must pass the tensor to scatter, got None")
        return _ScatterRecv()(group, root, axis, get_default_device_obj())
    return Scatter()(inp, group, root, axis)


class _ScatterRecv(_Collective):
    def forward(self, group, root, axis, device):
        self.group, self.root = group, root
        return device.put(comm.scatter(None, root, group))

    def backward(self, dy):
        comm.gather(dy.data, self.root, self.group)
        return None, None, None, None


# -------------------------------------------------------------------------------------------------
# all-to-all family


class AllGather(_Collective):
    """Forward: inputs concatenated on every rank. Backward: reduce-scatter of the gradient."""

    def forward(self, x, group, axis):
        self.group, self.axis = group, axis
        out, self.sizes = comm.all_gather_along(x.data, axis, group, with_sizes=True)
        return out

    def backward(self, dy):
        return ReduceScatterSum()(dy, self.group, self.axis, tuple(self.sizes)), None, None


class ReduceScatterSum(_Collective):
    """Forward: sum over the ranks, chunk i to rank i. Backward: all-gather of the gradients."""

    def forward(self, x, group, axis, sizes):
        self.group, self.axis = group, axis
        return comm.reduce_scatter_along(x.data, axis, group, sizes=sizes)

    def backward(self, dy):
        return AllGather()(dy, self.group, self.axis), None, None, None


def all_gather(inp: Tensor, group=WORLD, axis: int = 0) -> Tensor:
    """Concatenate every rank's ``inp`` along ``axis``, on every rank."""
    axis = axis % max(inp.ndim, 1)
    return AllGather()(inp, resolve_group(group), axis)


def reduce_scatter_sum(inp: Tensor, group=WORLD, axis: int = 0) -> Tensor:
    """Sum over ranks, then rank i keeps the i-th of ``group.size`` equal chunks along ``axis``."""
    group = resolve_group(group)
    axis = axis % max(inp.ndim, 1)
    n = group.size
    if inp.shape[axis] % n:
        raise ValueError(
            f"reduce_scatter_sum: axis {axis} of size {inp.shape[axis]} is not divisible by the "
            f"group size {n}"
        )
    return ReduceScatterSum()(inp, group, axis, (inp.shape[axis] // n,) * n)


class AllToAll(_Collective):
    """Forward: chunk i to rank i, received chunks concatenated. Backward: the transposed
    all-to-all."""

    def forward(self, x, group, split_axis, concat_axis):
        self.group, self.split_axis, self.concat_axis = group, split_axis, concat_axis
        return comm.all_to_all_along(x.data, split_axis, concat_axis, group)

    def backward(self, dy):
        return AllToAll()(dy, self.group, self.concat_axis, self.split_axis), None, None, None


def all_to_all(inp: Tensor, group=WORLD, split_axis: int = 0, concat_axis: int = 0) -> Tensor:
    """Split ``inp`` along ``split_axis`` into ``group.size`` chunks, send chunk i to rank i, and
    concatenate what arrives along ``concat_axis``."""
    group = resolve_group(group)
    if inp.shape[split_axis] % group.size:
        raise ValueError(
            f"all_to_all: split axis {split_axis} of size {inp.shape[split_axis]} is not divisible "
            f"by the group size {group.size}"
        )
    return AllToAll()(inp, group, split_axis % inp.ndim, concat_axis % inp.ndim)


# -------------------------------------------------------------------------------------------------
# point to point (pipeline parallelism)


class RemoteSend(_Collective):
    """Forward: send to ``dest`` (a token comes out). Backward: receive the gradient from it."""

    def forward(self, x, dest):
        self.dest, self.device = dest, x.device
        comm.send(x.data, dest)
        return x.xp.zeros((), x.dtype if x.dtype.kind == "f" else "float32")

    def backward(self, _token_grad):
        return comm.recv(self.dest, device=self.device), None


class RemoteRecv(_Collective):
    """Receives onto the device of ``anchor`` (a 0-d tensor there), which also labels the output."""

    def forward(self, anchor, src):
        self.src = src
        return comm.recv(src, device=anchor.device)

    def backward(self, dy):
        comm.send(dy.data, self.src)
        return None, None


def remote_send(inp: Tensor, dest_rank: int) -> Tensor:
    """Send ``inp`` to ``dest_rank``. Inside a recording the send becomes a backward root, so
    ``gm.backward()`` (no loss) receives the gradient of ``inp`` back from ``dest_rank``."""
    return _token(RemoteSend()(inp, int(dest_rank)))


def remote_recv(src_rank: int, shape=None, dtype=None, device=None, inp=None) -> Tensor:
    """Receive a tensor from ``src_rank`` onto ``device`` (default: ``inp``'s device, else the
    default device); shape and dtype are discovered (MegEngine's ``shape``/``dtype`` are checked).
    In a recording, backward sends the gradient back to ``src_rank``."""
    if device is not None:
        dev = as_device(device)
    else:
        dev = inp.device if isinstance(inp, Tensor) else get_default_device_obj()
    out = RemoteRecv()(Tensor(0, dtype="float32", device=dev), int(src_rank))
    if shape is not None and tuple(shape) != out.shape:
        raise ValueError(
            f"remote_recv: expected shape {tuple(shape)} from rank {src_rank}, got {out.shape}"
        )
    if dtype is not None and str(out.dtype) != str(dtype) and out.dtype != dtype:
        raise ValueError(
            f"remote_recv: expected dtype {dtype} from rank {src_rank}, got {out.dtype}"
        )
    return out
