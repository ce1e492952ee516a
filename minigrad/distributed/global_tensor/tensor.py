"""``GlobalTensor``: a tensor whose logical value is laid out over the ranks of a placement, and
the dispatch that runs every functional op on such tensors.

A global tensor is a ``Tensor`` whose ``_data`` is *this rank's piece* (an empty array on a rank
outside its placement) and which also knows its layout (placement and nd-SBP) and logical shape.
Autodiff sees only pieces: every op records an ordinary node on the local pieces, and
redistributions are nodes too (:class:`~.boxing.Boxing`), whose backward is the adjoint
redistribution. Inside that local graph a gradient is held in the *adjoint* layout of its tensor
(the gradient of a broadcast value is partial, of a partial value broadcast), which is exactly what
running each op's ordinary backward on the pieces produces. Where gradients leave the graph they
are turned back into the tensor's own layout: a global leaf's ``.grad`` is a global tensor with the
leaf's placement and SBP (so an optimizer can update piece by piece), the gradient of ``to_local``'s
input and of ``to_global``'s local input are pieces in the forward SBP (OneFlow's rule; for
``to_global`` ``grad_sbp`` overrides it).

Dispatch (``Function.__call__`` hands any call with a global input to :func:`dispatch`):

1. all tensor inputs must be global and on one placement (mixing is an error naming the op);
2. the op's rule (:mod:`.rules`) gives the SBP to box each input to, the outputs' SBPs and
   logical shapes; ops without a rule box everything to broadcast;
3. the inputs are boxed (recorded, differentiable); the op is counted in the lockstep digest;
4. ranks of the placement run the op on their pieces; ranks outside it record an empty
   :class:`Skip` node instead, so their graph stays connected (a backward reaches the transfers it
   must run) and nothing is computed;
5. the outputs become global tensors.
"""

from __future__ import annotations

import copy as _copy
import math

import numpy as np

from minigrad.autodiff import no_grad
from minigrad.autodiff.function import Function
from minigrad.autodiff.recording import EAGER_TAPE
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.xp import get_array_module, to_numpy
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import get_rank, get_world_size
from minigrad.distributed.global_tensor import lockstep
from minigrad.distributed.global_tensor.boxing import (
    Boxing,
    Layout,
    box,
    empty_piece,
    piece_of,
)
from minigrad.distributed.global_tensor.rules import LocalCall, rule_for
from minigrad.distributed.global_tensor.sbp import as_nd_sbp, broadcast, describe, local_shape

__all__ = ["GlobalParameter", "GlobalTensor", "dispatch", "local_row_chunks", "local_to_global",
           "make_global"]


# -------------------------------------------------------------------------------------------------
# dispatch


def _placement_of(name: str, inputs):
    placement = None
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            continue
        if not x.is_global:
            raise RuntimeError(
                f"{name}: input {i} is a local tensor (shape {x.shape}, dtype {x.dtype}) but "
                "other inputs are global; convert it with .to_global(placement, sbp) (or take "
                "the others' .to_local())"
            )
        if placement is None:
            placement = x.placement
        elif x.placement != placement:
            raise RuntimeError(
                f"{name}: inputs are on different placements, {placement} and {x.placement}; "
                "move one with .to_global(placement=...)"
            )
    return placement


def _plan(rule, op, args, placement):
    """Input and output nd-SBPs from a rule's 1-D decisions, one mesh dimension at a time."""
    sizes = getattr(rule.sbp, "takes_mesh_size", False)  # a rule that needs the rank count
    per_dim = [rule.sbp(op, args, [x.sbp[d] if isinstance(x, Tensor) else None for x in args],
                        **({"mesh_size": placement.mesh_shape[d]} if sizes else {}))
               for d in range(placement.ndim)]
    ins = [None if not isinstance(x, Tensor) else tuple(dim[0][i] for dim in per_dim)
           for i, x in enumerate(args)]
    outs = [tuple(dim[1][j] for dim in per_dim) for j in range(len(per_dim[0][1]))]
    return ins, outs


