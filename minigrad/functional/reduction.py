"""Reductions over an ``axis`` (int, tuple or None) with ``keepdims``.

``sum``, ``max``/``min`` and ``prod`` are primitives; mean, var, std, norm and logsumexp are
compositions.
"""

from __future__ import annotations

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function, dispatches
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.dtypes import is_floating
from minigrad.functional._util import (
    accumulate_dtype,
    autocast_high,
    float_sum,
    normalize_axis,
    recording_backward,
)
from minigrad.functional.elementwise import _f, _t, exp, log, sqrt, where
from minigrad.functional.elementwise import abs as _abs
from minigrad.functional.shape import broadcast_to, expand_dims, reshape, transpose


def _restore(dy, axes, keepdims, shape):
    """Bring a reduced gradient back to the input shape (differentiable)."""
    if not keepdims and axes:
        dy = expand_dims(dy, sorted(axes))
    return broadcast_to(dy, shape)


class Sum(Function):
    """Sum over ``axes``; the gradient is ``dy`` broadcast back to the input's shape."""

    def forward(self, x, axes, keepdims):
        self.shape, self.axes, self.keepdims = x.shape, axes, keepdims
        dtype = accumulate_dtype(x._data.dtype)
        if is_floating(dtype):
            return float_sum(x.xp, x._data, axes, keepdims)
        return x.xp.sum(x._data, axis=axes, keepdims=keepdims, dtype=dtype)

    def backward(self, dy):
        return _restore(dy, self.axes, self.keepdims, self.shape), None, None


class _Extremum(Function):
    """max/min: the gradient goes to the extremal entries, split evenly between ties."""

    def forward(self, x, axes, keepdims, fn):
        d = x._data
        out = fn(d, axis=axes, keepdims=True)
        mask = (d == out).astype(d.dtype)
        self.weight = mask / mask.sum(axis=axes, keepdims=True)
        self.axes, self.keepdims, self.shape = axes, keepdims, d.shape
        return out if keepdims else out.reshape([s for i, s in enumerate(d.shape) if i not in axes])

    def backward(self, dy):
        w = Tensor._wrap(self.weight, dy._device)
        return _restore(dy, self.axes, self.keepdims, self.shape) * w, None, None, None


