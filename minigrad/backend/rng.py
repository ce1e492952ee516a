"""The random generators behind every random draw in minigrad: NumPy's for the CPU and one CuPy
generator per GPU, seeded together.

A seeded CPU run is identical on every machine, and a seeded GPU run identical across GPU runs.
Each GPU has its own generator because a CuPy generator keeps its state on the device where it was
made and can only draw there; every GPU generator starts from the same seed (as
``torch.manual_seed`` seeds every GPU), so a draw does not depend on which GPU a rank was given.
The generators live here, in the bottom layer, because ops of every layer draw from them (dropout,
parameter initialisation, ``mg.random``) and none of those may depend on another to get at them.
"""

from __future__ import annotations

import numpy as np

from minigrad import seams
from minigrad.backend.device import as_device
from minigrad.backend.xp import to_numpy

_cpu_rng = np.random.default_rng()
_gpu_rngs: dict[int, object] = {}  # GPU index -> its generator, made on first use
_seed: int | None = None


def _forget_gpu_generators() -> None:
    _gpu_rngs.clear()


seams.GPU_ARRAYS.watch(lambda _arrays: _forget_gpu_generators())  # CuPy swapped (tests)


def seed(value: int) -> None:
    """Seed every generator minigrad uses (parameter init, dropout, random tensors).

    Example::

        mg.random.seed(0)   # the same initial weights and dropout masks on every run
    """
    global _cpu_rng, _seed
    _seed = int(value)
    _cpu_rng = np.random.default_rng(_seed)
    _gpu_rngs.clear()  # each is made again from the seed on its first use


def get_rng(device=None):
    """The generator for ``device``: NumPy's ``Generator`` on the CPU, the GPU's own CuPy
    ``Generator`` on a GPU (draw from it while that GPU is current: inside
    ``device.context()``)."""
    dev = as_device(device)
    if dev.kind == "cpu":
        return _cpu_rng
    rng = _gpu_rngs.get(dev.index)
    if rng is None:
        with dev.context():  # the generator's state lives on the device current at creation
            rng = _gpu_rngs[dev.index] = dev.xp.random.default_rng(_seed)
    return rng


def gpu_generators_made() -> list[int]:
    """The indices of the GPUs whose generator exists (drawn from since the last :func:`seed`):
    the ones whose state a checkpoint must keep (the others start from the seed anyway)."""
    return sorted(_gpu_rngs)


def get_state(device=None):
    """A host copy of the state of ``device``'s generator, which :func:`set_state` takes back:
    NumPy's state dict on the CPU; on a GPU the NumPy copy of the one device array in which CuPy
    keeps the generator's whole state. Checkpoints save it, so a resumed run draws the same
    numbers (dropout masks, random tensors) as an uninterrupted one.

    Example::

        saved = get_state("gpu0")
        ...
        set_state("gpu0", saved)      # the next draws on gpu0 repeat
    """
    dev = as_device(device)
    bits = get_rng(dev).bit_generator
    if dev.kind == "cpu":
        return bits.state
    with dev.context():
        return np.array(to_numpy(bits._state), copy=True)


def set_state(device, state) -> None:
    """Restore ``device``'s generator to ``state`` from :func:`get_state` (on a GPU, an array of
    the generator's state shape and dtype, written on that GPU)."""
    dev = as_device(device)
    bits = get_rng(dev).bit_generator
    if dev.kind == "cpu":
        bits.state = state
        return
    state = np.asarray(state)
    with dev.context():
        own = bits._state
        if tuple(state.shape) != tuple(own.shape) or state.dtype != own.dtype:
            raise ValueError(
                f"set_state: the state of the {dev} generator is {tuple(own.shape)} "
                f"{np.dtype(own.dtype).name}, got {tuple(state.shape)} {state.dtype.name}")
        own[...] = dev.xp.asarray(state)
