"""Per-op SBP rules: for each op, the SBP its inputs are boxed to and the SBP of its outputs.

A rule is written for one mesh dimension (``sbp``: the inputs' SBPs on that dimension -> the SBPs
to box them to and the outputs' SBPs) and applied to every mesh dimension in turn. It also gives
the logical output shapes (``shape``), and the dtypes when they cannot be found by running the op
on one-element stand-ins (``dtype``), and, when running the op on the local pieces needs other
arguments than the logical ones (a reshape's target shape), the local call (``local``).

Ops without a rule box every input to ``broadcast`` and compute the whole logical result on every
rank of the placement: always correct, never sharded. The table of the rules is in the package
docstring (:mod:`minigrad.distributed.global_tensor`); ``tests/distributed/global_tensor`` checks
each row against a single process.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.global_tensor.sbp import SBP, broadcast, partial_sum, split
from minigrad.functional.elementwise import (
    Abs,
    Add,
    AsType,
    Atan2,
    Copy,
    Cos,
    Div,
    Erf,
    Exp,
    Expm1,
    Log,
    Log1p,
    LogAddExp,
    LogSigmoid,
    Maximum,
    Minimum,
    Mul,
    Neg,
    Pow,
    Raw,
    Relu,
    Sigmoid,
    Sin,
    Sqrt,
    Sub,
    Tanh,
    Where,
)
from minigrad.functional.linalg import Linear, MatMul
from minigrad.functional.loss import LogitsCrossEntropy
from minigrad.functional.nn import Gelu
from minigrad.functional.normalization import LayerNorm, Normalize
from minigrad.functional.reduction import ArgExtremum, Prod, Sum
from minigrad.functional.shape import (
    BroadcastTo,
    Concat,
    GetItem,
    Reshape,
    Split,
    SumTo,
    Transpose,
)
from minigrad.functional.softmax_family import LogSoftmax, Softmax

__all__ = ["LocalCall", "RULES", "Rule", "rule_for"]

B, P = broadcast, partial_sum


class Rule(NamedTuple):
    """How an op runs on global tensors (see the module docstring)."""

    sbp: Callable  # (op, args, sbps of one mesh dim) -> (input sbps, output sbps)
    shape: Callable  # (op, args) -> logical output shapes
    dtype: Callable | None = None  # (op, args) -> output dtypes; None: run on stand-ins
    local: Callable | None = None  # (op, views, LocalCall) -> outputs; None: op(*views)


class LocalCall(NamedTuple):
    """What a rule's ``local`` sees besides the local pieces: the logical arguments, the output
    nd-SBPs and this rank's output piece shapes."""

    args: tuple
    out_sbps: list
    out_pieces: list


RULES: dict[type, Rule] = {}


def rule_for(op) -> Rule | None:
    """The rule of ``op``'s class (or of its nearest base class that has one)."""
    for cls in type(op).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    return None


def _is(s, kind: str, dim: int | None = None) -> bool:
    return isinstance(s, SBP) and s.kind == kind and (dim is None or s.dim == dim)


def _tensors(args) -> list:
    return [(i, x) for i, x in enumerate(args) if isinstance(x, Tensor)]


def _same_dtype(op, args) -> list:
    return [next(x for x in args if isinstance(x, Tensor)).dtype]


def _promoted_dtype(op, args) -> list:
    return [np.result_type(*(x.dtype for _, x in _tensors(args)))]


# -------------------------------------------------------------------------------------------------
# elementwise: a split survives on an axis every full-size operand shares; partial sums survive
# the linear ops


def _elementwise_shape(op, args) -> list:
    return [tuple(np.broadcast_shapes(*(x.shape for _, x in _tensors(args))))]


def _partial_add(args, sbps):
    """Sums: all operands tensors, one of them partial -> all partial (boxing B -> P is free)."""
    if len(_tensors(args)) == len(args) and any(_is(s, "P") for s in sbps):
        return [P] * len(args)
    return None


def _partial_scale(args, sbps):
    """Products: the first partial operand stays partial, the other operands broadcast."""
    first = next((i for i, s in enumerate(sbps) if _is(s, "P")), None)
    if first is None:
        return None
    return [None if s is None else (P if i == first else B) for i, s in enumerate(sbps)]


def _partial_numerator(args, sbps):
    """Division: a partial numerator over a broadcast denominator stays partial."""
    if _is(sbps[0], "P"):
        return [P] + [None if s is None else B for s in sbps[1:]]
    return None


def _partial_unary(args, sbps):
    """Sign change, float casts and copies are linear: a partial sum stays one."""
    x, to = args[0], (args[1] if len(args) > 1 else None)
    if _is(sbps[0], "P") and (not isinstance(to, np.dtype) or (
            x.dtype.kind == "f" and to.kind == "f")):
        return [P] + [None] * (len(args) - 1)
    return None


