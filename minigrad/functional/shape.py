"""Shape and indexing ops. Primitives: reshape, transpose, broadcast_to, sum_to, getitem (and its
adjoint index_add), concat, split, pad, gather, scatter, cumsum. Everything else is a composition.
Keyword names are MegEngine's (``inp``, ``target_shape``, ``pattern``, ``inps``, ``src``...)."""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor, raw_index
from minigrad.backend.device_checks import check_range
from minigrad.backend.xp import scatter_add
from minigrad.functional._util import (
    accumulate_dtype,
    check_compatible,
    float_sum,
    normalize_axis,
)


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _shape_arg(shape) -> tuple:
    """A shape given as an int, a sequence or a Tensor, as a tuple of ints."""
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


# -------------------------------------------------------------------------------------------------
# views


class Reshape(Function):
    """A reshape; the gradient is reshaped back."""

    def forward(self, x, shape):
        self.shape = x.shape
        return x._data.reshape(shape)

    def backward(self, dy):
        return reshape(dy, self.shape), None


class Transpose(Function):
    """An axis permutation; the gradient takes the inverse permutation."""

    def forward(self, x, axes):
        self.axes = axes
        return x._data.transpose(axes)

    def backward(self, dy):
        inverse = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inverse[a] = i
        return transpose(dy, inverse), None


class BroadcastTo(Function):
    """A broadcast; the gradient is summed back (``sum_to``)."""

    def forward(self, x, shape):
        self.shape = x.shape
        return x.xp.broadcast_to(x._data, shape)

    def backward(self, dy):
        return sum_to(dy, self.shape), None


class SumTo(Function):
    """A sum down to a smaller shape (broadcast's adjoint); the gradient is broadcast back."""

    def forward(self, x, shape):
        self.shape = x.shape
        d = x._data
        lead = d.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(shape) if s == 1 and d.shape[lead + i] != 1
        )
        out = float_sum(x.xp, d, axes, True) if axes else d
        return out.reshape(shape)

    def backward(self, dy):
        return broadcast_to(dy, self.shape), None


def reshape(inp, target_shape) -> Tensor:
    """``inp`` with shape ``target_shape`` (one entry may be -1: inferred); the element count
    must match. A view when it can be.

    Example::

        F.reshape(x, (x.shape[0], -1))   # flatten all but the batch axis
    """
    x = _t(inp)
    shape = _shape_arg(target_shape)
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if shape.count(-1) > 1 or (
        (-1 in shape and (known == 0 or x.size % known)) or (-1 not in shape and known != x.size)
    ):
        raise ValueError(f"reshape: cannot reshape a tensor of shape {x.shape} into {shape}")
    if x.shape == shape:
        return x
    return Reshape()(x, shape)


def transpose(inp, pattern=None) -> Tensor:
    """Permute the axes: output axis ``i`` is input axis ``pattern[i]`` (reversed order when
    ``pattern`` is None)."""
    x = _t(inp)
    axes = tuple(range(x.ndim))[::-1] if pattern is None else tuple(int(a) for a in pattern)
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: pattern {pattern} is not a permutation of {x.ndim} axes")
    axes = tuple(a % x.ndim for a in axes)
    return Transpose()(x, axes)


def swapaxes(inp, axis1: int, axis2: int) -> Tensor:
    """``inp`` with axes ``axis1`` and ``axis2`` exchanged."""
    x = _t(inp)
    axis1, axis2 = normalize_axis((axis1, axis2), x.ndim, "swapaxes")
    axes = list(range(x.ndim))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return transpose(x, axes)


def _broadcast_shape_arg(have: tuple, shape) -> tuple:
    """``broadcast_to``'s target as ints: a ``None`` entry keeps the input's size on that axis
    (axes aligned from the right, MegEngine's rule); it must name an existing axis."""
    if isinstance(shape, (Tensor, int)) or not any(s is None for s in shape):
        return _shape_arg(shape)
    shape = tuple(shape)
    offset = len(shape) - len(have)
    out = []
    for i, s in enumerate(shape):
        if s is None:
            if i < offset:
                raise ValueError(f"broadcast_to: None at position {i} of {shape} names no axis "
                                 f"of the input of shape {have}")
            s = have[i - offset]
        out.append(int(s))
    return tuple(out)


