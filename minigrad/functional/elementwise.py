"""Elementwise ops. Primitives own a ``backward`` right under their ``forward``; the rest are
compositions of primitives and get gradients for free.

Gradients of broadcast operands are reduced back to the operand's shape by the engine, so binary
backward functions simply return ``dy``-shaped gradients.
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.functional._util import (
    FLOAT32,
    binary_args,
    check_compatible,
    data,
    recording_backward,
)
from minigrad.tensor import Tensor

# -------------------------------------------------------------------------------------------------
# binary arithmetic


# The four arithmetic ops inline ``data()`` (``x._data`` for a Tensor, else the Python number): two
# calls fewer is about 0.3 us of the ~3 us a recorded op on a tiny tensor costs.


class Add(Function):
    def forward(self, a, b):
        return (a._data if isinstance(a, Tensor) else a) + (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        return dy, dy


class Sub(Function):
    def forward(self, a, b):
        return (a._data if isinstance(a, Tensor) else a) - (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        return dy, -dy


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return (a._data if isinstance(a, Tensor) else a) * (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        a, b = self.a, self.b
        return (dy * b if self.needs_input_grad(0) else None), (
            dy * a if self.needs_input_grad(1) else None
        )


class Div(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return (a._data if isinstance(a, Tensor) else a) / (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        a, b = self.a, self.b
        da = dy / b if self.needs_input_grad(0) else None
        db = -dy * a / (b * b) if self.needs_input_grad(1) else None
        return da, db


class Pow(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return data(a) ** data(b)

    def backward(self, dy):
        a, b = self.a, self.b
        da = db = None
        if isinstance(a, Tensor):
            da = dy * b * a ** (b - 1) if isinstance(b, Tensor) or b != 2 else dy * 2 * a
        if isinstance(b, Tensor):
            db = dy * a**b * log(a)
        return da, db


class Maximum(Function):
    def forward(self, a, b):
        self.mask = data(a) >= data(b)
        return (
            a.xp.maximum(data(a), data(b))
            if isinstance(a, Tensor)
            else b.xp.maximum(data(a), data(b))
        )

    def backward(self, dy):
        m = Tensor._wrap(self.mask, dy._device)
        return where(m, dy, 0.0), where(m, 0.0, dy)


class Minimum(Function):
    def forward(self, a, b):
        self.mask = data(a) <= data(b)
        return (
            a.xp.minimum(data(a), data(b))
            if isinstance(a, Tensor)
            else b.xp.minimum(data(a), data(b))
        )

    def backward(self, dy):
        m = Tensor._wrap(self.mask, dy._device)
        return where(m, dy, 0.0), where(m, 0.0, dy)


class Where(Function):
    def forward(self, cond, a, b):
        self.cond = cond
        xp = cond.xp
        return xp.where(cond._data, data(a), data(b))

    def backward(self, dy):
        zero = Tensor._wrap(dy.xp.zeros((), dy.dtype), dy._device)
        return None, where(self.cond, dy, zero), where(self.cond, zero, dy)


def add(x, y) -> Tensor:
    """``x + y`` with broadcasting."""
    return Add()(*binary_args(x, y, "add"))


def sub(x, y) -> Tensor:
    return Sub()(*binary_args(x, y, "sub"))


def mul(x, y) -> Tensor:
    return Mul()(*binary_args(x, y, "mul"))


def div(x, y) -> Tensor:
    """True division; integer operands are promoted to float32 first (as in MegEngine)."""
    x, y = binary_args(x, y, "div")
    if not any(isinstance(t, Tensor) and t.dtype.kind == "f" for t in (x, y)):
        x, y = (t.astype(FLOAT32) if isinstance(t, Tensor) else t for t in (x, y))
    return Div()(x, y)


def pow(x, y) -> Tensor:  # noqa: A001  (MegEngine's name)
    return Pow()(*binary_args(x, y, "pow"))


def maximum(x, y) -> Tensor:
    return Maximum()(*binary_args(x, y, "maximum"))


def minimum(x, y) -> Tensor:
    return Minimum()(*binary_args(x, y, "minimum"))


def where(mask, x, y) -> Tensor:
    """``x`` where ``mask`` is true, else ``y`` (differentiable in x and y)."""
    ref = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    if not isinstance(mask, Tensor):
        mask = Tensor(mask, device=ref._device if ref is not None else None)
    if mask.dtype != np.bool_:
        mask = Tensor._wrap(mask._data.astype(bool), mask._device)
    if ref is None:
        x = Tensor(x, device=mask._device)
    x, y = binary_args(x, y, "where")
    check_compatible("where", mask, *[t for t in (x, y) if isinstance(t, Tensor)])
    return Where()(mask, x, y)


def floor_div(x, y) -> Tensor:
    """``x // y`` (piecewise constant: not recorded)."""
    return _raw(lambda xp, a, b: xp.floor_divide(a, b), x, y, op="floor_div")