_LINEAR = {Add: _partial_add, Sub: _partial_add, Mul: _partial_scale, Div: _partial_numerator,
           Neg: _partial_unary, AsType: _partial_unary, Copy: _partial_unary}


def _elementwise_sbp(op, args, sbps):
    (out,) = _elementwise_shape(op, args)
    n = len(out)
    axis = None
    for i, x in _tensors(args):
        s = sbps[i]
        if _is(s, "S") and x.shape[s.dim] == out[s.dim + n - x.ndim]:
            axis = s.dim + n - x.ndim
            break
    if axis is not None:
        ins = [None] * len(args)
        for i, x in _tensors(args):
            a = axis - (n - x.ndim)
            ins[i] = split(a) if a >= 0 and x.shape[a] == out[axis] else B
        return ins, [split(axis)]
    linear = _LINEAR.get(type(op))
    ins = linear(args, sbps) if linear is not None else None
    if ins is not None:
        return ins, [P]
    return [None if s is None else B for s in sbps], [B]


_ELEMENTWISE = Rule(_elementwise_sbp, _elementwise_shape)
for _cls in (Add, Sub, Mul, Div, Pow, Maximum, Minimum, Where, Neg, Exp, Log, Log1p, Expm1,
             Sqrt, Sin, Cos, Tanh, Sigmoid, Erf, Abs, Relu, AsType, Copy, Atan2, LogAddExp,
             LogSigmoid, Gelu, Raw):
    RULES[_cls] = _ELEMENTWISE


# -------------------------------------------------------------------------------------------------
# matrix products


def _matmul_shape(op, args) -> list:
    a, b = args
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return [batch + (a.shape[-2], b.shape[-1])]


def _matmul_sbp(op, args, sbps):
    a, b = args
    sa, sb = sbps
    (out,) = _matmul_shape(op, args)
    n = len(out)
    if _is(sa, "S", a.ndim - 2):  # rows of a: data parallel
        return [sa, B], [split(n - 2)]
    if _is(sb, "S", b.ndim - 1):  # columns of b
        return [B, sb], [split(n - 1)]
    if _is(sa, "S", a.ndim - 1) or _is(sb, "S", b.ndim - 2):  # the contracted axis
        return [split(a.ndim - 1), split(b.ndim - 2)], [P]
    for x, s, other in ((a, sa, b), (b, sb, a)):  # a batch axis
        if _is(s, "S") and x.shape[s.dim] == out[s.dim + n - x.ndim]:
            axis = s.dim + n - x.ndim
            k = axis - (n - other.ndim)
            o = split(k) if k >= 0 and other.shape[k] == out[axis] else B
            return ([s, o] if x is a else [o, s]), [split(axis)]
    if _is(sa, "P"):
        return [P, B], [P]
    if _is(sb, "P"):
        return [B, P], [P]
    return [B, B], [B]


RULES[MatMul] = Rule(_matmul_sbp, _matmul_shape, _promoted_dtype)


def _linear_shape(op, args) -> list:
    x, w, _ = args
    return [(x.shape[0], w.shape[0])]


def _linear_sbp(op, args, sbps):
    sx, sw, sb = sbps
    bias = args[2] is not None
    b = (lambda s: s if bias else None)
    if _is(sx, "S", 0):
        return [sx, B, b(B)], [split(0)]
    if _is(sw, "S", 0):  # output features
        return [B, sw, b(split(0))], [split(1)]
    if _is(sx, "S", 1) or _is(sw, "S", 1):  # input features: partial sums, bias added once
        return [split(1), split(1), b(P)], [P]
    if _is(sx, "P"):
        return [P, B, b(P)], [P]
    if _is(sw, "P"):
        return [B, P, b(P)], [P]
    return [B, B, b(B)], [B]


RULES[Linear] = Rule(_linear_sbp, _linear_shape, _promoted_dtype)


# -------------------------------------------------------------------------------------------------
# reductions and normalisations


def _reduced_shape(shape, axes, keepdims) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _reduce_shape(op, args) -> list:
    x, axes, keepdims = args[:3]
    return [_reduced_shape(x.shape, axes, keepdims)]


def _kept_axis(a: int, axes, keepdims) -> int:
    return a if keepdims else a - sum(1 for r in axes if r < a)


def _sum_sbp(op, args, sbps):
    x, axes, keepdims = args
    s = sbps[0]
    if _is(s, "S"):
        return [s, None, None], [P if s.dim in axes else split(_kept_axis(s.dim, axes, keepdims))]
    return [s, None, None], [s]  # partial sums add up; broadcast stays