def broadcast_to(inp, shape) -> Tensor:
    """``inp`` repeated along new leading axes and size-1 axes to ``shape`` (NumPy's rule); the
    gradient sums back. A ``None`` in ``shape`` keeps the input's size on that axis."""
    x = _t(inp)
    shape = _broadcast_shape_arg(x.shape, shape)
    if x.shape == shape:
        return x
    ok = len(shape) >= x.ndim and all(
        s == t or s == 1 for s, t in zip(x.shape[::-1], shape[::-1], strict=False)
    )
    if not ok:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    return BroadcastTo()(x, shape)


def sum_to(x, shape) -> Tensor:
    """Sum a broadcast tensor back down to ``shape`` (the adjoint of broadcast_to): how the
    engine reduces a broadcast operand's gradient."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return SumTo()(x, shape)


def expand_dims(inp, axis) -> Tensor:
    """``inp`` with new size-1 axes at ``axis`` (an int or a sequence, positions in the result)."""
    x = _t(inp)
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = sorted(normalize_axis(axes, x.ndim + len(axes), "expand_dims"))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


def squeeze(inp, axis=None) -> Tensor:
    """``inp`` without its size-1 axes (only those in ``axis`` when given; each must be 1)."""
    x = _t(inp)
    if axis is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    else:
        axes = list(normalize_axis(axis, x.ndim, "squeeze"))
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(
                    f"squeeze: axis {a} has size {x.shape[a]}, expected 1 (shape {x.shape})"
                )
    return reshape(x, [s for i, s in enumerate(x.shape) if i not in axes])


def flatten(inp, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    """Merge axes ``start_axis..end_axis`` (inclusive) into one."""
    x = _t(inp)
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = start_axis % x.ndim, end_axis % x.ndim
    n = 1
    for s in x.shape[start : end + 1]:
        n *= s
    return reshape(x, x.shape[:start] + (n,) + x.shape[end + 1 :])


# -------------------------------------------------------------------------------------------------
# indexing


def _is_basic(index) -> bool:
    """Whether ``index`` has no arrays (so it selects each element at most once)."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class GetItem(Function):
    """``x[index]``; the gradient is scattered back into zeros (``IndexAdd``)."""

    def forward(self, x, index):
        self.shape, self.dtype, self.index = x.shape, x.dtype, index
        return x._data[index]

    def backward(self, dy):
        return IndexAdd()(dy, self.shape, self.index), None


class IndexAdd(Function):
    """Scatter ``v`` into zeros of ``shape`` at ``index`` (summing repeats): getitem's adjoint."""

    def forward(self, v, shape, index):
        self.index = index
        xp = v.xp
        out = xp.zeros(shape, v.dtype)
        if _is_basic(index):
            out[index] = v._data
        else:
            scatter_add(xp, out, index, v._data)
        return out

    def backward(self, dz):
        return getitem(dz, self.index), None, None


def getitem(inp, index) -> Tensor:
    """``inp[index]`` for basic, integer-array and boolean indices, differentiable (what
    ``Tensor.__getitem__`` runs)."""
    x = _t(inp)
    raw = raw_index(index)
    try:
        return GetItem()(x, raw)
    except IndexError as exc:
        raise IndexError(
            f"getitem: index {index!r} is invalid for shape {x.shape}: {exc}"
        ) from None


class Concat(Function):
    """Concatenation along ``axis``; each input's gradient is its slice of ``dy``."""

    def forward(self, axis, *xs):
        self.axis = axis
        self.sizes = [x.shape[axis] for x in xs]
        return xs[0].xp.concatenate([x._data for x in xs], axis=axis)

    def backward(self, dy):
        grads, start = [None], 0
        for n in self.sizes:
            index = (slice(None),) * self.axis + (slice(start, start + n),)
            grads.append(getitem(dy, index))
            start += n
        return tuple(grads)


def concat(inps, axis: int = 0, device=None) -> Tensor:
    """Join tensors along an existing ``axis``; the other axes must match. ``device`` (MegEngine's
    argument) copies the inputs there first, so they may come from different devices; without it
    they must share one, which is where the result is.

    Example::

        F.concat([a, b], axis=1)   # (N, 3) and (N, 5) -> (N, 8)
    """
    inps = [_t(x) if device is None else _t(x).to(device) for x in inps]
    if not inps:
        raise ValueError("concat: needs at least one tensor")
    (axis,) = normalize_axis(axis, inps[0].ndim, "concat")
    check_compatible("concat", *inps, broadcast=False)
    ref = inps[0]
    for i, x in enumerate(inps):
        if x.ndim != ref.ndim or any(
            a != b for k, (a, b) in enumerate(zip(x.shape, ref.shape, strict=True)) if k != axis
        ):
            raise ValueError(
                f"concat: tensor {i} has shape {x.shape}, incompatible with {ref.shape} "
                f"along axis {axis}"
            )
    return inps[0] if len(inps) == 1 else Concat()(axis, *inps)