def mod(x, y) -> Tensor:
    """``x % y`` with Python's sign convention (not recorded)."""
    return _raw(lambda xp, a, b: xp.mod(a, b), x, y, op="mod")


# -------------------------------------------------------------------------------------------------
# unary math


def _saved_out(node, array, recompute):
    """The op's output for use in backward: the saved array normally, a recomputed (and thus
    recorded) tensor when backward is itself being differentiated."""
    if recording_backward():
        return recompute()
    return Tensor._wrap(array, node.x._device)


class Neg(Function):
    def forward(self, x):
        return -x._data

    def backward(self, dy):
        return -dy


class Exp(Function):
    def forward(self, x):
        self.x = x
        self.y = x.xp.exp(x._data)
        return self.y

    def backward(self, dy):
        return dy * _saved_out(self, self.y, lambda: exp(self.x))


class Log(Function):
    def forward(self, x):
        self.x = x
        return x.xp.log(x._data)

    def backward(self, dy):
        return dy / self.x


class Log1p(Function):
    def forward(self, x):
        self.x = x
        return x.xp.log1p(x._data)

    def backward(self, dy):
        return dy / (self.x + 1.0)


class Expm1(Function):
    def forward(self, x):
        self.x = x
        return x.xp.expm1(x._data)

    def backward(self, dy):
        return dy * exp(self.x)


class Sqrt(Function):
    def forward(self, x):
        self.x = x
        self.y = x.xp.sqrt(x._data)
        return self.y

    def backward(self, dy):
        return dy / (2.0 * _saved_out(self, self.y, lambda: sqrt(self.x)))


class Sin(Function):
    def forward(self, x):
        self.x = x
        return x.xp.sin(x._data)

    def backward(self, dy):
        return dy * cos(self.x)


class Cos(Function):
    def forward(self, x):
        self.x = x
        return x.xp.cos(x._data)

    def backward(self, dy):
        return -dy * sin(self.x)


class Tanh(Function):
    def forward(self, x):
        self.x = x
        self.y = x.xp.tanh(x._data)
        return self.y

    def backward(self, dy):
        y = _saved_out(self, self.y, lambda: tanh(self.x))
        return dy * (1.0 - y * y)


class Sigmoid(Function):
    def forward(self, x):
        self.x = x
        xp = x.xp
        d = x._data
        # stable for large |x|: exp of a non-positive number only
        e = xp.exp(-xp.abs(d))
        self.y = xp.where(d >= 0, 1 / (1 + e), e / (1 + e)).astype(d.dtype, copy=False)
        return self.y

    def backward(self, dy):
        y = _saved_out(self, self.y, lambda: sigmoid(self.x))
        return dy * y * (1.0 - y)


class Erf(Function):
    def forward(self, x):
        self.x = x
        return _erf_kernel(x.xp)(x._data).astype(x.dtype, copy=False)

    def backward(self, dy):
        return dy * (2.0 / math.sqrt(math.pi)) * exp(-self.x * self.x)


def _erf_kernel(xp):
    if xp is np:
        from scipy.special import erf as _erf  # noqa: PLC0415

        return _erf
    from cupyx.scipy.special import erf as _cerf  # noqa: PLC0415

    return _cerf


class Abs(Function):
    def forward(self, x):
        self.x = x
        return x.xp.abs(x._data)

    def backward(self, dy):
        return dy * sign(self.x)


class Relu(Function):
    def forward(self, x):
        self.mask = x._data > 0
        return x._data * self.mask

    def backward(self, dy):
        if recording_backward():
            return dy * Tensor._wrap(self.mask, dy._device)  # float * bool keeps dy's dtype
        return dy._data * self.mask


class Clip(Function):
    def forward(self, x, lower, upper):
        self.x = x
        d = x._data
        lo = -np.inf if lower is None else lower
        hi = np.inf if upper is None else upper
        self.mask = (d >= lo) & (d <= hi)
        return x.xp.clip(d, lo, hi).astype(d.dtype, copy=False)

    def backward(self, dy):
        return dy * Tensor._wrap(self.mask, dy._device), None, None


class _Rounding(Function):
    """Piecewise-constant ops (floor, ceil, round, sign, //): gradient zero almost everywhere."""

    def forward(self, x, fn):
        return fn(x.xp, x._data)

    def backward(self, dy):
        return dy * 0.0, None


def neg(x) -> Tensor:
    return Neg()(x)


def exp(x) -> Tensor:
    return Exp()(_f(x))


