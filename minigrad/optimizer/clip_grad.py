"""Gradient clipping: by global norm (``clip_grad_norm``) and by value (``clip_grad_value``)."""

from __future__ import annotations

import math
from typing import Iterable

import minigrad.functional as F
from minigrad.autodiff import no_grad
from minigrad.backend.xp import get_array_module
from minigrad.tensor import Tensor

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
    The scale is ``max_norm / (norm + CLIP_NORM_EPS)``, applied only when it is below 1.

    Example::

        total = optim.clip_grad_norm(model.parameters(), max_norm=1.0)
    """
    if max_norm < 0:
        raise ValueError(f"clip_grad_norm: max_norm must be >= 0, got {max_norm}")
    ts = _with_grad(tensors)
    if not ts:
        return Tensor(0.0)
    ord = float(ord)
    norms = []
    for t in ts:
        g = t.grad.data
        xp = get_array_module(g)
        if math.isinf(ord):
            norms.append(float(xp.max(xp.abs(g))) if g.size else 0.0)
        else:
            norms.append(float(xp.sum(xp.abs(g.astype("float64")) ** ord)))
    total = max(norms) if math.isinf(ord) else sum(norms) ** (1.0 / ord)
    scale = max_norm / (total + CLIP_NORM_EPS)
    if scale < 1.0:
        with no_grad():  # gradients are values here, not part of any recorded graph
            for t in ts:
                t.grad = t.grad * scale
    return Tensor(total, dtype="float32", device=ts[0].device)


def clip_grad_value(tensors: Iterable[Tensor] | Tensor, lower: float, upper: float) -> None:
    """Clamp every gradient element into ``[lower, upper]``."""
    if lower > upper:
        raise ValueError(f"clip_grad_value: lower ({lower}) must be <= upper ({upper})")
    with no_grad():
        for t in _with_grad(tensors):
            t.grad = F.clip(t.grad, lower, upper)
