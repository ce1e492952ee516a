"""Linear algebra: batched/broadcast ``matmul``, ``einsum`` and the fused ``linear`` layer op are
primitives; ``dot`` composes."""

from __future__ import annotations

import re

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.functional._util import (
    binary_args,
    check_compatible,
    compute_mode_inputs,
    recording_backward,
)
from minigrad.functional.elementwise import _f
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import broadcast_to, expand_dims, reshape, swapaxes
from minigrad.tensor import Tensor


class MatMul(Function):
    """``a @ b`` (batched, broadcast); gradients ``dy @ b^T`` and ``a^T @ dy``."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return a.xp.matmul(a._data, b._data)

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


def einsum(equation: str, *args) -> Tensor:
    """Einstein summation with an explicit ``->`` output (e.g. ``"bij,bjk->bik"``); no repeated
    subscripts within one operand. Differentiable in every operand.

    Example::

        F.einsum("bij,bjk->bik", a, b)   # a batched matmul
    """
    spec, operands = equation.replace(" ", ""), args
    if "->" not in spec:
        raise ValueError(f"einsum: spec {spec!r} needs an explicit '->' output")
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


class Linear(Function):
    """``x @ w.T + b`` for a 2-D ``x``: the hottest op of most models, so it is one node with the
    bias added in place, and its backward skips the products nobody needs (e.g. the input gradient
    of the first layer). The backward uses Tensor ops, so it is itself differentiable."""

    def forward(self, x, w, b):
        self.x, self.w, self.has_bias = x, w, b is not None
        out = x.xp.matmul(x._data, w._data.T)
        if b is not None:
            out += b._data
        return out

    def backward(self, dy):
        need_x, need_w = self.needs_input_grad(0), self.needs_input_grad(1)
        need_b = self.has_bias and self.needs_input_grad(2)
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            dx = matmul(dy, self.w) if need_x else None
            dw = matmul(dy, self.x, transpose_a=True) if need_w else None
            return dx, dw, _sum(dy, 0) if need_b else None
        g = dy._data
        dx = g @ self.w._data if need_x else None
        dw = g.T @ self.x._data if need_w else None
        return dx, dw, g.sum(axis=0) if need_b else None


def linear(inp, weight, bias=None, compute_mode: str = "default") -> Tensor:
    """``inp @ weight.T + bias`` with ``weight`` stored (out_features, in_features) as MegEngine;
    ``inp`` is (..., in_features), leading axes are flattened into one big matrix product.
    ``compute_mode`` as in :func:`matmul`.

    Example::

        y = F.linear(x, w, b)   # x (N, 784), w (10, 784), b (10,): (N, 10)
    """
    (inp, weight), result_dtype = compute_mode_inputs("linear", compute_mode, _f(inp), _f(weight))
    if weight.ndim != 2 or inp.ndim == 0 or inp.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear: input has {inp.shape[-1] if inp.ndim else 0} features (shape {inp.shape}) "
            f"but weight {weight.shape} expects {weight.shape[-1]} (weight is (out, in))"
        )
    if bias is not None and not isinstance(bias, Tensor):
        bias = Tensor(bias, dtype=weight.dtype, device=weight._device)
    lead = inp.shape[:-1]
    if inp.ndim == 1:
        inp = reshape(inp, (1, -1))
    elif inp.ndim > 2:
        inp = reshape(inp, (-1, inp.shape[-1]))
    fused = bias is None or (
        bias.shape == (weight.shape[0],) and bias.dtype == weight.dtype == inp.dtype
    )
    out = Linear()(inp, weight, bias if fused else None)
    if not fused:
        out = out + bias
    out = reshape(out, lead + (weight.shape[0],)) if len(lead) != 1 else out
    return out if result_dtype is None else out.astype(result_dtype)