def log(x) -> Tensor:
    return Log()(_f(x))


def log1p(x) -> Tensor:
    return Log1p()(_f(x))


def expm1(x) -> Tensor:
    return Expm1()(_f(x))


def sqrt(x) -> Tensor:
    return Sqrt()(_f(x))


def square(x) -> Tensor:
    x = _t(x)
    return x * x


def sin(x) -> Tensor:
    return Sin()(_f(x))


def cos(x) -> Tensor:
    return Cos()(_f(x))


def tan(x) -> Tensor:
    return sin(x) / cos(x)


def tanh(x) -> Tensor:
    return Tanh()(_f(x))


def sigmoid(x) -> Tensor:
    return Sigmoid()(_f(x))


def erf(x) -> Tensor:
    return Erf()(_f(x))


def abs(x) -> Tensor:  # noqa: A001  (MegEngine's name)
    return Abs()(_t(x))


def relu(x) -> Tensor:
    return Relu()(_t(x))


def clip(x, lower=None, upper=None) -> Tensor:
    """Clamp to ``[lower, upper]`` (either may be None); the gradient flows inside the range."""
    return Clip()(_t(x), lower, upper)


def floor(x) -> Tensor:
    return _Rounding()(_t(x), lambda xp, d: xp.floor(d))


def ceil(x) -> Tensor:
    return _Rounding()(_t(x), lambda xp, d: xp.ceil(d))


def round(x) -> Tensor:  # noqa: A001  (MegEngine's name)
    """Round half away from zero (MegEngine/C semantics, unlike NumPy's half-to-even)."""
    return _Rounding()(_t(x), lambda xp, d: xp.sign(d) * xp.floor(xp.abs(d) + 0.5))


def sign(x) -> Tensor:
    return _Rounding()(_t(x), lambda xp, d: xp.sign(d))


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _f(x) -> Tensor:
    """Tensor with a float dtype (integer inputs to float math become float32, as in MegEngine)."""
    x = _t(x)
    return x if x._data.dtype.kind == "f" else x.astype(FLOAT32)


# -------------------------------------------------------------------------------------------------
# comparisons and logic (no gradient: results are bool)


def _raw(fn, a, b=None, op="compare"):
    if b is None:
        a = _t(a)
        return Tensor._wrap(fn(a.xp, a._data), a._device)
    a, b = binary_args(a, b, op)
    ref = a if isinstance(a, Tensor) else b
    return Tensor._wrap(fn(ref.xp, data(a), data(b)), ref._device)


def equal(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.equal(a, b), x, y, op="equal")


def not_equal(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.not_equal(a, b), x, y, op="not_equal")


def less(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.less(a, b), x, y, op="less")


def less_equal(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.less_equal(a, b), x, y, op="less_equal")


def greater(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.greater(a, b), x, y, op="greater")


def greater_equal(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.greater_equal(a, b), x, y, op="greater_equal")


def logical_and(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.logical_and(a, b), x, y, op="logical_and")


def logical_or(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.logical_or(a, b), x, y, op="logical_or")


def logical_xor(x, y) -> Tensor:
    return _raw(lambda xp, a, b: xp.logical_xor(a, b), x, y, op="logical_xor")


def logical_not(x) -> Tensor:
    return _raw(lambda xp, a: xp.logical_not(a), x)


def isnan(x) -> Tensor:
    return _raw(lambda xp, a: xp.isnan(a), x)


def isinf(x) -> Tensor:
    return _raw(lambda xp, a: xp.isinf(a), x)


# -------------------------------------------------------------------------------------------------
# dtype and device


class AsType(Function):
    def forward(self, x, dtype):
        self.src = x._data.dtype
        return x._data.astype(dtype)

    def backward(self, dy):
        return (dy.astype(self.src) if self.src.kind == "f" else None), None


class Copy(Function):
    """Copy to another device; the gradient is copied back."""

    def forward(self, x, device):
        self.src = x._device
        return Tensor._wrap(device.put(x._data), device)

    def backward(self, dy):
        return copy(dy, self.src), None

    def __call__(self, x, device):
        out = super().__call__(x, device)
        out._device = device
        return out


def astype(x, dtype) -> Tensor:
    from minigrad.tensor import as_dtype  # noqa: PLC0415

    dtype = as_dtype(dtype)
    x = _t(x)
    if x._data.dtype == dtype:
        return x
    return AsType()(x, dtype)


def copy(x, device=None) -> Tensor:
    """A copy of ``x`` on ``device`` (default: the same device); differentiable."""
    from minigrad.backend.device import as_device  # noqa: PLC0415

    x = _t(x)
    dev = as_device(device) if device is not None else x._device
    return Copy()(x, dev)
