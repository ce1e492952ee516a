"""Elementwise ops. Primitives own a ``backward`` right under their ``forward``; the rest are
compositions of primitives and get gradients for free.

Gradients of broadcast operands are reduced back to the operand's shape by the engine, so binary
backward functions simply return ``dy``-shaped gradients.
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function, dispatches
from minigrad.autodiff.tensor import Tensor, as_dtype
from minigrad.backend import kernels
from minigrad.backend.device import as_device
from minigrad.backend.dtypes import is_floating
from minigrad.backend.xp import erf as erf_kernel
from minigrad.functional._util import (
    FLOAT32,
    autocast_high,
    binary_args,
    check_compatible,
    data,
    recording_backward,
)

# -------------------------------------------------------------------------------------------------
# binary arithmetic

# MegEngine's ``functional.elemwise`` names (``from minigrad.functional.elemwise import *``)
__all__ = [
    "abs",
    "acos",
    "acosh",
    "add",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "ceil",
    "clip",
    "cos",
    "cosh",
    "div",
    "equal",
    "erf",
    "exp",
    "expm1",
    "floor",
    "floor_div",
    "greater",
    "greater_equal",
    "left_shift",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logaddexp",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "maximum",
    "minimum",
    "mod",
    "mul",
    "neg",
    "not_equal",
    "polar",
    "pow",
    "right_shift",
    "round",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "sub",
    "tan",
    "tanh",
]


# The four arithmetic ops inline ``data()`` (``x._data`` for a Tensor, else the Python number): two
# calls fewer is about 0.3 us of the ~3 us a recorded op on a tiny tensor costs.


class Add(Function):
    """``a + b``; both gradients are ``dy`` (broadcast operands are summed back by the engine)."""

    def forward(self, a, b):
        return (a._data if isinstance(a, Tensor) else a) + (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        return dy, dy


class Sub(Function):
    """``a - b``; gradients ``dy`` and ``-dy`` (the negation only when ``b`` wants a gradient: a
    loss's label does not)."""

    def forward(self, a, b):
        return (a._data if isinstance(a, Tensor) else a) - (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        return dy, (-dy if self.needs_input_grad(1) else None)


class Mul(Function):
    """``a * b``; gradients ``dy * b`` and ``dy * a`` (each only when needed; one product for a
    square ``x * x``, whose two equal gradients the engine then adds)."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return (a._data if isinstance(a, Tensor) else a) * (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        a, b = self.a, self.b
        need_a, need_b = self.needs_input_grad(0), self.needs_input_grad(1)
        if a is b and need_a and need_b:
            g = dy * a
            return g, g
        return (dy * b if need_a else None), (dy * a if need_b else None)


class Div(Function):
    """``a / b``; gradients ``dy / b`` and ``-dy * a / b**2``."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return (a._data if isinstance(a, Tensor) else a) / (b._data if isinstance(b, Tensor) else b)

    def backward(self, dy):
        a, b = self.a, self.b
        da = dy / b if self.needs_input_grad(0) else None
        db = -dy * a / (b * b) if self.needs_input_grad(1) else None
        return da, db


class Pow(Function):
    """``a ** b``; gradients ``dy * b * a**(b-1)`` and ``dy * a**b * log(a)``."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return data(a) ** data(b)

    def backward(self, dy):
        a, b = self.a, self.b
        da = db = None
        if isinstance(a, Tensor):
            da = dy * b * a ** (b - 1) if isinstance(b, Tensor) or b != 2 else dy * 2 * a
        if isinstance(b, Tensor):  # (a number's log is a number: no tensor on another device)
            db = dy * a**b * (log(a) if isinstance(a, Tensor) else np.log(a))
        return da, db


class _Extremum(Function):
    """``maximum``/``minimum`` (``name``): the gradient goes to the operand that was picked, to
    the first one at a tie."""

    name = ""

    def forward(self, a, b):
        da, db = data(a), data(b)
        self.mask = da >= db if self.name == "maximum" else da <= db
        xp = a.xp if isinstance(a, Tensor) else b.xp
        return getattr(xp, self.name)(da, db)

    def backward(self, dy):
        m = Tensor._wrap(self.mask, dy._device)
        return where(m, dy, 0.0), where(m, 0.0, dy)


class Maximum(_Extremum):
    """``maximum(a, b)``."""

    name = "maximum"


class Minimum(_Extremum):
    """``minimum(a, b)``."""

    name = "minimum"


class Where(Function):
    """``where(cond, a, b)``; ``dy`` flows to ``a`` where ``cond`` holds, to ``b`` elsewhere."""

    def forward(self, cond, a, b):
        self.cond = cond
        xp = cond.xp
        return xp.where(cond._data, data(a), data(b))

    def backward(self, dy):
        zero = Tensor._wrap(dy.xp.zeros((), dy.dtype), dy._device)
        return None, where(self.cond, dy, zero), where(self.cond, zero, dy)


def _public(fn, name: str, doc: str):
    """Name and document a generated public op (families of ops share one definition below)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _binary(function_class: type[Function], name: str, doc: str):
    """The public op ``name(x, y)``: operands coerced by ``binary_args``, then one node."""

    def op(x, y) -> Tensor:
        if (isinstance(x, Tensor) and isinstance(y, Tensor) and x._device is y._device
                and x._data.shape == y._data.shape):  # the common case: nothing to coerce or
            # check, and skipping binary_args (which would pass them through) saves ~0.1 us per op
            return function_class().call_pair(x, y)
        return function_class()(*binary_args(x, y, name))

    return _public(op, name, doc)


add = _binary(Add, "add", """``x + y`` elementwise with broadcasting; either may be a Python number
    (which keeps the tensor's dtype). Differentiable in both.

    Example::

        F.add(mg.tensor([1.0, 2.0]), 1.0)   # Tensor([2., 3.])
    """)
sub = _binary(Sub, "sub", "``x - y`` elementwise with broadcasting; differentiable in both.")
mul = _binary(Mul, "mul", "``x * y`` elementwise with broadcasting; differentiable in both.")


def div(x, y) -> Tensor:
    """``x / y``, true division with broadcasting: integer operands are promoted to float32
    first (as in MegEngine). Differentiable in both."""
    x, y = binary_args(x, y, "div")
    if not any(isinstance(t, Tensor) and is_floating(t.dtype) for t in (x, y)):
        x, y = (t.astype(FLOAT32) if isinstance(t, Tensor) else t for t in (x, y))
    return Div()(x, y)


pow = _binary(Pow, "pow", """``x ** y`` elementwise with broadcasting; differentiable in both
    (the exponent's gradient is ``x**y * log(x)``, so it needs ``x > 0``).""")
maximum = _binary(Maximum, "maximum", """The larger of ``x`` and ``y`` elementwise; at a tie the
    whole gradient goes to ``x``.""")
minimum = _binary(Minimum, "minimum", """The smaller of ``x`` and ``y`` elementwise; at a tie the
    whole gradient goes to ``x``.""")


def where(mask, x, y) -> Tensor:
    """``x`` where ``mask`` is true, else ``y``, with broadcasting (differentiable in x and y).

    Example::

        F.where(x > 0, x, 0.0)   # relu written by hand
    """
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
    """``x // y`` elementwise (piecewise constant, so it is not recorded for gradients)."""
    return _raw(lambda xp, a, b: xp.floor_divide(a, b), x, y, op="floor_div")


def mod(x, y) -> Tensor:
    """``x % y`` elementwise with Python's sign convention (the result has ``y``'s sign); not
    recorded for gradients."""
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
    """``-x``; gradient ``-dy``."""

    def forward(self, x):
        return -x._data

    def backward(self, dy):
        return -dy


class Exp(Function):
    """``e**x``; gradient ``dy * y`` with the saved output ``y``."""

    def forward(self, x):
        self.x = x
        self.y = x.xp.exp(x._data)
        return self.y

    def backward(self, dy):
        return dy * _saved_out(self, self.y, lambda: exp(self.x))


class Log(Function):
    """``log(x)``; gradient ``dy / x``."""

    def forward(self, x):
        self.x = x
        return x.xp.log(x._data)

    def backward(self, dy):
        return dy / self.x


class Log1p(Function):
    """``log(1 + x)``; gradient ``dy / (1 + x)``."""

    def forward(self, x):
        self.x = x
        return x.xp.log1p(x._data)

    def backward(self, dy):
        return dy / (self.x + 1.0)


class Expm1(Function):
    """``e**x - 1``; gradient ``dy * e**x``."""

    def forward(self, x):
        self.x = x
        return x.xp.expm1(x._data)

    def backward(self, dy):
        return dy * exp(self.x)


class Sqrt(Function):
    """``sqrt(x)``; gradient ``dy / (2 y)`` with the saved output ``y``."""

    def forward(self, x):
        self.x = x
        self.y = x.xp.sqrt(x._data)
        return self.y

    def backward(self, dy):
        return dy / (2.0 * _saved_out(self, self.y, lambda: sqrt(self.x)))


class Sin(Function):
    """``sin(x)``; gradient ``dy * cos(x)``."""

    def forward(self, x):
        self.x = x
        return x.xp.sin(x._data)

    def backward(self, dy):
        return dy * cos(self.x)


class Cos(Function):
    """``cos(x)``; gradient ``-dy * sin(x)``."""

    def forward(self, x):
        self.x = x
        return x.xp.cos(x._data)

    def backward(self, dy):
        return -dy * sin(self.x)


class Tanh(Function):
    """``tanh(x)``; gradient ``dy * (1 - y**2)`` with the saved output ``y``."""

    def forward(self, x):
        self.x = x
        self.y = x.xp.tanh(x._data)
        return self.y

    def backward(self, dy):
        y = _saved_out(self, self.y, lambda: tanh(self.x))
        return dy * (1.0 - y * y)


class Sigmoid(Function):
    """``1 / (1 + e**-x)``; gradient ``dy * y * (1 - y)`` with the saved output ``y``."""

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
    """``erf(x)``; gradient ``dy * 2 / sqrt(pi) * e**(-x**2)``."""

    def forward(self, x):
        self.x = x
        return erf_kernel(x.xp)(x._data).astype(x.dtype, copy=False)

    def backward(self, dy):
        return dy * (2.0 / math.sqrt(math.pi)) * exp(-self.x * self.x)


class Abs(Function):
    """``|x|``; gradient ``dy * sign(x)``."""

    def forward(self, x):
        self.x = x
        return x.xp.abs(x._data)

    def backward(self, dy):
        return dy * sign(self.x)


class Relu(Function):
    """``max(x, 0)`` (NaN stays NaN); gradient ``dy`` where ``x > 0``, else 0 (a saved boolean
    mask). One fused kernel each way."""

    def forward(self, x):
        y, self.mask = kernels.relu(x._data)
        return y

    def backward(self, dy):
        if recording_backward():
            return dy * Tensor._wrap(self.mask, dy._device)  # float * bool keeps dy's dtype
        return kernels.relu_grad(dy._data, self.mask)


class Clip(Function):
    """``clip(x, lower, upper)``; gradient ``dy`` inside the range, 0 outside."""

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


def _t(x) -> Tensor:
    """``x`` as a Tensor (Python numbers and arrays get the usual default dtypes)."""
    return x if isinstance(x, Tensor) else Tensor(x)


def _f(x) -> Tensor:
    """Tensor with a float dtype (integer inputs to float math become float32, as in MegEngine)."""
    x = _t(x)
    dtype = x._data.dtype
    return x if dtype.kind == "f" or is_floating(dtype) else x.astype(FLOAT32)


def neg(x) -> Tensor:
    """``-x`` elementwise."""
    return Neg()(_t(x))


def _unary(function_class: type[Function], name: str, doc: str, float_input: bool = True,
           autocast_float32: bool = False):
    """The public op ``name(x)``: ``x`` made a tensor (a float one when ``float_input``: integer
    input becomes float32, as in MegEngine), then one node. ``autocast_float32``: under autocast
    a low-precision input is computed in float32 (see ``minigrad.autodiff.autocast``)."""
    coerce = _f if float_input else _t

    if autocast_float32:
        def op(x) -> Tensor:
            if AUTOCAST.enabled:
                return function_class()(*autocast_high(coerce(x)))
            return function_class()(coerce(x))
    else:
        def op(x) -> Tensor:
            return function_class()(coerce(x))

    return _public(op, name, doc)


exp = _unary(Exp, "exp", """``e ** x`` elementwise.

    Example::

        F.exp(mg.tensor([0.0, 1.0]))   # Tensor([1., 2.7182817])
    """, autocast_float32=True)
log = _unary(Log, "log", "The natural logarithm elementwise (``-inf`` at 0, NaN below).",
             autocast_float32=True)
log1p = _unary(Log1p, "log1p", "``log(1 + x)``, accurate for tiny ``x``.", autocast_float32=True)
expm1 = _unary(Expm1, "expm1", "``e ** x - 1``, accurate for tiny ``x``.", autocast_float32=True)
sqrt = _unary(Sqrt, "sqrt", "The square root elementwise.")
sin = _unary(Sin, "sin", "The sine elementwise (radians).")
cos = _unary(Cos, "cos", "The cosine elementwise (radians).")
tanh = _unary(Tanh, "tanh", "The hyperbolic tangent elementwise.")
sigmoid = _unary(Sigmoid, "sigmoid", """``1 / (1 + e**-x)``, computed without overflow for large
    ``|x|``.""")
erf = _unary(Erf, "erf", "The error function elementwise.")
abs = _unary(Abs, "abs", "``|x|`` elementwise (keeps integer dtypes).", float_input=False)
relu = _unary(Relu, "relu", """``max(x, 0)`` elementwise (keeps the dtype); the gradient is 0 at
    and below 0.

    Example::

        F.relu(mg.tensor([-1.0, 2.0]))   # Tensor([0., 2.])
    """, float_input=False)


def square(x) -> Tensor:
    """``x * x`` elementwise."""
    x = _t(x)
    return x * x


def tan(x) -> Tensor:
    """The tangent elementwise (radians), as ``sin(x) / cos(x)``."""
    return sin(x) / cos(x)


def clip(x, lower=None, upper=None) -> Tensor:
    """Clamp to ``[lower, upper]`` (either may be None); the gradient flows inside the range.

    Example::

        F.clip(x, -1.0, 1.0)
    """
    return Clip()(_t(x), lower, upper)


def _rounding(name: str, kernel, doc: str):
    """A public piecewise-constant op ``name(x)`` running ``kernel(xp, array)``."""

    def op(x) -> Tensor:
        return _Rounding()(_t(x), kernel)

    return _public(op, name, doc)


floor = _rounding("floor", lambda xp, d: xp.floor(d), "The largest integer ``<= x``, elementwise.")
ceil = _rounding("ceil", lambda xp, d: xp.ceil(d), "The smallest integer ``>= x``, elementwise.")
round = _rounding("round", lambda xp, d: xp.sign(d) * xp.floor(xp.abs(d) + 0.5), """Round half
    away from zero (MegEngine/C semantics, unlike NumPy's half-to-even).""")
sign = _rounding("sign", lambda xp, d: xp.sign(d), "-1, 0 or 1 by the sign of ``x``, elementwise.")


# -------------------------------------------------------------------------------------------------
# comparisons and logic (no gradient: results are bool)


def _apply_raw(fn, operands):
    """``fn`` on the arrays of one tensor or of two operands; the result and its device."""
    if len(operands) == 1:
        (a,) = operands
        with a._device.context():
            return fn(a.xp, a._data), a._device
    a, b = operands
    ref = a if isinstance(a, Tensor) else b
    with ref._device.context():
        return fn(ref.xp, data(a), data(b)), ref._device


class Raw(Function):
    """``fn(xp, *arrays)`` for comparisons and logic, as a Function for tensors that dispatch
    their ops (global tensors); not differentiable (the result is bool)."""

    def forward(self, fn, *operands):
        return _apply_raw(fn, operands)[0]

    def backward(self, dy):
        return (None,) * len(self._edges)


def _raw(fn, a, b=None, op="compare"):
    """``fn(xp, a[, b])`` on the operands' arrays, wrapped as a Tensor that is not recorded."""
    operands = (_t(a),) if b is None else binary_args(a, b, op)
    if dispatches(operands):
        return Raw()(fn, *operands)
    return Tensor._wrap(*_apply_raw(fn, operands))


def _comparison(name: str, what: str):
    """The public op ``name(x, y)``: a bool tensor saying ``what`` elementwise (broadcasting)."""

    def op(x, y) -> Tensor:
        return _raw(lambda xp, a, b: getattr(xp, name)(a, b), x, y, op=name)

    return _public(op, name, f"``{what}`` elementwise with broadcasting: a bool tensor "
                             "(comparisons and logic are not differentiable).")


equal = _comparison("equal", "x == y")
not_equal = _comparison("not_equal", "x != y")
less = _comparison("less", "x < y")
less_equal = _comparison("less_equal", "x <= y")
greater = _comparison("greater", "x > y")
greater_equal = _comparison("greater_equal", "x >= y")
logical_and = _comparison("logical_and", "x and y")
logical_or = _comparison("logical_or", "x or y")
logical_xor = _comparison("logical_xor", "x xor y")


def logical_not(x) -> Tensor:
    """``not x`` elementwise: a bool tensor."""
    return _raw(lambda xp, a: xp.logical_not(a), x)


def isnan(inp) -> Tensor:
    """Where ``inp`` is NaN: a bool tensor (MegEngine's name and keyword)."""
    return _raw(lambda xp, a: xp.isnan(a), inp)


def isinf(inp) -> Tensor:
    """Where ``inp`` is ``+inf`` or ``-inf``: a bool tensor."""
    return _raw(lambda xp, a: xp.isinf(a), inp)


# -------------------------------------------------------------------------------------------------
# dtype and device


class AsType(Function):
    """A dtype conversion; the gradient is cast back to the source dtype (floats only)."""

    def forward(self, x, dtype):
        self.src = x._data.dtype
        return x._data.astype(dtype)

    def backward(self, dy):
        return (dy.astype(self.src) if is_floating(self.src) else None), None


class Copy(Function):
    """Copy to another device; the gradient is copied back."""

    def forward(self, x, device):
        self.src = x._device
        return Tensor._wrap(device.put(x._data), device)

    def backward(self, dy):
        return copy(dy, self.src), None


def astype(x, dtype) -> Tensor:
    """``x`` converted to ``dtype`` (``"float32"``, ``np.float16``, ``mg.int32``...); ``x`` itself
    when it already has it. Differentiable between float dtypes (the gradient is cast back)."""
    dtype = as_dtype(dtype)
    x = _t(x)
    if x._data.dtype == dtype:
        return x
    return AsType()(x, dtype)


def copy(inp, device=None) -> Tensor:
    """A copy of ``inp`` on ``device`` (default: the same device); differentiable, the gradient is
    copied back.

    Example::

        y = F.copy(x, "gpu0")
    """
    x = _t(inp)
    dev = as_device(device) if device is not None else x._device
    return Copy()(x, dev)


# -------------------------------------------------------------------------------------------------
# more math (MegEngine's elemwise set): inverse trigonometric and hyperbolic functions, atan2,
# logaddexp, logsigmoid and the integer shifts


class _UnaryMath(Function):
    """``y = fn(x)`` with ``dy/dx = deriv(x)``; ``deriv`` is written with Tensor ops, so the
    backward is itself recorded (these ops are twice differentiable) and each op is one line."""

    def forward(self, x, fn, deriv):
        self.x, self.deriv = x, deriv
        return fn(x.xp, x._data)

    def backward(self, dy):
        return dy * self.deriv(self.x), None, None


def asin(x) -> Tensor:
    """Inverse sine, defined on [-1, 1]."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arcsin(d), lambda t: 1.0 / sqrt(1.0 - t * t))


def acos(x) -> Tensor:
    """Inverse cosine, defined on [-1, 1]."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arccos(d), lambda t: -1.0 / sqrt(1.0 - t * t))


def atan(x) -> Tensor:
    """Inverse tangent."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arctan(d), lambda t: 1.0 / (1.0 + t * t))


def polar(abs, angle) -> Tensor:  # noqa: A002 - MegEngine's argument name
    """The complex tensor ``abs * (cos(angle) + 1j * sin(angle))`` from polar coordinates
    (MegEngine's ``F.polar``): complex64 from float32 inputs, complex128 from float64.

    Example::

        z = F.polar(mg.tensor([2.0]), mg.tensor([np.pi / 2]))   # about 2j
    """
    r, theta = _f(abs), _f(angle)
    return r * cos(theta) + r * sin(theta) * 1j


def sinh(x) -> Tensor:
    """Hyperbolic sine."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.sinh(d), cosh)


def cosh(x) -> Tensor:
    """Hyperbolic cosine."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.cosh(d), sinh)


def asinh(x) -> Tensor:
    """Inverse hyperbolic sine (accurate for negative ``x`` too, unlike ``log(x + sqrt(x²+1))``)."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arcsinh(d), lambda t: 1.0 / sqrt(t * t + 1.0))


def acosh(x) -> Tensor:
    """Inverse hyperbolic cosine, defined for ``x >= 1``."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arccosh(d), lambda t: 1.0 / sqrt(t * t - 1.0))


def atanh(x) -> Tensor:
    """Inverse hyperbolic tangent, defined on (-1, 1)."""
    return _UnaryMath()(_f(x), lambda xp, d: xp.arctanh(d), lambda t: 1.0 / (1.0 - t * t))


class Atan2(Function):
    def forward(self, y, x):
        self.y, self.x = y, x
        return _xp(y, x).arctan2(data(y), data(x))

    def backward(self, dz):
        y, x = self.y, self.x
        r2 = x * x + y * y
        return dz * x / r2, -dz * y / r2


def atan2(y, x) -> Tensor:
    """The angle of the point ``(x, y)``: ``arctan(y / x)`` in the right quadrant, in [-pi, pi]."""
    return Atan2()(*_float_args(y, x, "atan2"))


class LogAddExp(Function):
    """``log(exp(x) + exp(y))`` without overflow; the gradients are the softmax weights
    ``sigmoid(x - y)`` and ``sigmoid(y - x)`` (even at ties, where a ``maximum``-based composition
    would send the whole gradient to one side)."""

    def forward(self, x, y):
        self.x, self.y = x, y
        return _xp(x, y).logaddexp(data(x), data(y))

    def backward(self, dz):
        d = self.x - self.y
        return dz * sigmoid(d), dz * sigmoid(-d)


def logaddexp(x, y) -> Tensor:
    """``log(exp(x) + exp(y))``, stable for large arguments."""
    return LogAddExp()(*_float_args(x, y, "logaddexp"))


class LogSigmoid(Function):
    def forward(self, x):
        self.x = x
        return -x.xp.logaddexp(0, -x._data).astype(x.dtype, copy=False)

    def backward(self, dy):
        return dy * sigmoid(-self.x)


def logsigmoid(inp) -> Tensor:
    """``log(sigmoid(x)) = -softplus(-x)``, computed without overflow for any ``x``."""
    return LogSigmoid()(_f(inp))


def left_shift(x, y) -> Tensor:
    """Bitwise ``x << y`` on integer tensors (not differentiable)."""
    return _raw(lambda xp, a, b: xp.left_shift(a, b), x, y, op="left_shift")


def right_shift(x, y) -> Tensor:
    """Bitwise (arithmetic) ``x >> y`` on integer tensors (not differentiable)."""
    return _raw(lambda xp, a, b: xp.right_shift(a, b), x, y, op="right_shift")


def _float_args(a, b, op: str):
    """Coerce a binary float op's operands: integer tensors become float32 (MegEngine's rule for
    float math), Python numbers stay numbers."""
    a, b = binary_args(a, b, op)
    return tuple(_f(t) if isinstance(t, Tensor) else t for t in (a, b))


def _xp(a, b):
    """The array module of whichever operand is a Tensor."""
    return a.xp if isinstance(a, Tensor) else b.xp
