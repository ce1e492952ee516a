"""Linear algebra: batched/broadcast ``matmul``, ``einsum`` and the fused ``linear`` layer op are
primitives; ``dot`` composes."""

from __future__ import annotations

import math
import re

import numpy as np

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function, dispatches
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import blas, kernels
from minigrad.functional._util import (
    autocast_low,
    binary_args,
    check_compatible,
    compute_mode_inputs,
    recording_backward,
)
from minigrad.functional.creation import zeros_like
from minigrad.functional.elementwise import _f
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import (
    broadcast_to,
    concat,
    expand_dims,
    getitem,
    reshape,
    stack,
    swapaxes,
    transpose,
)


class MatMul(Function):
    """``a @ b`` (batched, broadcast); gradients ``dy @ b^T`` and ``a^T @ dy``."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return blas.matmul(a._data, b._data)

    def backward(self, dy):
        a, b = self.a, self.b
        da = matmul(dy, b, transpose_b=True) if self.needs_input_grad(0) else None
        db = matmul(a, dy, transpose_a=True) if self.needs_input_grad(1) else None
        return da, db


def matmul(inp1, inp2, transpose_a: bool = False, transpose_b: bool = False,
           compute_mode: str = "default") -> Tensor:
    """Matrix product with NumPy's rules: batch dimensions broadcast, 1-D operands are promoted.

    ``transpose_a``/``transpose_b`` swap the last two axes of an operand first (without a copy
    in the product); ``compute_mode="float32"`` computes float16 operands in float32 and returns
    float16 (MegEngine's modes, see ``compute_mode_inputs``).

    Example::

        y = F.matmul(x, w, transpose_b=True)   # x (N, K), w (M, K): (N, M)
    """
    a, b = binary_args(inp1, inp2, "matmul", broadcast=False)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: both operands must be tensors of rank >= 1")
    if transpose_a and a.ndim >= 2:
        a = swapaxes(a, -1, -2)
    if transpose_b and b.ndim >= 2:
        b = swapaxes(b, -1, -2)
    if a.shape[-1] != b.shape[0 if b.ndim == 1 else -2]:
        raise ValueError(
            f"matmul: shapes {a.shape} and {b.shape} are not aligned "
            f"({a.shape[-1]} != {b.shape[0 if b.ndim == 1 else -2]})"
        )
    if a._device != b._device:
        raise RuntimeError(f"matmul: operands on different devices ({a._device} and {b._device})")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(
            f"matmul: batch dimensions of shapes {a.shape} and {b.shape} cannot be broadcast"
        ) from None
    (a, b), result_dtype = compute_mode_inputs("matmul", compute_mode, a, b)
    if AUTOCAST.enabled:  # low-precision inputs (see minigrad.autodiff.autocast)
        (a, b), result_dtype = autocast_low("matmul", a, b)
    squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
    if squeeze_a:
        a = reshape(a, (1, a.shape[0]))
    if squeeze_b:
        b = reshape(b, (b.shape[0], 1))
    out = MatMul()(a, b)
    if squeeze_a or squeeze_b:
        shape = (
            out.shape[:-2]
            + (() if squeeze_a else out.shape[-2:-1])
            + (() if squeeze_b else out.shape[-1:])
        )
        out = reshape(out, shape)
    return out if result_dtype is None else out.astype(result_dtype)


def dot(inp1, inp2) -> Tensor:
    """Inner product of two vectors (a scalar tensor).

    Example::

        F.dot(mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0])).item()   # 11.0
    """
    a, b = binary_args(inp1, inp2, "dot", broadcast=False)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"dot: expects two vectors, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


_SUBSCRIPT = re.compile(r"^[a-zA-Z]*$")


class Einsum(Function):
    """``einsum(spec, *xs)``; each operand's gradient is another einsum of ``dy`` and the others."""

    def forward(self, spec, *xs):
        self.spec, self.xs = spec, xs
        return xs[0].xp.einsum(spec, *[x._data for x in xs], optimize=True)

    def backward(self, dy):
        ins, out = self.spec.split("->")
        terms = ins.split(",")
        grads = [None]
        for i, x in enumerate(self.xs):
            others = [t for j, t in enumerate(terms) if j != i]
            rest = [t for j, t in enumerate(self.xs) if j != i]
            avail = set(out).union(*others)
            keep = "".join(c for c in terms[i] if c in avail)
            g = einsum(",".join([out, *others]) + "->" + keep, dy, *rest)
            # letters summed away inside this operand alone: the gradient is constant along them
            missing = [k for k, c in enumerate(terms[i]) if c not in avail]
            if missing:
                g = broadcast_to(expand_dims(g, missing), x.shape)
            grads.append(g)
        return tuple(grads)