def _evaluate(op, args, full: bool):
    """Output ``(shapes, dtypes)`` of ``op`` found by running its forward on zeros: of the
    logical shapes (``full``: an op without a rule, on a rank outside the placement) or of
    one-element stand-ins (for the dtypes only). None when the forward fails."""
    inputs = [Tensor._wrap(np.zeros(x.shape if full else (1,) * x.ndim, x.dtype), None)
              if isinstance(x, Tensor) else x for x in args]
    try:
        with no_grad(), np.errstate(all="ignore"):
            out = _copy.copy(op).forward(*inputs)
    except Exception:  # noqa: BLE001  (any failure only means: no answer this way)
        return None
    outs = out if isinstance(out, tuple) else (out,)
    arrays = [o._data if isinstance(o, Tensor) else np.asarray(o) for o in outs]
    return [a.shape for a in arrays], [a.dtype for a in arrays]


class Skip(Function):
    """What a rank outside an op's placement records instead of the op: empty outputs, and a
    backward that hands empty gradients back, so this rank's graph is connected like the graphs of
    the ranks that compute (its backward reaches the same transfers, in the same order)."""

    def forward(self, dtypes, *pieces):
        self.dtypes = [x.dtype for x in pieces]
        self.xp = pieces[0].xp if pieces else np
        outs = tuple(empty_piece(dt, self.xp) for dt in dtypes)
        return outs if len(outs) > 1 else outs[0]

    def backward(self, *grads):
        return (None,) + tuple(empty_piece(dt, self.xp) if dt.kind == "f" else None
                               for dt in self.dtypes)


def dispatch(op: Function, inputs: tuple):
    """Run ``op`` on global tensors (see the module docstring); returns global tensors."""
    name = type(op).__name__
    placement = _placement_of(name, inputs)
    me = get_rank()
    here = me in placement
    rule = rule_for(op)
    whole = tuple(broadcast for _ in range(placement.ndim))
    if rule is None:
        in_sbps = [whole if isinstance(x, Tensor) else None for x in inputs]
        out_sbps = shapes = None
    else:
        in_sbps, out_sbps = _plan(rule, op, inputs, placement)
        shapes = rule.shape(op, inputs)
    boxed = [x.to_global(sbp=s) if isinstance(x, Tensor) else x for x, s in zip(inputs, in_sbps)]
    if here:
        shapes_in = ", ".join(str(x.shape) for x in inputs if isinstance(x, Tensor))
        sbps_in = ", ".join(describe(s) for s in in_sbps if s is not None)
        lockstep.record(placement, f"{name} {shapes_in} {sbps_in}")
        views = [local_view(x) if isinstance(x, Tensor) else x for x in boxed]
        if rule is not None and rule.local is not None:
            pieces = [local_shape(shape, s, placement.mesh_shape, placement.coord(me))
                      for shape, s in zip(shapes, out_sbps)]
            out = rule.local(op, views, LocalCall(inputs, out_sbps, pieces))
        else:
            out = op(*views)
        outs = out if isinstance(out, tuple) else (out,)
        if out_sbps is None:  # no rule: whole results
            out_sbps, shapes = [whole] * len(outs), [o._data.shape for o in outs]
    else:
        dtypes = None
        if rule is None:
            found = _evaluate(op, boxed, full=True)
            shapes, dtypes = found if found is not None else (None, None)
        elif rule.dtype is not None:
            dtypes = rule.dtype(op, inputs)
        if dtypes is None:
            found = _evaluate(op, inputs, full=False)
            dtypes = found[1] if found is not None else [_float_dtype(inputs)] * len(
                shapes or [None])
        if shapes is None:
            shapes = [None] * len(dtypes)
        out_sbps = out_sbps or [whole] * len(dtypes)
        out = Skip()(tuple(dtypes), *(local_view(x) for x in boxed if isinstance(x, Tensor)))
        outs = out if isinstance(out, tuple) else (out,)
    for o, s, shape in zip(outs, out_sbps, shapes):
        as_global(o, Layout(placement, s), shape)
    return out