def stack(inps, axis: int = 0, device=None) -> Tensor:
    """Join same-shaped tensors along a new ``axis``; ``device`` as in :func:`concat`."""
    inps = [_t(x) if device is None else _t(x).to(device) for x in inps]
    shapes = {x.shape for x in inps}
    if len(shapes) != 1:
        raise ValueError(f"stack: all tensors must have the same shape, got {sorted(shapes)}")
    check_compatible("stack", *inps, broadcast=False)
    return concat([expand_dims(x, axis) for x in inps], axis=axis, device=device)


class Split(Function):
    """Consecutive slices along one axis as one node (several outputs). Its backward concatenates
    the slices' gradients into one buffer, where separate ``getitem`` nodes would each scatter
    into a zero tensor of the full shape and then be summed."""

    def forward(self, x, axis, bounds):
        self.axis, self.bounds = axis, bounds
        lead = (slice(None),) * axis
        return tuple(x._data[lead + (slice(a, b),)] for a, b in zip(bounds[:-1], bounds[1:]))

    def backward(self, *dys):
        like = next(d for d in dys if d is not None)  # slices that got no gradient get zeros
        parts = []
        for d, a, b in zip(dys, self.bounds[:-1], self.bounds[1:]):
            if d is None:
                shape = like.shape[: self.axis] + (b - a,) + like.shape[self.axis + 1 :]
                d = Tensor._wrap(like.xp.zeros(shape, like.dtype), like._device)
            parts.append(d)
        return concat(parts, self.axis), None, None