def _explicit_spec(equation: str, shapes: list) -> tuple[str, list]:
    """``equation`` rewritten for :class:`Einsum`, which takes distinct letters per operand and an
    explicit output: ``...`` becomes fresh letters (the broadcast dimensions, aligned from the
    right), an implicit output becomes NumPy's (the ellipsis dimensions, then the letters used
    exactly once, sorted), and a letter repeated within one operand (a diagonal, ``"ii->i"``)
    becomes fresh letters tied to it by an extra identity operand. Returns the spec and the
    ``(letters, size)`` of each identity operand to append."""
    spec = equation.replace(" ", "")
    ins, arrow, out = spec.partition("->")
    terms = ins.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: spec {equation!r} names {len(terms)} operands, got "
                         f"{len(shapes)}")
    used = set(spec)
    fresh = (c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used)
    n_named = [len(t.replace("...", "")) for t in terms]
    n_ell = max([len(shape) - n for t, shape, n in zip(terms, shapes, n_named, strict=True)
                 if "..." in t], default=0)
    ell = "".join(next(fresh) for _ in range(n_ell))
    for i, (t, shape) in enumerate(zip(terms, shapes, strict=True)):
        if "..." in t:
            k = len(shape) - n_named[i]
            if k < 0:
                raise ValueError(f"einsum: subscripts {t!r} do not match operand of shape "
                                 f"{tuple(shape)}")
            terms[i] = t.replace("...", ell[n_ell - k:], 1)
    if arrow:
        out = out.replace("...", ell, 1)
    else:
        letters = "".join(terms)
        out = ell + "".join(sorted(c for c in set(letters) if c not in ell
                                   and letters.count(c) == 1))
    identities = []
    for i, (t, shape) in enumerate(zip(terms, shapes, strict=True)):
        groups: dict[str, list[str]] = {}
        chars = []
        for c in t:
            chars.append(next(fresh) if c in groups else c)
            groups.setdefault(c, []).append(chars[-1])
        terms[i] = "".join(chars)
        if len(shape) == len(t):
            identities += [("".join(g), shape[t.index(c)]) for c, g in groups.items()
                           if len(g) > 1]
    spec = ",".join(terms + [letters for letters, _ in identities]) + "->" + out
    return spec, identities


def _identity(ndim: int, size: int, like: Tensor) -> Tensor:
    """The ``ndim``-way identity of side ``size`` (ones where all indices agree), on ``like``'s
    device and in its dtype: the operand that turns a repeated subscript into a diagonal."""
    eye = np.zeros((size,) * ndim, dtype=like.dtype)
    eye[(np.arange(size),) * ndim] = 1
    return Tensor._wrap(like._device.put(eye), like._device)


