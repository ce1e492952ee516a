"""Linear algebra: batched/broadcast ``matmul`` and ``einsum`` are primitives; ``dot`` composes."""

from __future__ import annotations

import re

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.functional._util import binary_args, check_compatible, recording_backward
from minigrad.functional.creation import zeros_like
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
from minigrad.tensor import Tensor


class MatMul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a.xp.matmul(a._data, b._data)

    def backward(self, dy):
        a, b = self.a, self.b
        da = matmul(dy, b, transpose_b=True) if self.needs_input_grad(0) else None
        db = matmul(a, dy, transpose_a=True) if self.needs_input_grad(1) else None
        return da, db


def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """Matrix product with NumPy's rules: batch dimensions broadcast, 1-D operands are promoted."""
    a, b = binary_args(a, b, "matmul", broadcast=False)
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
    return out


def dot(a, b) -> Tensor:
    """Inner product of two vectors (a scalar tensor)."""
    a, b = binary_args(a, b, "dot", broadcast=False)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"dot: expects two vectors, got shapes {a.shape} and {b.shape}")
    return matmul(a, b)


_SUBSCRIPT = re.compile(r"^[a-zA-Z]*$")


class Einsum(Function):
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


def einsum(spec: str, *operands) -> Tensor:
    """Einstein summation (e.g. ``"bij,bjk->bik"``); no repeated subscripts within one operand.
    Without ``->`` the output follows NumPy's implicit rule: the letters used exactly once, in
    alphabetical order (``"ij,jk"`` is ``"ij,jk->ik"``, ``"ij"`` is a no-op, ``"ji"`` transposes).
    """
    spec = spec.replace(" ", "")
    if "->" not in spec:
        letters = spec.replace(",", "")
        spec += "->" + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins, out = spec.split("->")
    terms = ins.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: spec {spec!r} names {len(terms)} operands, got {len(operands)}")
    xs = [x if isinstance(x, Tensor) else Tensor(x) for x in operands]
    check_compatible("einsum", *xs, broadcast=False)
    sizes: dict[str, int] = {}
    for term, x in zip(terms, xs, strict=True):
        if not _SUBSCRIPT.match(term) or len(set(term)) != len(term):
            raise ValueError(f"einsum: operand subscripts {term!r} must be distinct letters")
        if len(term) != x.ndim:
            raise ValueError(f"einsum: subscripts {term!r} do not match operand of shape {x.shape}")
        for c, n in zip(term, x.shape, strict=True):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: subscript {c!r} has sizes {sizes[c]} and {n}")
    return Einsum()(spec, *xs)


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
