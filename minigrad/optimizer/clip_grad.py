"""Gradient clipping: by global norm (``clip_grad_norm``) and by value (``clip_grad_value``)."""

from __future__ import annotations

import math
from typing import Iterable

import minigrad.functional as F
from minigrad.autodiff import no_grad
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import get_array_module, on_device_of

#: Added to the total norm before dividing (MegEngine's and PyTorch's value), so that all-zero
#: gradients give a finite scale instead of a division by zero.
CLIP_NORM_EPS = 1e-6


def _with_grad(tensors) -> list[Tensor]:
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    return [t for t in tensors if t.grad is not None]


def clip_grad_norm(tensors: Iterable[Tensor] | Tensor, max_norm: float,
                   ord: float = 2.0) -> Tensor:
    """Scale all gradients together so that their joint ``ord``-norm is at most ``max_norm``.

    Returns the norm *before* clipping (a scalar float32 Tensor), as MegEngine and PyTorch do.
    The scale is ``max_norm / (norm + CLIP_NORM_EPS)``, applied only when it is below 1. On a GPU
    the norm never leaves the device: the scale is clamped to 1 there and always applied (as
    PyTorch does), so clipping does not wait for the GPU.

    Example::

        total = optim.clip_grad_norm(model.parameters(), max_norm=1.0)
    """
    if max_norm < 0:
        raise ValueError(f"clip_grad_norm: max_norm must be >= 0, got {max_norm}")
    ts = _with_grad(tensors)
    if not ts:
        return Tensor(0.0)
    ord = float(ord)
    device = ts[0].device
    reducers = _shard_reducers(ts)
    on_host = device.kind == "cpu" or any(t.grad.device != device for t in ts) or bool(reducers)
    if reducers:
        total = _sharded_total_norm(ts, reducers, ord)
    else:
        total = _total_norm([t.grad.data for t in ts], ord, on_host)
    scale = max_norm / (total + CLIP_NORM_EPS)
    if on_host and scale >= 1.0:
        return Tensor(total, dtype="float32", device=device)
    if not on_host:
        scale = get_array_module(scale).minimum(scale, 1.0)
    with no_grad():  # gradients are values here, not part of any recorded graph
        for t in ts:
            factor = scale if on_host else Tensor(scale.astype(t.grad.dtype), device=device)
            t.grad = t.grad * factor
    return Tensor(total, dtype="float32", device=device)


def _shard_reducers(ts) -> dict:
    """``{id(reducer): reducer}`` of the tensors that are shards of a parameter split over ranks.

    Such a tensor (a piece made by ``dist.fully_shard`` or ``dist.ZeroRedundancyOptimizer``)
    carries a ``shard_reducer`` whose ``all_reduce(values, op)`` combines per-rank partial results
    over its group, so norms here are over whole parameters without this layer importing the
    distributed one."""
    found = {}
    for t in ts:
        reducer = getattr(t, "shard_reducer", None)
        if reducer is not None:
            found[id(reducer)] = reducer
    return found


def _sharded_total_norm(ts, reducers: dict, ord: float) -> float:
    """The joint norm when some tensors are shards: each group's partial (sum of ``|g|^ord``, or
    max) combined over its ranks with one collective, then with the replicated tensors'. The
    summation order differs from one process's, so the result agrees to rounding (~1e-15)."""
    inf = math.isinf(ord)
    plain = [t.grad.data for t in ts if getattr(t, "shard_reducer", None) is None]
    parts = [_power_sum(g, ord) for g in plain]
    for key, reducer in reducers.items():
        mine = [_power_sum(t.grad.data, ord) for t in ts
                if id(getattr(t, "shard_reducer", None)) == key]
        local = max(mine) if inf else sum(mine)
        parts.append(float(reducer.all_reduce([local], "max" if inf else "sum")[0]))
    total = max(parts) if inf else sum(parts)
    return total if inf else total ** (1.0 / ord)


def _power_sum(g, ord: float) -> float:
    """``sum(|g|^ord)`` in float64 (``max |g|`` for the infinity norm), as a Python float."""
    xp = get_array_module(g)
    with on_device_of(g):
        if math.isinf(ord):
            return float(xp.max(xp.abs(g))) if g.size else 0.0
        return float(xp.sum(xp.abs(g.astype("float64")) ** ord))


def _total_norm(grads, ord: float, on_host: bool):
    """The joint ``ord``-norm of the arrays ``grads``, in float64: a Python float ``on_host``,
    else a 0-d array on their (one) GPU. Partial results are combined one by one, in order, so both
    forms give the same number."""
    parts = []
    for g in grads:
        xp = get_array_module(g)
        with on_device_of(g):
            if math.isinf(ord):
                part = xp.max(xp.abs(g)).astype("float64") if g.size else xp.zeros((), "float64")
            else:
                part = xp.sum(xp.abs(g.astype("float64")) ** ord)
        parts.append(float(part) if on_host else part)
    xp = get_array_module(grads[0])
    with on_device_of(grads[0]):
        total = parts[0]
        for part in parts[1:]:
            total = xp.maximum(total, part) if math.isinf(ord) else total + part
        return total if math.isinf(ord) else total ** (1.0 / ord)


def clip_grad_value(tensors: Iterable[Tensor] | Tensor, lower: float, upper: float) -> None:
    """Clamp every gradient element into ``[lower, upper]``."""
    if lower > upper:
        raise ValueError(f"clip_grad_value: lower ({lower}) must be <= upper ({upper})")
    with no_grad():
        for t in _with_grad(tensors):
            t.grad = F.clip(t.grad, lower, upper)