def einsum(equation: str, *args) -> Tensor:
    """Einstein summation (e.g. ``"bij,bjk->bik"``), NumPy's rules: ``...`` stands for the
    broadcast dimensions, a letter repeated within one operand takes its diagonal (``"ii->i"``,
    ``"ii"`` is the trace), and without ``->`` the output is the ellipsis dimensions followed by
    the letters used exactly once, in alphabetical order (``"ij,jk"`` is ``"ij,jk->ik"``,
    ``"ji"`` transposes). Differentiable in every operand.

    Example::

        F.einsum("bij,bjk->bik", a, b)   # a batched matmul
        F.einsum("...ij->...ji", x)      # swap the last two axes, whatever the rank
    """
    xs = [x if isinstance(x, Tensor) else Tensor(x) for x in args]
    spec, identities = _explicit_spec(equation, [x.shape for x in xs])
    check_compatible("einsum", *xs, broadcast=False)
    result_dtype = None
    if AUTOCAST.enabled:  # low-precision inputs (see minigrad.autodiff.autocast)
        xs, result_dtype = autocast_low("einsum", *xs)
    terms = spec.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, x in zip(terms, xs, strict=False):
        if not _SUBSCRIPT.match(term) or len(set(term)) != len(term):
            raise ValueError(f"einsum: operand subscripts {term!r} must be letters")
        if len(term) != x.ndim:
            raise ValueError(f"einsum: subscripts {term!r} do not match operand of shape {x.shape}")
        for c, n in zip(term, x.shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: subscript {c!r} has sizes {sizes[c]} and {n}")
    out_letters = spec.split("->")[1]
    for c in out_letters:
        if c not in sizes or out_letters.count(c) > 1:
            raise ValueError(f"einsum: output subscript {c!r} of {equation!r} must name one "
                             "input axis once")
    xs = list(xs) + [_identity(len(letters), size, xs[0]) for letters, size in identities]
    out = Einsum()(spec, *xs)
    return out if result_dtype is None else out.astype(result_dtype)


class Linear(Function):
    """``x @ w.T + b``: the hottest op of most models, so it is one node with the bias added in
    place, and its backward skips the products nobody needs (e.g. the input gradient of the first
    layer). ``x`` is 2-D, or (..., in_features) with its leading axes flattened inside the node
    (one node where a reshape each side would add two more each way; the same products). The
    backward uses Tensor ops, so it is itself differentiable."""

    def forward(self, x, w, b):
        self.x, self.w, self.has_bias = x, w, b is not None
        d = x._data
        if d.ndim != 2:
            d = d.reshape(math.prod(d.shape[:-1]), d.shape[-1])
        self.x2d = d
        out = blas.matmul(d, w._data.T)
        if b is not None:
            out += b._data
        if x._data.ndim != 2:
            out = out.reshape(x._data.shape[:-1] + (out.shape[-1],))
        return out

    def backward(self, dy):
        need_x, need_w = self.needs_input_grad(0), self.needs_input_grad(1)
        need_b = self.has_bias and self.needs_input_grad(2)
        x = self.x
        flat = x.ndim != 2
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            if flat:
                dy = reshape(dy, (-1, dy.shape[-1]))
            dx = matmul(dy, self.w) if need_x else None
            if flat and dx is not None:
                dx = reshape(dx, x.shape)
            x2d = reshape(x, (-1, x.shape[-1])) if flat else x
            dw = matmul(dy, x2d, transpose_a=True) if need_w else None
            return dx, dw, _sum(dy, 0) if need_b else None
        g = dy._data
        if flat:
            g = g.reshape(math.prod(g.shape[:-1]), g.shape[-1])
        dx = blas.matmul(g, self.w._data) if need_x else None
        if flat and dx is not None:
            dx = dx.reshape(x.shape)
        dw = None
        if need_w:  # into data parallelism's gradient bucket when it offers one (one dtype)
            dtype = g.dtype
            out = self.grad_buffer(1, self.w.shape, dtype) if dtype == self.x2d.dtype else None
            dw = blas.matmul(g.T, self.x2d, out=out)
        return dx, dw, kernels.column_sums(g) if need_b else None


def linear(inp, weight, bias=None, compute_mode: str = "default") -> Tensor:
    """``inp @ weight.T + bias`` with ``weight`` stored (out_features, in_features) as MegEngine;
    ``inp`` is (..., in_features), leading axes are flattened into one big matrix product.
    ``compute_mode`` as in :func:`matmul`.

    Example::

        y = F.linear(x, w, b)   # x (N, 784), w (10, 784), b (10,): (N, 10)
    """
    (inp, weight), result_dtype = compute_mode_inputs("linear", compute_mode, _f(inp), _f(weight))
    if AUTOCAST.enabled:  # low-precision inputs (see minigrad.autodiff.autocast)
        if bias is not None and not isinstance(bias, Tensor):
            bias = Tensor(bias, dtype=weight.dtype, device=weight._device)
        (inp, weight, bias), result_dtype = autocast_low("linear", inp, weight, bias)
    if weight.ndim != 2 or inp.ndim == 0 or inp.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear: input has {inp.shape[-1] if inp.ndim else 0} features (shape {inp.shape}) "
            f"but weight {weight.shape} expects {weight.shape[-1]} (weight is (out, in))"
        )
    if bias is not None and not isinstance(bias, Tensor):
        bias = Tensor(bias, dtype=weight.dtype, device=weight._device)
    fused = bias is None or (
        bias.shape == (weight.shape[0],) and bias.dtype == weight.dtype == inp.dtype
    )
    if fused and not dispatches((inp, weight, bias)):  # any rank in one node (global tensors'
        out = Linear()(inp, weight, bias)               # rule for Linear takes a 2-D input)
        return out if result_dtype is None else out.astype(result_dtype)
    lead = inp.shape[:-1]
    if inp.ndim == 1:
        inp = reshape(inp, (1, -1))
    elif inp.ndim > 2:
        inp = reshape(inp, (-1, inp.shape[-1]))
    out = Linear()(inp, weight, bias if fused else None)
    if not fused:
        out = out + bias
    out = reshape(out, lead + (weight.shape[0],)) if len(lead) != 1 else out
    return out if result_dtype is None else out.astype(result_dtype)
