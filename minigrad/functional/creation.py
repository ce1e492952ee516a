"""Tensor factories: zeros, ones, full, arange, linspace, eye and the ``*_like`` variants."""

from __future__ import annotations

import numpy as np

from minigrad.backend.device import as_device
from minigrad.tensor import Tensor, as_dtype

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


def _make(fn, dtype, device, *args) -> Tensor:
    dev = as_device(device)
    dtype = as_dtype(dtype) if dtype is not None else np.dtype(np.float32)
    with dev.context():
        return Tensor._wrap(fn(dev.xp)(*args, dtype=dtype), dev)


def _shape(shape) -> tuple:
    if isinstance(shape, Tensor):
        shape = shape.numpy().tolist()
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def zeros(shape, dtype="float32", device=None) -> Tensor:
    return _make(lambda xp: xp.zeros, dtype, device, _shape(shape))


def ones(shape, dtype="float32", device=None) -> Tensor:
    return _make(lambda xp: xp.ones, dtype, device, _shape(shape))


def full(shape, value, dtype="float32", device=None) -> Tensor:
    return _make(lambda xp: xp.full, dtype, device, _shape(shape), value)


def eye(n: int, m: int | None = None, dtype="float32", device=None) -> Tensor:
    return _make(lambda xp: xp.eye, dtype, device, int(n), None if m is None else int(m))


def arange(start=0, stop=None, step=1, dtype="float32", device=None) -> Tensor:
    """Like ``np.arange``; float32 by default as in MegEngine."""
    if stop is None:
        start, stop = 0, start
    return _make(lambda xp: xp.arange, dtype, device, start, stop, step)


def linspace(start, stop, num: int, dtype="float32", device=None) -> Tensor:
    dev = as_device(device)
    return Tensor._wrap(dev.xp.linspace(start, stop, int(num)).astype(as_dtype(dtype)), dev)


def _like(x: Tensor, dtype):
    return (x.dtype if dtype is None else dtype), x.device


def zeros_like(x: Tensor, dtype=None) -> Tensor:
    return zeros(x.shape, *_like(x, dtype))


def ones_like(x: Tensor, dtype=None) -> Tensor:
    return ones(x.shape, *_like(x, dtype))


def full_like(x: Tensor, value, dtype=None) -> Tensor:
    dtype, device = _like(x, dtype)
    return full(x.shape, value, dtype, device)
