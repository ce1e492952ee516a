"""Random tensors (``mg.random``), reproducible under ``seed``.

The generators themselves (one per backend, seeded together by ``seed``) are in
``minigrad.backend.rng``; this module draws tensors from them.

Example::

    mg.random.seed(0)
    x = mg.random.normal(0.0, 1.0, size=(2, 3))   # float32, on the default device
"""

from __future__ import annotations

import numpy as np

from minigrad.backend.device import as_device
from minigrad.backend.rng import get_rng, seed
from minigrad.tensor import Tensor, as_dtype

__all__ = ["get_rng", "normal", "permutation", "seed", "uniform"]


def _cast(arr, dtype):
    return arr.astype(as_dtype(dtype) if dtype is not None else np.float32, copy=False)


def normal(mean: float = 0.0, std: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    """Samples of the normal distribution ``N(mean, std**2)`` of shape ``size`` (a scalar when
    None)."""
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).standard_normal(size=() if size is None else size) * std + mean
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def uniform(low: float = 0.0, high: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    """Samples of the uniform distribution on ``[low, high)`` of shape ``size`` (a scalar when
    None)."""
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).uniform(low, high, size=() if size is None else size)
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def permutation(n: int, dtype="int32", device=None) -> Tensor:
    """A random permutation of ``0..n-1`` (drawn on the CPU generator, so it is the same for a
    given seed whatever the device)."""
    dev = as_device(device)
    order = get_rng("cpu0").permutation(int(n))
    return Tensor._wrap(dev.xp.asarray(order).astype(as_dtype(dtype)), dev)