# --------------------------------------------------------------------------------------------------
# MegEngine's other linear algebra: cross and matinv


def cross(a, b, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: int | None = None):
    """Cross product of (batches of) 3-vectors along ``axisa``/``axisb``, written along ``axisc``
    (``axis`` sets all three). A 2-vector is read as ``(x, y, 0)``, so the result always has 3
    components. Batch axes broadcast. Differentiable.

    Example::

        F.cross(mg.tensor([1.0, 2.0, 3.0]), mg.tensor([4.0, 5.0, 6.0]))  # [-3., 6., -3.]
    """
    if axis is not None:
        axisa = axisb = axisc = axis
    a, b = binary_args(a, b, "cross", broadcast=False)
    u, v = (_as_3vectors(t, ax, name) for t, ax, name in ((a, axisa, "a"), (b, axisb, "b")))
    check_compatible("cross", u, v)
    comp = [[getitem(t, (Ellipsis, i)) for i in range(3)] for t in (u, v)]
    (u0, u1, u2), (v0, v1, v2) = comp
    c = stack([u1 * v2 - u2 * v1, u2 * v0 - u0 * v2, u0 * v1 - u1 * v0], axis=-1)
    if not -c.ndim <= axisc < c.ndim:
        raise ValueError(f"cross: axisc {axisc} is out of range for a result of rank {c.ndim}")
    return _move_last_to(c, axisc % c.ndim)


def _as_3vectors(t: Tensor, axis: int, name: str) -> Tensor:
    if not -t.ndim <= axis < t.ndim:
        raise ValueError(f"cross: axis {axis} is out of range for {name} of shape {t.shape}")
    t = _move_last_to(t, axis % t.ndim, to_last=True)
    if t.shape[-1] == 2:
        return concat([t, zeros_like(getitem(t, (Ellipsis, slice(0, 1))))], axis=-1)
    if t.shape[-1] != 3:
        raise ValueError(f"cross: {name} has {t.shape[-1]} components along its vector axis "
                         f"(shape {t.shape}), expected 2 or 3")
    return t


def _move_last_to(t: Tensor, axis: int, to_last: bool = False) -> Tensor:
    """Move the last axis to ``axis`` (or ``axis`` to the end with ``to_last``)."""
    order = list(range(t.ndim))
    if to_last:
        order.append(order.pop(axis))
    else:
        order.insert(axis, order.pop())
    return transpose(t, order) if order != list(range(t.ndim)) else t


class MatInv(Function):
    """Batched matrix inverse; ``d(A^-1) = -A^-1 dA A^-1``, so ``dA = -Y^T dY Y^T``."""

    def forward(self, x):
        self.x = x
        self.y = x.xp.linalg.inv(x._data)
        return self.y

    def backward(self, dy):
        y = matinv(self.x) if recording_backward() else Tensor._wrap(self.y, dy._device)
        yt = swapaxes(y, -1, -2)
        return -matmul(matmul(yt, dy), yt)


def matinv(inp) -> Tensor:
    """Inverse of each square matrix in ``inp`` (..., n, n). Integer input becomes float32.

    Example::

        F.matinv(mg.tensor([[1.0, 0.0], [1.0, 1.0]]))  # [[1., 0.], [-1., 1.]]
    """
    x = inp if isinstance(inp, Tensor) else Tensor(inp)
    if x.dtype.kind != "f":
        x = x.astype("float32")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"matinv: expected square matrices (..., n, n), got shape {x.shape}")
    return MatInv()(x)
