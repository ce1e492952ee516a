"""Shape and indexing ops. Primitives: reshape, transpose, broadcast_to, sum_to, getitem (and its
adjoint index_add), concat, pad, gather, scatter, cumsum. Everything else is a composition."""

from __future__ import annotations

from minigrad.autodiff.function import Function
from minigrad.functional._util import accumulate_dtype, check_compatible, normalize_axis
from minigrad.tensor import Tensor, raw_index


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _shape_arg(shape) -> tuple:
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


# -------------------------------------------------------------------------------------------------
# views


class Reshape(Function):
    def forward(self, x, shape):
        self.shape = x.shape
        return x._data.reshape(shape)

    def backward(self, dy):
        return reshape(dy, self.shape), None


class Transpose(Function):
    def forward(self, x, axes):
        self.axes = axes
        return x._data.transpose(axes)

    def backward(self, dy):
        inverse = [0] * len(self.axes)
        for i, a in enumerate(self.axes):
            inverse[a] = i
        return transpose(dy, inverse), None


class BroadcastTo(Function):
    def forward(self, x, shape):
        self.shape = x.shape
        return x.xp.broadcast_to(x._data, shape)

    def backward(self, dy):
        return sum_to(dy, self.shape), None


class SumTo(Function):
    def forward(self, x, shape):
        self.shape = x.shape
        d = x._data
        lead = d.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(shape) if s == 1 and d.shape[lead + i] != 1
        )
        out = d.sum(axis=axes, keepdims=True) if axes else d
        return out.reshape(shape)

    def backward(self, dy):
        return broadcast_to(dy, self.shape), None


def reshape(x, shape) -> Tensor:
    """Reshape (one dimension may be -1); the element count must match."""
    x = _t(x)
    shape = _shape_arg(shape)
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


def transpose(x, pattern=None) -> Tensor:
    """Permute axes (reverse them when ``pattern`` is None)."""
    x = _t(x)
    axes = tuple(range(x.ndim))[::-1] if pattern is None else tuple(int(a) for a in pattern)
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: pattern {pattern} is not a permutation of {x.ndim} axes")
    axes = tuple(a % x.ndim for a in axes)
    return Transpose()(x, axes)


def swapaxes(x, axis1: int, axis2: int) -> Tensor:
    x = _t(x)
    axis1, axis2 = normalize_axis((axis1, axis2), x.ndim, "swapaxes")
    axes = list(range(x.ndim))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return transpose(x, axes)


def broadcast_to(x, shape) -> Tensor:
    x = _t(x)
    shape = _shape_arg(shape)
    if x.shape == shape:
        return x
    ok = len(shape) >= x.ndim and all(
        s == t or s == 1 for s, t in zip(x.shape[::-1], shape[::-1], strict=False)
    )
    if not ok:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    return BroadcastTo()(x, shape)


