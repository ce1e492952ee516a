"""Small helpers shared by the functional modules: argument coercion and array access."""

from __future__ import annotations

import numbers

import numpy as np

from minigrad.autodiff.state import STATE
from minigrad.backend.xp import cupy_or_none
from minigrad.tensor import Tensor, as_dtype

FLOAT32 = np.dtype(np.float32)


def is_array(x) -> bool:
    if isinstance(x, np.ndarray):
        return True
    cp = cupy_or_none()
    return cp is not None and isinstance(x, cp.ndarray)


def as_tensor(x, like: Tensor | None = None, dtype=None) -> Tensor:
    """Turn ``x`` into a Tensor on ``like``'s device (Tensors pass through untouched)."""
    if isinstance(x, Tensor):
        return x
    return Tensor(x, dtype=dtype, device=like._device if like is not None else None)


def binary_args(a, b, op: str):
    """Coerce the operands of a binary op.

    Tensor (+) Tensor follows NumPy promotion; Tensor (+) Python scalar keeps the tensor dtype (the scalar
    stays a Python number, which NumPy and CuPy treat as weakly typed), except that an integer tensor
    meeting a float scalar becomes float32. Arrays and lists become tensors on the tensor's device.
    """
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    if ta and tb:
        return a, b
    if not ta and not tb:
        a = as_tensor(a)
        ta = True
    t, s = (a, b) if ta else (b, a)
    if isinstance(s, numbers.Number) and not isinstance(s, np.ndarray):
        if isinstance(s, (float, np.floating)) and t._data.dtype.kind != "f":
            t = t.astype(FLOAT32)
        if isinstance(s, np.generic):
            s = s.item()
    else:
        s = Tensor(s, device=t._device)
    return (t, s) if ta else (s, t)


def data(x):
    """The backend array of a Tensor, or ``x`` itself for constants."""
    return x._data if isinstance(x, Tensor) else x


def recording_backward() -> bool:
    """True inside a backward whose ops are being recorded for a higher-order gradient."""
    return STATE.enabled and STATE.recording > 0


def normalize_axis(axis, ndim: int, op: str):
    """Axis (int, tuple or None) -> tuple of non-negative ints, with a clear error when out of range."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % max(ndim, 1))
    return tuple(out)


__all__ = ["as_dtype", "as_tensor", "binary_args", "data", "normalize_axis", "recording_backward"]
