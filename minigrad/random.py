"""Random tensors (``mg.random``), reproducible under ``seed``.

One generator per backend, seeded together, so a seeded CPU run is identical on every machine and a
seeded GPU run is identical across GPU runs.
"""

from __future__ import annotations

import numpy as np

from minigrad.backend.device import as_device
from minigrad.tensor import Tensor, as_dtype

_rng = np.random.default_rng()
_gpu_rng = None
_seed = None


def seed(value: int) -> None:
    """Seed every generator minigrad uses (parameter init, dropout, random tensors)."""
    global _rng, _gpu_rng, _seed
    _seed = int(value)
    _rng = np.random.default_rng(_seed)
    _gpu_rng = None


def get_rng(device=None):
    """The generator for ``device``: numpy's Generator on the CPU, cupy's on a GPU."""
    global _gpu_rng
    dev = as_device(device)
    if dev.kind == "cpu":
        return _rng
    if _gpu_rng is None:
        _gpu_rng = dev.xp.random.default_rng(_seed)
    return _gpu_rng


def _cast(arr, dtype):
    return arr.astype(as_dtype(dtype) if dtype is not None else np.float32, copy=False)


def normal(mean: float = 0.0, std: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).standard_normal(size=() if size is None else size) * std + mean
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def uniform(low: float = 0.0, high: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).uniform(low, high, size=() if size is None else size)
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def permutation(n: int, dtype="int32", device=None) -> Tensor:
    dev = as_device(device)
    return Tensor._wrap(dev.xp.asarray(_rng.permutation(int(n))).astype(as_dtype(dtype)), dev)