def _float_dtype(inputs):
    return next((x.dtype for x in inputs if isinstance(x, Tensor) and x.dtype.kind == "f"),
                np.dtype(np.float32))


# -------------------------------------------------------------------------------------------------
# the tensor class


class GlobalTensor(Tensor):
    """A tensor laid out over a placement: ``shape`` is the logical shape, ``to_local()`` this
    rank's piece. Made by ``to_global``, by creation functions given ``placement=`` and ``sbp=``
    and by every op on global tensors.

    Example::

        x = mg.randn(4, 5, placement=mg.placement("cpu", [0, 1]), sbp=mg.sbp.split(0))
        x.shape, x.to_local().shape    # (4, 5), (2, 5)
        (x @ w).sbp                    # (split(dim=0),) for a broadcast w
    """

    __slots__ = ()
    __minigrad_dispatch__ = staticmethod(dispatch)

    # -- the layout -------------------------------------------------------------------------------
    @property
    def is_global(self) -> bool:
        """True: a global tensor."""
        return True

    @property
    def placement(self):
        """The ``mg.placement`` the tensor lives on."""
        return self._layout.placement

    @property
    def sbp(self) -> tuple:
        """One SBP per mesh dimension of the placement."""
        return self._layout.sbp

    @property
    def shape(self) -> tuple:
        """The logical shape (the shape of the whole value, not of this rank's piece)."""
        if self._lshape is None:
            raise RuntimeError(
                f"GlobalTensor.shape: not known on rank {get_rank()}, which is outside the "
                f"placement {self.placement} of this tensor (the op that made it has no SBP rule "
                "and could not be evaluated here)"
            )
        return self._lshape

    @property
    def ndim(self) -> int:
        """The number of dimensions of the logical shape."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements of the logical value."""
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # -- local and global --------------------------------------------------------------------------
    def to_local(self, copy: bool = False, *, grad_sbp=None,
                 grad_placements=None) -> Tensor:
        """This rank's piece as a local tensor (an empty one outside the placement), sharing
        memory unless ``copy``. Differentiable: the local gradient is taken as this rank's piece
        of the gradient in the tensor's SBP (OneFlow's rule), or in ``grad_sbp`` when given
        (``grad_placements``, DTensor's name for it, takes the same ``mg.sbp`` values).

        For a broadcast tensor the default reads the ranks' local gradients as one and the same
        value (right for a loss every rank computes alike). When ranks compute different losses
        from it, ``grad_sbp=mg.sbp.partial_sum`` sums their contributions; without it the
        backward raises on every rank, naming the tensor, instead of silently keeping one rank's
        gradient."""
        if grad_sbp is not None and grad_placements is not None:
            raise ValueError("to_local: give grad_sbp or grad_placements (the same thing), "
                             "not both")
        grad = grad_sbp if grad_placements is None else grad_placements
        grad_layout = None if grad is None else Layout(
            self.placement, as_nd_sbp(grad, self.placement.ndim, self.ndim,
                                      "to_local(grad_sbp)"))
        return GlobalToLocal()(local_view(self), self._layout, self._lshape, bool(copy),
                               grad_layout)

    def to_global(self, placement=None, sbp=None, *, grad_sbp=None, check_meta: bool = False,
                  copy: bool = False) -> "GlobalTensor":
        """Redistribute to ``placement`` and/or ``sbp`` (the ones not given stay); the tensor
        itself when nothing changes (unless ``copy``). Differentiable: the gradient goes through
        the adjoint redistribution, through ``grad_sbp`` when given.

        Example::

            y = x.to_global(sbp=mg.sbp.broadcast)   # all-gather of a split x
        """
        if placement is None and sbp is None:
            raise RuntimeError("GlobalTensor.to_global: give a placement, an sbp or both")
        placement = self.placement if placement is None else placement
        sbp = self.sbp if sbp is None else sbp
        dst = Layout(placement, as_nd_sbp(sbp, placement.ndim, self.ndim, "to_global"))
        grad = None if grad_sbp is None else as_nd_sbp(grad_sbp, self.placement.ndim, self.ndim,
                                                       "to_global(grad_sbp)")
        if dst == self._layout and grad is None:
            return self._global_copy() if copy else self
        out = Boxing()(local_view(self), self._layout, dst, self._lshape, grad)
        return as_global(out, dst, self._lshape)

    def _global_copy(self) -> "GlobalTensor":
        return self.to(self.device)  # F.copy: a new tensor, same layout

    def numpy(self) -> np.ndarray:
        """The logical value as a NumPy array, on every rank of the placement (gathered when
        needed: a collective of the placement's ranks); an empty array outside the placement."""
        whole = Layout(self.placement, tuple(broadcast for _ in self.sbp))
        arr = box(self._data, self._layout, whole, self._lshape, "numpy")
        out = to_numpy(arr)
        return out.copy() if out is self._data else out

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def detach(self) -> "GlobalTensor":
        """The same pieces, cut from the graph."""
        return as_global(Tensor._wrap(self._data, self._device), self._layout, self._lshape)

    def set_value(self, value) -> "GlobalTensor":
        """Replace the data: a global tensor is redistributed to this layout; an array of this
        rank's piece shape is the new piece; an array of the logical shape is the new logical
        value (each rank keeps its piece)."""
        if isinstance(value, Tensor) and value.is_global:
            if value.shape != self.shape:
                raise ValueError(f"set_value: shape {value.shape} does not match {self.shape}")
            value = value.to_global(self.placement, self.sbp)._data
        elif isinstance(value, Tensor):
            value = value._data
        xp = get_array_module(self._data)
        arr = xp.asarray(value, dtype=self.dtype)
        if tuple(arr.shape) == tuple(self._data.shape):
            piece = arr.copy()
        elif tuple(arr.shape) == tuple(self.shape):
            piece = piece_of(arr, self._layout, get_rank())
        else:
            raise ValueError(
                f"set_value: shape {tuple(arr.shape)} is neither the logical shape {self.shape} "
                f"nor this rank's piece shape {tuple(self._data.shape)}"
            )
        self._data = self._device.put(piece, self.dtype)
        return self

    _reset = set_value

    def __setitem__(self, index, value) -> None:
        if any(s.kind != "B" for s in self.sbp):
            raise NotImplementedError(
                f"GlobalTensor.__setitem__: only broadcast tensors can be written in place (this "
                f"one has sbp {self.sbp}); use F.where or box it with .to_global(sbp=broadcast)"
            )
        if isinstance(value, Tensor) and value.is_global:
            value = value.to_global(self.placement, self.sbp).to_local()
        if get_rank() in self.placement:
            Tensor.__setitem__(self, index, value)

    def backward_seed(self, dy=None) -> Tensor:
        """This rank's piece of the gradient a backward starts from (ones, or ``dy``), in the
        adjoint layout: for a broadcast loss the placement's first rank seeds it and the others
        hold zeros, so the seeds add up to one."""
        grad_layout = self._layout.adjoint()
        me = get_rank()
        if dy is None:
            shape = grad_layout.piece_shape(self.shape, me)
            seed = piece_of(np.ones(self.shape, self.dtype), grad_layout, me) if (
                me in self.placement) else np.ones(shape, self.dtype)
        elif dy.is_global:
            seed = dy.to_global(self.placement, grad_layout.sbp)._data
        else:
            seed = piece_of(dy._data, grad_layout, me)
        return Tensor._wrap(self._device.put(seed, self.dtype), self._device)

    def __repr__(self) -> str:
        body = np.array2string(to_numpy(self._data), separator=", ", prefix="GlobalTensor(")
        return (f"GlobalTensor(local={body}, shape={self._lshape}, placement={self.placement}, "
                f"sbp={self.sbp}, dtype={self.dtype})")