def split(inp, nsplits_or_sections, axis: int = 0) -> list:
    """Split into ``n`` parts (int) or at the given indices (list), MegEngine style: ``n`` parts
    of sizes ``ceil`` then ``floor`` of ``size / n`` (20 rows in 3 parts: 7, 7, 6)."""
    x = _t(inp)
    (axis,) = normalize_axis(axis, x.ndim, "split")
    size = x.shape[axis]
    if isinstance(nsplits_or_sections, int):
        points = _split_points(size, nsplits_or_sections, axis)
    else:
        points = list(nsplits_or_sections)
    bounds = [0] + points + [size]
    if not all(0 <= a <= b <= size for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(f"split: sections {points} are not increasing within size {size}")
    return list(Split()(x, axis, tuple(bounds)))


class Pad(Function):
    """Constant padding; the gradient is the unpadded interior of ``dy``."""

    def forward(self, x, pad_width, value):
        self.index = tuple(slice(lo, lo + s) for (lo, _), s in zip(pad_width, x.shape, strict=True))
        return x.xp.pad(x._data, pad_width, mode="constant", constant_values=value)

    def backward(self, dy):
        return getitem(dy, self.index), None, None


def pad(src, pad_width, mode: str = "constant", constant_value: float = 0.0) -> Tensor:
    """Pad the leading axes by ``pad_width`` = ((before, after), ...) (axes it does not list are
    left alone). ``mode`` is ``"constant"`` (fill with ``constant_value``), ``"reflect"`` (mirror
    without repeating the edge: ``3 2 | 1 2 3``) or ``"replicate"``/``"edge"`` (repeat the edge
    value)."""
    x = _t(src)
    pw = tuple((int(a), int(b)) for a, b in pad_width)
    if len(pw) > x.ndim:
        raise ValueError(f"pad: pad_width has {len(pw)} entries for a tensor of rank {x.ndim}")
    pw += ((0, 0),) * (x.ndim - len(pw))  # MegEngine: unlisted trailing axes are not padded
    if mode.lower() != "constant":
        return _pad_by_index(x, pw, mode)
    return Pad()(x, pw, constant_value)


def repeat(inp, repeats: int, axis=None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (flattened when None)."""
    x = _t(inp)
    if axis is None:
        x, axis = flatten(x), 0
    (axis,) = normalize_axis(axis, x.ndim, "repeat")
    e = expand_dims(x, axis + 1)
    shape = list(e.shape)
    shape[axis + 1] = repeats
    out_shape = list(x.shape)
    out_shape[axis] *= repeats
    return reshape(broadcast_to(e, shape), out_shape)


def tile(inp, reps) -> Tensor:
    """``inp`` repeated ``reps[i]`` times along axis ``i`` (``reps`` is padded with leading 1s,
    or ``inp`` with leading axes, to the same length)."""
    x = _t(inp)
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    nd = max(x.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    x = reshape(x, (1,) * (nd - x.ndim) + x.shape)
    inter, target, out = [], [], []
    for r, s in zip(reps, x.shape, strict=True):
        inter += [1, s]
        target += [r, s]
        out.append(r * s)
    return reshape(broadcast_to(reshape(x, inter), target), out)


def _along_axis(xp, index, axis):
    """Full fancy index selecting ``index`` along ``axis`` and everything else in place."""
    grids = []
    for a, n in enumerate(index.shape):
        if a == axis:
            grids.append(index)
        else:
            shape = [1] * index.ndim
            shape[a] = n
            grids.append(xp.arange(n).reshape(shape))
    return tuple(grids)


def _check_index(op, x, axis, index):
    if index.dtype.kind not in "iu":
        raise TypeError(f"{op}: index must be an integer tensor, got dtype {index.dtype}")
    if index.ndim != x.ndim:
        raise ValueError(f"{op}: index rank {index.ndim} must equal input rank {x.ndim}")
    if any(i > n for d, (i, n) in enumerate(zip(index.shape, x.shape, strict=True)) if d != axis):
        raise ValueError(
            f"{op}: index shape {index.shape} exceeds input shape {x.shape} outside axis {axis}"
        )
    if index._device != x._device:
        raise RuntimeError(
            f"{op}: index is on {index._device} but the input is on {x._device} "
            f"(shapes {index.shape} and {x.shape})"
        )
    n = x.shape[axis]
    check_range(index._data, -n, n, lambda lo, hi: IndexError(
        f"{op}: index out of range for axis {axis} of size {n} (got min {lo} max {hi})"))


def gather(inp, axis: int, index) -> Tensor:
    """``out[..., i, ...] = inp[..., index[..., i, ...], ...]`` along ``axis`` (take_along_axis)."""
    inp, index = _t(inp), _t(index)
    (axis,) = normalize_axis(axis, inp.ndim, "gather")
    _check_index("gather", inp, axis, index)
    with inp._device.context():
        index = _along_axis(inp.xp, index._data, axis)
    return getitem(inp, index)


class Scatter(Function):
    """``inp`` with ``source`` written at ``index``; ``dy`` flows to ``source`` there and to
    ``inp`` elsewhere."""

    def forward(self, inp, source, index):
        self.index = index
        out = inp._data.copy()
        out[index] = source._data
        return out

    def backward(self, dy):
        keep = dy.xp.ones(dy.shape, dy.dtype)
        keep[self.index] = 0
        return dy * Tensor._wrap(keep, dy._device), getitem(dy, self.index), None


def scatter(inp, axis: int, index, source) -> Tensor:
    """A copy of ``inp`` with ``source`` written at ``index`` along ``axis`` (gather's inverse)."""
    inp, index, source = _t(inp), _t(index), _t(source)
    (axis,) = normalize_axis(axis, inp.ndim, "scatter")
    _check_index("scatter", inp, axis, index)
    if source.shape != index.shape:
        raise ValueError(
            f"scatter: source shape {source.shape} must equal index shape {index.shape}"
        )
    with inp._device.context():
        index = _along_axis(inp.xp, index._data, axis)
    return Scatter()(inp, source.astype(inp.dtype), index)


def indexing_one_hot(src, index, axis: int = 1, keepdims: bool = False) -> Tensor:
    """Pick ``src[..., index, ...]`` along ``axis`` at every position (MegEngine's name)."""
    src, index = _t(src), _t(index)
    (axis,) = normalize_axis(axis, src.ndim, "indexing_one_hot")
    out = gather(src, axis, expand_dims(index, axis))
    return out if keepdims else squeeze(out, axis)


class Cumsum(Function):
    """Running sums along ``axis``; the gradient is the reversed running sum of ``dy``."""

    def forward(self, x, axis):
        self.axis = axis
        return x.xp.cumsum(x._data, axis=axis, dtype=accumulate_dtype(x._data.dtype))

    def backward(self, dy):
        flip = (slice(None),) * self.axis + (slice(None, None, -1),)
        return getitem(cumsum(getitem(dy, flip), self.axis), flip), None


def cumsum(inp, axis: int) -> Tensor:
    """Running sums along ``axis`` (small integer dtypes accumulate in int32)."""
    x = _t(inp)
    (axis,) = normalize_axis(axis, x.ndim, "cumsum")
    return Cumsum()(x, axis)


def argsort(inp, descending: bool = False) -> Tensor:
    """Indices that sort the last axis (int32, stable)."""
    x = _t(inp)
    with x._device.context():
        d = -x._data if descending else x._data
        return Tensor._wrap(x.xp.argsort(d, axis=-1, kind="stable").astype("int32"), x._device)


def sort(inp, descending: bool = False, dim: int = -1):
    """(sorted values, int32 indices) along axis ``dim`` (default: the last); the values are
    differentiable, and equal entries keep their order."""
    x = _t(inp)
    (dim,) = normalize_axis(dim, x.ndim, "sort")
    if dim != x.ndim - 1:
        values, idx = sort(swapaxes(x, dim, -1), descending)
        return swapaxes(values, dim, -1), swapaxes(idx, dim, -1)
    idx = argsort(x, descending)
    return gather(x, x.ndim - 1, idx), idx


def topk(inp, k: int, descending: bool = False, kth_only: bool = False,
         no_sort: bool = False):
    """The ``k`` smallest (or largest with ``descending=True``) entries of the last axis, MegEngine
    style: returns (values, indices), or just the k-th value/index pair with ``kth_only``.
    ``no_sort`` is accepted for MegEngine's signature; the entries come sorted either way."""
    x = _t(inp)
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"topk: k={k} out of range for last axis of size {n}")
    idx = argsort(x, descending)
    sel = (Ellipsis, slice(k - 1, k)) if kth_only else (Ellipsis, slice(0, k))
    idx = Tensor._wrap(idx._data[sel], x._device)
    vals = gather(x, x.ndim - 1, idx)
    if kth_only:
        return squeeze(vals, -1), squeeze(idx, -1)
    return vals, idx


# -------------------------------------------------------------------------------------------------
# MegEngine's other tensor ops: roll, cond_take, non_zero, diag, pixel_shuffle, and the helpers of
# split's and pad's MegEngine semantics


def _split_points(size: int, n: int, axis: int) -> list:
    """Cut points of ``n`` parts whose sizes are ``ceil((size - i) / n)`` (array_split's rule)."""
    if not 0 < n <= max(size, 1):
        raise ValueError(f"split: axis {axis} of size {size} cannot be split into {n} parts")
    points, start = [], 0
    for i in range(n - 1):
        start += (size + n - i - 1) // n
        points.append(start)
    return points


def _pad_by_index(x: Tensor, pad_width: tuple, mode: str) -> Tensor:
    """Reflect/replicate padding as one gather per padded axis: the source index of every output
    position is NumPy's padding of ``arange(n)``, so the gradient (getitem's scatter-add) sums the
    mirrored copies back onto the input."""
    np_mode = {"reflect": "reflect", "replicate": "edge", "edge": "edge"}.get(mode.lower())
    if np_mode is None:
        raise ValueError(
            f"pad: mode must be 'constant', 'reflect', 'replicate' or 'edge', got {mode!r}"
        )
    for axis, (lo, hi) in enumerate(pad_width):
        if lo == hi == 0:
            continue
        n = x.shape[axis]
        if n == 0 or (np_mode == "reflect" and n == 1):
            raise ValueError(f"pad: cannot {mode}-pad axis {axis} of size {n}")
        with x._device.context():
            src = x.xp.pad(x.xp.arange(n), (lo, hi), mode=np_mode)
        x = getitem(x, (slice(None),) * axis + (src,))
    return x


def roll(inp, shift, axis=None) -> Tensor:
    """Shift elements along ``axis`` (ints or tuples of equal length), wrapping around; with
    ``axis=None`` the flattened tensor is rolled and reshaped back. Differentiable.

    Example::

        F.roll(mg.tensor([[1, 2], [3, 4], [5, 6]]), 1, 0)  # [[5, 6], [1, 2], [3, 4]]
    """
    x = _t(inp)
    shape = x.shape
    if axis is None:
        x, axis = flatten(x), 0
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: {len(shifts)} shifts given for {len(axes)} axes")
    for s, a in zip(shifts, normalize_axis(axes, x.ndim, "roll")):
        n = x.shape[a]
        s = int(s) % n if n else 0
        if s:
            lead = (slice(None),) * a
            x = concat([getitem(x, lead + (slice(n - s, n),)),  # the last s move to the front
                        getitem(x, lead + (slice(0, n - s),))], a)
    return reshape(x, shape)


def cond_take(mask, x):
    """``(values, indices)``: the elements of ``x`` where the bool ``mask`` (same shape) is true,
    and their int32 positions in the flattened tensor. ``values`` is differentiable.

    Example::

        v, i = F.cond_take(x > 0, x)  # both 1-D
    """
    x, mask = _t(x), _t(mask)
    if mask.dtype.kind != "b":
        raise TypeError(f"cond_take: mask must be a bool tensor, got dtype {mask.dtype}")
    if mask.shape != x.shape:
        raise ValueError(f"cond_take: mask shape {mask.shape} differs from input shape {x.shape}")
    check_compatible("cond_take", x, mask, broadcast=False)
    with x._device.context():
        index = x.xp.flatnonzero(mask._data).astype("int32")
    return getitem(flatten(x), index), Tensor._wrap(index, x._device)


def non_zero(condition, as_tuple: bool = False):
    """int32 indices of the non-zero elements of ``condition`` in C order: a ``(count, ndim)``
    tensor, or with ``as_tuple=True`` one 1-D tensor per axis (``numpy.nonzero``'s form)."""
    c = _t(condition)
    with c._device.context():
        per_axis = [Tensor._wrap(i.astype("int32"), c._device) for i in c.xp.nonzero(c._data)]
        if as_tuple:
            return tuple(per_axis)
        return Tensor._wrap(c.xp.stack([t._data for t in per_axis], axis=1), c._device)


def diag(inp, k: int = 0) -> Tensor:
    """A 1-D tensor becomes the ``k``-th diagonal of a square matrix (zeros elsewhere); a 2-D
    tensor gives its ``k``-th diagonal (``k > 0`` above the main one). Differentiable."""
    x = _t(inp)
    k = int(k)
    # host index arrays: CuPy copies them to the current device (the op's) when it indexes
    if x.ndim == 1:
        n = x.shape[0]
        m = n + abs(k)
        rows = np.arange(n) + max(-k, 0)
        return IndexAdd()(x, (m, m), (rows, rows + k))
    if x.ndim != 2:
        raise ValueError(f"diag: expected a 1-D or 2-D tensor, got shape {x.shape}")
    rows, cols = x.shape
    length = max(0, min(rows + min(k, 0), cols - max(k, 0)))
    start = np.arange(length)
    return getitem(x, (start + max(-k, 0), start + max(k, 0)))


def pixel_shuffle(inp, upscale_factor: int) -> Tensor:
    """Rearrange ``(..., C*r*r, H, W)`` into ``(..., C, H*r, W*r)`` (sub-pixel convolution's
    upsampling): output pixel ``(h*r + i, w*r + j)`` of channel ``c`` is input channel
    ``c*r*r + i*r + j`` at ``(h, w)``."""
    x = _t(inp)
    r = int(upscale_factor)
    if x.ndim < 3 or r < 1 or x.shape[-3] % (r * r):
        raise ValueError(
            f"pixel_shuffle: expected (..., C*{r}*{r}, H, W) with upscale_factor >= 1, "
            f"got shape {x.shape}"
        )
    *lead, c, h, w = x.shape
    c //= r * r
    y = reshape(x, (-1, c, r, r, h, w))
    y = transpose(y, (0, 1, 4, 2, 5, 3))
    return reshape(y, (*lead, c, h * r, w * r))
def _int_index(op: str, idx, device) -> Tensor:
    """``idx`` as an integer Tensor on ``device``; a TypeError naming ``op`` otherwise."""
    idx = idx if isinstance(idx, Tensor) else Tensor(np.asarray(idx), device=device)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be an integer tensor, got dtype {idx.dtype}")
    return idx


def one_hot(inp, num_classes: int) -> Tensor:
    """``int32`` one-hot encoding of an integer tensor: shape ``inp.shape + (num_classes,)``."""
    idx = _int_index("one_hot", inp, None)
    check_range(idx._data, 0, num_classes, lambda lo, hi: ValueError(
        f"one_hot: values must be in [0, {num_classes}), got min {lo} max {hi}"))
    xp = idx.xp
    with idx._device.context():
        out = (idx._data[..., None] == xp.arange(num_classes)).astype(np.int32)
    return Tensor._wrap(out, idx._device)
