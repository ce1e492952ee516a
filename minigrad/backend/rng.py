"""The random generators behind every random draw in minigrad: one per backend, seeded together.

A seeded CPU run is identical on every machine, and a seeded GPU run identical across GPU runs.
The generators live here, in the bottom layer, because ops of every layer draw from them (dropout,
parameter initialisation, ``mg.random``) and none of those may depend on another to get at them.
"""

from __future__ import annotations

import numpy as np

from minigrad.backend.device import as_device

_cpu_rng = np.random.default_rng()
_gpu_rng = None
_seed: int | None = None


def seed(value: int) -> None:
    """Seed every generator minigrad uses (parameter init, dropout, random tensors).

    Example::

        mg.random.seed(0)   # the same initial weights and dropout masks on every run
    """
    global _cpu_rng, _gpu_rng, _seed
    _seed = int(value)
    _cpu_rng = np.random.default_rng(_seed)
    _gpu_rng = None  # created from the seed on first GPU use


def get_rng(device=None):
    """The generator for ``device``: NumPy's ``Generator`` on the CPU, CuPy's on a GPU."""
    global _gpu_rng
    dev = as_device(device)
    if dev.kind == "cpu":
        return _cpu_rng
    if _gpu_rng is None:
        _gpu_rng = dev.xp.random.default_rng(_seed)
    return _gpu_rng