def _nonlinear_reduce_sbp(op, args, sbps):
    x, axes, keepdims = args[:3]
    s = sbps[0]
    rest = [None] * (len(args) - 1)
    if _is(s, "S") and s.dim not in axes:
        return [s] + rest, [split(_kept_axis(s.dim, axes, keepdims))]
    return [B] + rest, [B]


RULES[Sum] = Rule(_sum_sbp, _reduce_shape)
RULES[Prod] = Rule(_nonlinear_reduce_sbp, _reduce_shape)


def _argext_shape(op, args) -> list:
    x, axis, keepdims = args[:3]
    if axis is None:
        return [(1,) * x.ndim if keepdims else ()]
    return [_reduced_shape(x.shape, (axis,), keepdims)]


def _argext_sbp(op, args, sbps):
    x, axis, keepdims, _ = args
    s = sbps[0]
    if _is(s, "S") and axis is not None and s.dim != axis:
        return [s, None, None, None], [split(_kept_axis(s.dim, (axis,), keepdims))]
    return [B, None, None, None], [B]


RULES[ArgExtremum] = Rule(_argext_sbp, _argext_shape, dtype=lambda op, args: [np.dtype("int32")])


def _along_axes_sbp(axes_of: Callable):
    """Softmax-like ops over some axes: a split elsewhere survives; over them it is gathered."""

    def sbp(op, args, sbps):
        s = sbps[0]
        rest = [None] * (len(args) - 1)
        if _is(s, "S") and s.dim not in axes_of(args):
            return [s] + rest, [s]
        return [B] + rest, [B]

    return sbp


def _same_shape(op, args) -> list:
    return [args[0].shape]


RULES[Softmax] = RULES[LogSoftmax] = Rule(_along_axes_sbp(lambda args: (args[1],)), _same_shape)
RULES[Normalize] = Rule(_along_axes_sbp(lambda args: tuple(args[1])), _same_shape)


def _layer_norm_sbp(op, args, sbps):
    """``LayerNorm(x, weight, bias, axes, eps)``: a split of ``x`` outside the normalised axes
    survives (each row is normalised on its own); the affine parameters are whole on every rank
    (so their gradients come back as partial sums)."""
    s = sbps[0]
    out = s if _is(s, "S") and s.dim not in args[3] else B
    return [out, *(None if p is None else B for p in args[1:3]), None, None], [out]


RULES[LayerNorm] = Rule(_layer_norm_sbp, _same_shape)


def _ce_shape(op, args) -> list:
    pred, _, reduction = args
    return [(pred.shape[0],) if reduction == "none" else ()]


def _ce_sbp(op, args, sbps):
    sp, sl, _ = sbps
    reduction = args[2]
    if _is(sp, "S", 0) or _is(sl, "S", 0):  # the batch is split: per-sample losses stay split
        return [split(0), split(0), None], [split(0) if reduction == "none" else P]
    return [B, B, None], [B]


def _ce_local(op, views, call: LocalCall):
    pred, label, reduction = views
    if reduction == "mean" and any(_is(s, "P") for s in call.out_sbps[0]):
        # each rank sums its samples; divided by the logical batch, the partial sums add up to
        # the mean
        return op(pred, label, "sum") * (1.0 / call.args[0].shape[0])
    return op(*views)


RULES[LogitsCrossEntropy] = Rule(_ce_sbp, _ce_shape, None, _ce_local)


# -------------------------------------------------------------------------------------------------
# shapes and indexing: a split survives where the split axis itself is untouched


