"""Tensor factories: zeros, ones, full, arange, linspace, eye and the ``*_like`` variants.

Float32 by default, as in MegEngine (NumPy would give float64), on the default device unless
``device`` says otherwise. ``zeros``, ``ones``, ``full`` and ``arange`` also take OneFlow's
``placement=`` and ``sbp=``: the result is then a global tensor with that logical value (each rank
keeps its piece), and the ``*_like`` variants of a global tensor are global alike.
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Tensor, as_dtype, place_new_tensor
from minigrad.backend.device import as_device

__all__ = [
    "arange",
    "eye",
    "full",
    "full_like",
    "linspace",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]


def _make(fn, dtype, device, *args, placement=None, sbp=None, op: str = "") -> Tensor:
    dev = as_device(device)
    dtype = as_dtype(dtype) if dtype is not None else np.dtype(np.float32)
    with dev.context():
        out = Tensor._wrap(fn(dev.xp)(*args, dtype=dtype), dev)
    if placement is not None or sbp is not None:
        place_new_tensor(out, placement, sbp, op)
    return out


def _shape(shape) -> tuple:
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def zeros(shape, dtype="float32", device=None, *, placement=None, sbp=None) -> Tensor:
    """A tensor of zeros of ``shape`` (an int or a tuple) on ``device`` (default: the default
    device); with ``placement`` and ``sbp``, a global tensor of that logical shape.

    Example::

        F.zeros((2, 3))   # float32 zeros, like MegEngine
    """
    return _make(lambda xp: xp.zeros, dtype, device, _shape(shape), placement=placement,
                 sbp=sbp, op="zeros")


def ones(shape, dtype="float32", device=None, *, placement=None, sbp=None) -> Tensor:
    """A tensor of ones of ``shape`` on ``device`` (global with ``placement`` and ``sbp``)."""
    return _make(lambda xp: xp.ones, dtype, device, _shape(shape), placement=placement, sbp=sbp,
                 op="ones")


def full(shape, value, dtype=None, device=None, *, placement=None, sbp=None) -> Tensor:
    """A tensor of ``shape`` filled with ``value`` (global with ``placement`` and ``sbp``).
    Without ``dtype`` the type follows the value as in MegEngine: bool -> bool, int -> int32,
    float -> float32."""
    if dtype is None:
        dtype = "bool" if isinstance(value, (bool, np.bool_)) else (
            "int32" if isinstance(value, (int, np.integer)) else "float32")
    return _make(lambda xp: xp.full, dtype, device, _shape(shape), value, placement=placement,
                 sbp=sbp, op="full")


def eye(N, M: int | None = None, dtype="float32", device=None) -> Tensor:
    """Ones on the main diagonal: ``eye(3)``, ``eye(2, 4)`` or MegEngine's ``eye((2, 4))`` (a
    shape as the first argument)."""
    if M is None and not isinstance(N, (int, np.integer)):
        rows_cols = _shape(N)
        if len(rows_cols) not in (1, 2):
            raise ValueError(f"eye: shape must have 1 or 2 entries, got {rows_cols}")
        N, M = rows_cols[0], rows_cols[-1]
    return _make(lambda xp: xp.eye, dtype, device, int(N), None if M is None else int(M))


def arange(start=0, stop=None, step=1, dtype="float32", device=None, *, placement=None,
           sbp=None) -> Tensor:
    """``start, start + step, ...`` up to ``stop`` (excluded), like ``np.arange``; float32 by
    default as in MegEngine (``arange(n)`` counts from 0). Global with ``placement`` and ``sbp``."""
    if stop is None:
        start, stop = 0, start
    return _make(lambda xp: xp.arange, dtype, device, start, stop, step, placement=placement,
                 sbp=sbp, op="arange")


def linspace(start, stop, num: int, dtype="float32", device=None) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop``, both included."""
    dev = as_device(device)
    return Tensor._wrap(dev.xp.linspace(start, stop, int(num)).astype(as_dtype(dtype)), dev)


def _like(x: Tensor, dtype):
    """dtype, device and (for a global ``x``) placement and sbp of a ``*_like`` result."""
    glob = dict(placement=x.placement, sbp=x.sbp) if x.is_global else {}
    return (x.dtype if dtype is None else dtype), x.device, glob


def zeros_like(inp: Tensor, dtype=None) -> Tensor:
    """Zeros with the shape, device and (unless ``dtype`` is given) dtype of ``inp`` (and its
    placement and sbp when it is global)."""
    dtype, device, glob = _like(inp, dtype)
    return zeros(inp.shape, dtype, device, **glob)


def ones_like(inp: Tensor, dtype=None) -> Tensor:
    """Ones with the shape, device, dtype (and global layout) of ``inp``."""
    dtype, device, glob = _like(inp, dtype)
    return ones(inp.shape, dtype, device, **glob)


def full_like(inp: Tensor, value, dtype=None) -> Tensor:
    """``value`` everywhere, with the shape, device, dtype (and global layout) of ``inp``."""
    dtype, device, glob = _like(inp, dtype)
    return full(inp.shape, value, dtype, device, **glob)