class GlobalParameter(GlobalTensor, Parameter):
    """A global tensor that is a trainable weight (``Module.to_global`` makes these)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "GlobalParameter" + super().__repr__()[len("GlobalTensor"):]


def as_global(t: Tensor, layout: Layout, shape) -> GlobalTensor:
    """Make ``t`` (holding this rank's piece) itself a global tensor with ``layout`` and logical
    ``shape``; returns it."""
    t.__class__ = GlobalParameter if isinstance(t, Parameter) else GlobalTensor
    t._layout = layout
    t._lshape = None if shape is None else tuple(int(n) for n in shape)
    return t


# -------------------------------------------------------------------------------------------------
# crossing between the global graph and local pieces


class LocalView(Function):
    """A global *leaf* (an attached parameter) as the plain tensor of its piece. Its backward
    turns the piece gradient (adjoint layout) into the leaf's own layout, as a global tensor: that
    is what ``.grad`` of a global tensor holds (a broadcast weight's partial gradients are
    all-reduced here)."""

    dispatches = False  # it takes the global tensor itself

    def forward(self, g):
        self.layout, self.shape = g._layout, g._lshape
        return g._data

    def backward(self, dy):
        g = box(dy._data, self.layout.adjoint(), self.layout, self.shape, "grad")
        return as_global(Tensor._wrap(g, dy._device), self.layout, self.shape)


def local_view(g: GlobalTensor) -> Tensor:
    """The plain tensor of ``g``'s piece for running ops locally: the same graph node (or a
    :class:`LocalView` node for an attached leaf; a node of eager autograd, from ops outside
    every GradManager, does not make it less of a leaf for a GradManager). Eager autograd does
    not go through global tensors: the view does not take ``g``'s ``_eager_grad``, so a
    ``loss.backward()`` outside GradManagers raises instead of missing gradients."""
    node = g._node
    if g._requires_grad and (node is None or node._tape is EAGER_TAPE):
        return LocalView()(g)
    v = Tensor._wrap(g._data, g._device)
    v._node, v._out_idx = g._node, g._out_idx
    return v


class GlobalToLocal(Function):
    """``to_local``: the piece, as a local tensor; backward: the local gradient (a piece in
    ``grad_layout``, default the forward layout) moved to the adjoint layout. With the default
    on a broadcast mesh dimension the ranks' gradients must agree (checked, see
    :func:`check_replicated_grad`)."""

    def forward(self, v, layout, shape, copy, grad_layout=None):
        self.layout, self.shape, self.grad_layout = layout, shape, grad_layout
        return v._data.copy() if copy else v._data

    def backward(self, dy):
        src = self.layout if self.grad_layout is None else self.grad_layout
        if self.grad_layout is None:
            check_replicated_grad(dy._data, self.layout, self.shape)
        g = box(dy._data, src, self.layout.adjoint(), self.shape, "to_local (backward)")
        return Tensor._wrap(g, dy._device), None, None, None, None


#: Relative difference above which two ranks' gradients of a broadcast tensor disagree.
REPLICATED_GRAD_RTOL = 1e-6


def check_replicated_grad(g, layout: Layout, shape) -> None:
    """Raise on every rank when the ranks along a broadcast mesh dimension of ``layout`` hold
    different local gradients ``g``. Cheap: two float64 numbers per rank (the sum and a weighted
    sum of ``g``) are all-gathered over each broadcast slice of the placement."""
    placement, me = layout.placement, get_rank()
    if me not in placement:
        return
    flat = to_numpy(g).astype(np.float64, copy=False).reshape(-1)
    weights = 1.0 + (np.arange(flat.size) % 7) / 7.0  # sees a permutation the sum would miss
    mine = np.array([flat.sum(), flat @ weights, np.abs(flat).sum()])
    for d, s in enumerate(layout.sbp):
        group = placement.slice_group(d, me) if s.kind == "B" else None
        if group is None:
            continue
        prints = np.stack(comm.all_gather(mine, group))
        scale = max(float(np.abs(prints[:, 2]).max()), np.finfo(np.float64).tiny)
        if np.abs(prints[:, :2] - prints[0, :2]).max() > REPLICATED_GRAD_RTOL * scale:
            raise RuntimeError(
                f"to_local (backward): ranks {placement.slice_ranks(d, me)} computed different "
                f"gradients for the broadcast tensor of shape {tuple(shape)} on {placement} (sbp "
                f"{tuple(layout.sbp)}), so their losses differ; the default keeps only the value "
                "a replicated loss would give. To sum every rank's contribution, take the local "
                "tensor with to_local(grad_sbp=mg.sbp.partial_sum)"
            )


class LocalToGlobal(Function):
    """``to_global`` of a local tensor: its data is this rank's piece, except that on broadcast
    mesh dimensions the first rank's data wins (it is broadcast along the mesh slice). Backward:
    the piece of the gradient in ``grad_layout`` (default: the forward layout, OneFlow's rule)."""

    def forward(self, x, layout: Layout, shape, grad_layout: Layout, copy: bool):
        self.layout, self.shape, self.grad_layout = layout, shape, grad_layout
        me = get_rank()
        if me not in layout.placement:
            return empty_piece(x.dtype, x.xp)
        data = _broadcast_dims(x._data, layout, shape)
        if data is not x._data and not copy and data.shape == x._data.shape:
            x._data[...] = data  # OneFlow: the other ranks' local tensors are overwritten
            return x._data
        return data.copy() if copy and data is x._data else data

    def backward(self, dy):
        if get_rank() not in self.layout.placement:
            return None, None, None, None, None
        g = box(dy._data, self.layout.adjoint(), self.grad_layout, self.shape,
                "to_global (backward)")
        return Tensor._wrap(g, dy._device), None, None, None, None


def _broadcast_dims(data, layout: Layout, shape):
    """The piece after the broadcast mesh dimensions took their slice's first rank's data."""
    pl, me = layout.placement, get_rank()
    for d, s in enumerate(layout.sbp):
        ranks = pl.slice_ranks(d, me)
        if s.kind != "B" or len(ranks) == 1:
            continue
        group = pl.slice_group(d, me)
        with lockstep.checked(pl, ranks, f"to_global (broadcast on mesh dimension {d})") as check:
            data = comm.broadcast(data.copy(), ranks[0], group, check=check)
    return data


_DTYPE_NAMES = {np.dtype(n).num: n for n in comm.DTYPES}


def _logical_shape(t: Tensor, layout: Layout, check_meta: bool, op: str) -> tuple:
    """The logical shape of pieces ``t`` laid out as ``layout``.

    With ``check_meta`` every rank of the job sends its piece's rank, dtype and shape (one small
    all-gather: every rank calls ``to_global``, ranks outside the placement learn the shape too);
    the placement's pieces must agree in rank and dtype and follow the balanced split, else an
    error names the rank. Without it, every piece is taken to have this rank's shape (OneFlow:
    only when all are equal)."""
    pl, me = layout.placement, get_rank()
    local = tuple(t._data.shape)
    if not check_meta or get_world_size() == 1:
        even = list(local)
        for s, k in zip(layout.sbp, pl.mesh_shape):
            if s.kind == "S":
                even[s.dim] *= k
        return tuple(even)
    meta = np.array([me in pl, np.dtype(t.dtype).num] + list(local), dtype=np.int64)
    rows = [np.asarray(r) for r in comm.all_gather(meta, None)]
    ref = next(row for r, row in enumerate(rows) if r in pl)
    shapes = {r: tuple(int(n) for n in rows[r][2:]) for r in pl.rank_list}
    for r in pl.rank_list:
        if len(shapes[r]) != len(ref) - 2 or rows[r][1] != ref[1]:
            first = pl.rank_list[0]
            raise ValueError(
                f"{op}: rank {r} passes a tensor of shape {shapes[r]} and dtype "
                f"{_DTYPE_NAMES.get(int(rows[r][1]), '?')}, rank {first} one of shape "
                f"{shapes[first]} and dtype {_DTYPE_NAMES.get(int(ref[1]), '?')} (check_meta: "
                "every rank must pass a tensor of the same rank and dtype)"
            )
    logical = list(shapes[pl.rank_list[0]])
    for axis in {s.dim for s in layout.sbp if s.kind == "S"}:
        dims = [d for d, s in enumerate(layout.sbp) if s.kind == "S" and s.dim == axis]
        total = 0
        for coord in np.ndindex(*[pl.mesh_shape[d] for d in dims]):
            at = [0] * pl.ndim
            for d, c in zip(dims, coord):
                at[d] = c
            total += shapes[pl.rank_at(at)][axis]
        logical[axis] = total
    logical = tuple(logical)
    for r in pl.rank_list:
        want = local_shape(logical, layout.sbp, pl.mesh_shape, pl.coord(r))
        if shapes[r] != want:
            raise ValueError(
                f"{op}: rank {r}'s piece has shape {shapes[r]}, but a logical shape {logical} "
                f"with sbp {layout.sbp} on {pl} gives it {want} (pieces must follow the "
                "balanced split: the first n % k ranks hold one row more)"
            )
    return logical


def local_to_global(t: Tensor, placement, sbp, *, grad_sbp=None, check_meta: bool = True,
                    copy: bool = False) -> GlobalTensor:
    """``t.to_global(placement, sbp, ...)`` for a local ``t`` (see ``Tensor.to_global``)."""
    layout = Layout(placement, as_nd_sbp(sbp, placement.ndim, t.ndim, "to_global"))
    grad_layout = layout if grad_sbp is None else Layout(
        placement, as_nd_sbp(grad_sbp, placement.ndim, t.ndim, "to_global(grad_sbp)"))
    shape = _logical_shape(t, layout, check_meta, "to_global")
    if get_rank() in placement:
        lockstep.record(placement, f"to_global(local) {shape} {describe(layout.sbp)}")
    out = LocalToGlobal()(t, layout, shape, grad_layout, bool(copy))
    return as_global(out, layout, shape)


def make_global(t: Tensor, placement, sbp, *, logical: bool) -> GlobalTensor:
    """Turn ``t`` itself into a global tensor (see ``Placement.make_global``)."""
    if t._node is not None:
        raise RuntimeError(
            "make_global: only leaf tensors (parameters, buffers, new tensors) can be made global "
            "in place; use .to_global(placement, sbp) on a computed tensor"
        )
    layout = Layout(placement, as_nd_sbp(sbp, placement.ndim, t.ndim, "to_global"))
    me = get_rank()
    if t.is_global:
        t._data = box(t._data, t._layout, layout, t._lshape, "Module.to_global")
        return as_global(t, layout, t._lshape)
    if logical:
        shape = tuple(t.shape)
        if me in placement:
            lockstep.record(placement, f"new tensor {shape} {describe(layout.sbp)}")
        t._data = piece_of(t._data, layout, me)
    else:
        shape = _logical_shape(t, layout, True, "to_global")
        if me in placement:
            lockstep.record(placement, f"to_global(local) {shape} {describe(layout.sbp)}")
            t._data = _broadcast_dims(t._data, layout, shape)
        else:
            t._data = empty_piece(t.dtype, t.xp)
    return as_global(t, layout, shape)


def local_row_chunks(x: GlobalTensor, n: int, op: str = "local_row_chunks") -> list:
    """``x``, a batch split along axis 0, cut into ``n`` micro-batches without communication:
    every rank cuts its own piece into ``n`` equal chunks and micro-batch ``m`` is made of every
    rank's ``m``-th chunk (its rows are not a contiguous slice of ``x``, which a mean over equal
    micro-batches does not mind). Every piece's rows must divide by ``n``. Differentiable."""
    pl = x.placement
    for coord in np.ndindex(*pl.mesh_shape):
        rows = local_shape(x.shape, x.sbp, pl.mesh_shape, coord)[0]
        if rows % n:
            raise ValueError(
                f"{op}: rank {pl.rank_at(coord)} holds {rows} rows of the batch of {x.shape[0]}, "
                f"not divisible into {n} micro-batches"
            )
    view = local_view(x)
    b = view.shape[0] // n if get_rank() in pl else 0
    shape = (x.shape[0] // n,) + tuple(x.shape[1:])
    return [as_global(view[m * b:(m + 1) * b], x._layout, shape) for m in range(n)]