def _reshape_target(x, shape) -> tuple:
    shape = tuple(int(n) for n in shape)
    if -1 in shape:
        known = int(np.prod([n for n in shape if n != -1]))
        shape = tuple(x.size // known if n == -1 else n for n in shape)
    return shape


def _reshape_shape(op, args) -> list:
    return [_reshape_target(args[0], args[1])]


def _split_survives(shape: tuple, target: tuple, d: int, mesh_size: int | None) -> bool:
    """Whether ``split(d)`` of ``shape`` is ``split(d)`` of ``target`` too: axis ``d`` untouched,
    or (over ``mesh_size`` ranks that divide it evenly, so the pieces stay balanced) merged with
    the axes after it (``(N, L, K) -> (N * L, K)``, as ``F.linear`` flattens a batch) or cut
    into ``target[d]`` and axes after it (back again)."""
    if shape[:d] != target[:d] or len(target) <= d:
        return False
    if shape[d] == target[d]:
        return True
    if not mesh_size:
        return False
    if target[d] > shape[d] and shape[d] % mesh_size == 0:  # merged with the following axes
        return any(math.prod(shape[d:j]) == target[d] for j in range(d + 2, len(shape) + 1))
    if target[d] < shape[d] and target[d] % mesh_size == 0:  # cut into several axes
        return any(math.prod(target[d:j]) == shape[d] for j in range(d + 2, len(target) + 1))
    return False


def _reshape_sbp(op, args, sbps, mesh_size: int | None = None):
    x, target = args[0], _reshape_target(args[0], args[1])
    s = sbps[0]
    if _is(s, "S"):
        keep = _split_survives(tuple(x.shape), target, s.dim, mesh_size)
        return ([s, None], [s]) if keep else ([B, None], [B])
    return [s, None], [s]  # a reshape is linear: partial sums stay partial


_reshape_sbp.takes_mesh_size = True


def _local_target(op, views, call: LocalCall):
    """Shape-taking ops run locally with the output piece's shape as the target."""
    return op(views[0], call.out_pieces[0])


RULES[Reshape] = Rule(_reshape_sbp, _reshape_shape, _same_dtype, _local_target)


def _transpose_sbp(op, args, sbps):
    s, axes = sbps[0], args[1]
    if _is(s, "S"):
        return [s, None], [split(list(axes).index(s.dim))]
    return [s, None], [s]


RULES[Transpose] = Rule(_transpose_sbp,
                        lambda op, args: [tuple(args[0].shape[a] for a in args[1])], _same_dtype)


def _broadcast_to_sbp(op, args, sbps):
    x, shape = args
    s = sbps[0]
    if _is(s, "S"):
        axis = s.dim + len(shape) - x.ndim
        return ([s, None], [split(axis)]) if x.shape[s.dim] == shape[axis] else ([B, None], [B])
    return [s, None], [s]


def _sum_to_sbp(op, args, sbps):
    x, shape = args
    s = sbps[0]
    if _is(s, "S"):
        axis = s.dim - (x.ndim - len(shape))
        kept = axis >= 0 and shape[axis] == x.shape[s.dim]
        return [s, None], [split(axis) if kept else P]
    return [s, None], [s]


RULES[BroadcastTo] = Rule(_broadcast_to_sbp, lambda op, args: [tuple(args[1])], _same_dtype,
                          _local_target)
RULES[SumTo] = Rule(_sum_to_sbp, lambda op, args: [tuple(args[1])], _same_dtype, _local_target)


def _basic_axes(index, ndim: int):
    """For a basic index: input axis -> output axis of the axes it keeps whole, or None when the
    index is not basic (arrays, masks)."""
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))
               for i in items):
        return None
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items = items[:at] + (slice(None),) * (ndim - used) + items[at + 1:]
    items = items + (slice(None),) * (ndim - sum(1 for i in items if i is not None))
    whole, a, o = {}, 0, 0
    for i in items:
        if i is None:
            o += 1
        elif isinstance(i, slice):
            if i == slice(None):
                whole[a] = o
            a, o = a + 1, o + 1
        else:
            a += 1
    return whole


def _getitem_shape(op, args) -> list:
    x, index = args
    return [np.broadcast_to(np.empty((), np.bool_), x.shape)[index].shape]


def _getitem_sbp(op, args, sbps):
    x, index = args
    s = sbps[0]
    if _is(s, "S"):
        whole = _basic_axes(index, x.ndim)
        if whole is not None and s.dim in whole:
            return [s, None], [split(whole[s.dim])]
        return [B, None], [B]
    return [s, None], [s]  # indexing is linear


RULES[GetItem] = Rule(_getitem_sbp, _getitem_shape, _same_dtype)


def _concat_shape(op, args) -> list:
    axis, xs = args[0], args[1:]
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return [tuple(shape)]


def _concat_sbp(op, args, sbps):
    axis = args[0]
    s = next((s for s in sbps[1:] if _is(s, "S") and s.dim != axis), None)
    if s is not None:
        return [None] + [s] * (len(args) - 1), [s]
    if all(_is(s, "P") for s in sbps[1:]):
        return [None] + [P] * (len(args) - 1), [P]
    return [None] + [B] * (len(args) - 1), [B]


RULES[Concat] = Rule(_concat_sbp, _concat_shape)


def _split_shape(op, args) -> list:
    x, axis, bounds = args
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        shape = list(x.shape)
        shape[axis] = b - a
        out.append(tuple(shape))
    return out


def _split_sbp(op, args, sbps):
    x, axis, bounds = args
    s = sbps[0]
    n = len(bounds) - 1
    if _is(s, "S") and s.dim == axis:
        return [B, None, None], [B] * n
    return [s, None, None], [s] * n


RULES[Split] = Rule(_split_sbp, _split_shape, lambda op, args: [args[0].dtype] * (
    len(args[2]) - 1))