class Prod(Function):
    """Product over ``axes``; the gradient is ``dy`` times the product of the *other* entries."""

    def forward(self, x, axes, keepdims):
        self.x, self.axes, self.keepdims = x, axes, keepdims
        dtype = accumulate_dtype(x._data.dtype)
        return x.xp.prod(x._data, axis=axes, keepdims=keepdims, dtype=dtype)

    def backward(self, dy):
        x, axes = self.x, self.axes
        g = _restore(dy, axes, self.keepdims, x.shape)
        if recording_backward():  # differentiable (O(n^2) memory) only when a 2nd order is wanted
            return g * _prod_of_others(x, axes), None, None
        # product of all *other* entries: exclusive cumulative products from both sides (zero-safe)
        xp, d = x.xp, x._data
        moved = xp.moveaxis(d, axes, tuple(range(d.ndim - len(axes), d.ndim)))
        flat = moved.reshape(moved.shape[: d.ndim - len(axes)] + (-1,))
        ones = xp.ones(flat.shape[:-1] + (1,), d.dtype)
        left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
        right = xp.cumprod(xp.concatenate([ones, flat[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
        others = (left * right).reshape(moved.shape)
        others = xp.moveaxis(others, tuple(range(d.ndim - len(axes), d.ndim)), axes)
        return g * Tensor._wrap(xp.ascontiguousarray(others), x._device), None, None


def _prod_of_others(x: Tensor, axes: tuple) -> Tensor:
    """For every entry, the product of the other entries along ``axes``, built from recorded ops:
    an (..., n, n) copy with the diagonal set to 1, reduced by ``prod`` (zero-safe)."""
    rest = [i for i in range(x.ndim) if i not in axes]
    perm = rest + list(axes)
    moved = transpose(x, perm)
    n = 1
    for a in axes:
        n *= x.shape[a]
    flat = reshape(moved, moved.shape[: len(rest)] + (n,))
    square = broadcast_to(expand_dims(flat, -2), flat.shape[:-1] + (n, n))
    eye = Tensor._wrap(x.xp.eye(n, dtype=bool), x._device)
    others = prod(where(eye, 1.0, square), axis=-1)
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return transpose(reshape(others, moved.shape), inverse)


def sum(inp, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (an int, a tuple, or None for all axes); ``keepdims`` keeps the reduced
    axes as size 1. Bool and small integer dtypes accumulate in int32.

    Example::

        F.sum(x, axis=1, keepdims=True)   # x (N, C) -> (N, 1)
    """
    x = _t(inp)
    if AUTOCAST.enabled:  # sums of many elements in float32 (see minigrad.autodiff.autocast)
        (x,) = autocast_high(x)
    axes = normalize_axis(axis, x.ndim, "sum", unique=True)
    return Sum()(x, axes, keepdims)


def mean(inp, axis=None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis`` (all axes when None); integer input gives float32.

    Example::

        loss = F.mean((pred - label) ** 2)
    """
    x = _f(inp)
    if AUTOCAST.enabled:  # sums of many elements in float32 (see minigrad.autodiff.autocast)
        (x,) = autocast_high(x)
    axes = normalize_axis(axis, x.ndim, "mean", unique=True)
    n = 1
    for a in axes:
        n *= x.shape[a]
    return Sum()(x, axes, keepdims) * (1.0 / n if n else float("nan"))


def _extremum(x, axis, keepdims, name):
    """max/min over ``axis``: the gradient is split evenly between tied extremal entries."""
    x = _t(x)
    if x.size == 0:
        raise ValueError(f"{name}: cannot reduce an empty tensor of shape {x.shape}")
    axes = normalize_axis(axis, x.ndim, name, unique=True)
    fn = x.xp.max if name == "max" else x.xp.min
    return _Extremum()(x, axes, keepdims, fn)


def max(inp, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The largest entry over ``axis`` (all axes when None); ties share the gradient evenly."""
    return _extremum(inp, axis, keepdims, "max")


def min(inp, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The smallest entry over ``axis`` (all axes when None); ties share the gradient evenly."""
    return _extremum(inp, axis, keepdims, "min")


def prod(inp, axis=None, keepdims: bool = False) -> Tensor:
    """The product over ``axis`` (all axes when None); its gradient is exact even with zeros."""
    x = _t(inp)
    return Prod()(x, normalize_axis(axis, x.ndim, "prod", unique=True), keepdims)


def var(inp, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance over ``axis`` (population by default, ``ddof=1`` for the unbiased estimate)."""
    x = _f(inp)
    axes = normalize_axis(axis, x.ndim, "var", unique=True)
    n = 1
    for a in axes:
        n *= x.shape[a]
    centered = x - mean(x, axes, keepdims=True)
    scale = 1.0 / (n - ddof) if n > ddof else float("nan")  # NumPy's answer, not ZeroDivisionError
    return sum(centered * centered, axes, keepdims) * scale


def std(inp, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Standard deviation over ``axis``: ``sqrt(var(...))`` with the same ``ddof``."""
    return sqrt(var(inp, axis, keepdims, ddof))


def norm(inp, ord: float | None = 2, axis=None,  # noqa: A002
         keepdims: bool = False) -> Tensor:
    """Vector p-norm over ``axis`` (the flattened tensor when None): ``ord`` 2 (also None, as in
    MegEngine), 1, ``inf``, 0 (count of non-zeros) or any other p."""
    x = _f(inp)
    ord = 2 if ord is None else ord
    if ord == 2:
        return sqrt(sum(x * x, axis, keepdims))
    if ord == 1:
        return sum(_abs(x), axis, keepdims)
    if ord == float("inf"):
        return max(_abs(x), axis, keepdims)
    if ord == 0:
        return sum((x != 0).astype(x.dtype), axis, keepdims)
    return sum(_abs(x) ** ord, axis, keepdims) ** (1.0 / ord)


def normalize(inp, ord: float | None = None, axis=None,  # noqa: A002
              eps: float = 1e-12) -> Tensor:
    """``inp / max(norm(inp, ord, axis), eps)``: every vector along ``axis`` (the whole tensor
    when None) scaled to unit ``ord``-norm (2 when None, as in MegEngine); ``eps`` keeps an
    all-zero vector at zero instead of dividing by zero."""
    x = _f(inp)
    n = norm(x, ord, axis, keepdims=True)
    return x / where(n > eps, n, eps)


def logsumexp(inp, axis=None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, computed stably by shifting by the (constant) maximum."""
    x = _f(inp)
    axes = normalize_axis(axis, x.ndim, "logsumexp", unique=True)
    with x._device.context():
        m = x.xp.max(x._data, axis=axes, keepdims=True)
        m = Tensor._wrap(x.xp.where(x.xp.isfinite(m), m, 0), x._device)
    out = log(sum(exp(x - m), axes, keepdims=True)) + m
    if not keepdims:
        out = out.reshape([s for i, s in enumerate(out.shape) if i not in axes])
    return out


def argmax(inp, axis=None, keepdims: bool = False) -> Tensor:
    """The int32 index of the largest entry along ``axis`` (of the flattened tensor when None);
    the first one at a tie. Not differentiable. Several axes are reduced one after another, the
    last first, each step taking the argmax of the previous step's indices (MegEngine's rule)."""
    return _arg(inp, axis, keepdims, "argmax")


def argmin(inp, axis=None, keepdims: bool = False) -> Tensor:
    """The int32 index of the smallest entry along ``axis`` (flattened when None; several axes as
    in :func:`argmax`)."""
    return _arg(inp, axis, keepdims, "argmin")


class ArgExtremum(Function):
    """argmax/argmin (``name``) along ``axis`` (None: of the flattened tensor): int32 indices,
    not differentiable (a Function so that tensors with their own dispatch see it)."""

    def forward(self, x, axis, keepdims, name):
        fn = getattr(x.xp, name)
        if axis is None:
            out = fn(x._data.reshape(-1))
            if keepdims:
                out = out.reshape((1,) * x.ndim)
        else:
            out = fn(x._data, axis=axis)
            if keepdims:
                out = x.xp.expand_dims(out, axis)
        return x.xp.asarray(out).astype("int32")

    def backward(self, dy):
        return None, None, None, None


def _arg(x, axis, keepdims, name):
    x = _t(x)
    if isinstance(axis, (tuple, list)) and len(axis) > 1:
        for a in sorted(normalize_axis(axis, x.ndim, name, unique=True), reverse=True):
            x = _arg(x, a, keepdims, name)
        return x
    if axis is not None:
        (axis,) = normalize_axis(axis, x.ndim, name, unique=True)
    if dispatches((x,)):
        return ArgExtremum()(x, axis, keepdims, name)
    with x._device.context():
        return Tensor._wrap(ArgExtremum().forward(x, axis, keepdims, name), x._device)