def sum_to(x, shape) -> Tensor:
    """Sum a broadcast tensor back down to ``shape`` (the adjoint of broadcast_to)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return SumTo()(x, shape)


def expand_dims(x, axis) -> Tensor:
    x = _t(x)
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = sorted(normalize_axis(axes, x.ndim + len(axes), "expand_dims"))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


def squeeze(x, axis=None) -> Tensor:
    x = _t(x)
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


def flatten(x, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    x = _t(x)
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
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


def scatter_add_(xp, target, index, values) -> None:
    """``target[index] += values`` with repeated indices accumulating (np.add.at semantics)."""
    if xp.__name__ == "numpy":
        xp.add.at(target, index, values)
    else:
        import cupyx  # noqa: PLC0415  (only reached with CuPy arrays)

        cupyx.scatter_add(target, index, values)


class GetItem(Function):
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
            scatter_add_(xp, out, index, v._data)
        return out

    def backward(self, dz):
        return getitem(dz, self.index), None, None


def getitem(x, index) -> Tensor:
    """``x[index]`` for basic, integer-array and boolean indices, differentiable."""
    x = _t(x)
    raw = raw_index(index)
    try:
        return GetItem()(x, raw)
    except IndexError as exc:
        raise IndexError(
            f"getitem: index {index!r} is invalid for shape {x.shape}: {exc}"
        ) from None


class Concat(Function):
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


def concat(inps, axis: int = 0) -> Tensor:
    inps = [_t(x) for x in inps]
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
    if len(inps) == 1:
        return inps[0]
    return Concat()(axis, *inps)


def stack(inps, axis: int = 0) -> Tensor:
    inps = [_t(x) for x in inps]
    shapes = {x.shape for x in inps}
    if len(shapes) != 1:
        raise ValueError(f"stack: all tensors must have the same shape, got {sorted(shapes)}")
    check_compatible("stack", *inps, broadcast=False)
    return concat([expand_dims(x, axis) for x in inps], axis=axis)


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


def split(x, nsplits_or_sections, axis: int = 0) -> list:
    """Split into ``n`` equal parts (int) or at the given indices (list), MegEngine style."""
    x = _t(x)
    (axis,) = normalize_axis(axis, x.ndim, "split")
    size = x.shape[axis]
    if isinstance(nsplits_or_sections, int):
        n = nsplits_or_sections
        if n <= 0 or size % n:
            raise ValueError(
                f"split: axis {axis} of size {size} cannot be split into {n} equal parts"
            )
        points = [size // n * i for i in range(1, n)]
    else:
        points = list(nsplits_or_sections)
    bounds = [0] + points + [size]
    if not all(0 <= a <= b <= size for a, b in zip(bounds[:-1], bounds[1:])):
        raise ValueError(f"split: sections {points} are not increasing within size {size}")
    return list(Split()(x, axis, tuple(bounds)))


class Pad(Function):
    def forward(self, x, pad_width, value):
        self.index = tuple(slice(lo, lo + s) for (lo, _), s in zip(pad_width, x.shape, strict=True))
        return x.xp.pad(x._data, pad_width, mode="constant", constant_values=value)

    def backward(self, dy):
        return getitem(dy, self.index), None, None


def pad(x, pad_width, mode: str = "constant", constant_value: float = 0.0) -> Tensor:
    """Constant padding; ``pad_width`` is ((before, after), ...) per axis."""
    x = _t(x)
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not supported (only 'constant')")
    pw = tuple((int(a), int(b)) for a, b in pad_width)
    if len(pw) != x.ndim:
        raise ValueError(f"pad: pad_width has {len(pw)} entries for a tensor of rank {x.ndim}")
    return Pad()(x, pw, constant_value)


def repeat(x, repeats: int, axis=None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (flattened when None)."""
    x = _t(x)
    if axis is None:
        x, axis = flatten(x), 0
    (axis,) = normalize_axis(axis, x.ndim, "repeat")
    e = expand_dims(x, axis + 1)
    shape = list(e.shape)
    shape[axis + 1] = repeats
    out_shape = list(x.shape)
    out_shape[axis] *= repeats
    return reshape(broadcast_to(e, shape), out_shape)


def tile(x, reps) -> Tensor:
    x = _t(x)
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
    if index.size and (
        int(index._data.min()) < -x.shape[axis] or int(index._data.max()) >= x.shape[axis]
    ):
        raise IndexError(f"{op}: index out of range for axis {axis} of size {x.shape[axis]}")


def gather(inp, axis: int, index) -> Tensor:
    """``out[..., i, ...] = inp[..., index[..., i, ...], ...]`` along ``axis`` (take_along_axis)."""
    inp, index = _t(inp), _t(index)
    (axis,) = normalize_axis(axis, inp.ndim, "gather")
    _check_index("gather", inp, axis, index)
    return getitem(inp, _along_axis(inp.xp, index._data, axis))


class Scatter(Function):
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
    return Scatter()(inp, source.astype(inp.dtype), _along_axis(inp.xp, index._data, axis))


def indexing_one_hot(src, index, axis: int = 1, keepdims: bool = False) -> Tensor:
    """Pick ``src[..., index, ...]`` along ``axis`` at every position (MegEngine's name)."""
    src, index = _t(src), _t(index)
    (axis,) = normalize_axis(axis, src.ndim, "indexing_one_hot")
    out = gather(src, axis, expand_dims(index, axis))
    return out if keepdims else squeeze(out, axis)


class Cumsum(Function):
    def forward(self, x, axis):
        self.axis = axis
        return x.xp.cumsum(x._data, axis=axis, dtype=accumulate_dtype(x._data.dtype))

    def backward(self, dy):
        flip = (slice(None),) * self.axis + (slice(None, None, -1),)
        return getitem(cumsum(getitem(dy, flip), self.axis), flip), None


def cumsum(x, axis: int) -> Tensor:
    x = _t(x)
    (axis,) = normalize_axis(axis, x.ndim, "cumsum")
    return Cumsum()(x, axis)


def argsort(x, descending: bool = False) -> Tensor:
    """Indices that sort the last axis (int32)."""
    x = _t(x)
    d = -x._data if descending else x._data
    return Tensor._wrap(x.xp.argsort(d, axis=-1, kind="stable").astype("int32"), x._device)


def sort(x, descending: bool = False):
    """(sorted values, indices) along the last axis; values are differentiable."""
    x = _t(x)
    idx = argsort(x, descending)
    return gather(x, x.ndim - 1, idx), idx


def topk(x, k: int, descending: bool = False, kth_only: bool = False, no_sort: bool = False):
    """The ``k`` smallest (or largest with ``descending=True``) entries of the last axis, MegEngine
    style: returns (values, indices), or just the k-th value/index pair with ``kth_only``."""
    x = _t(x)
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
