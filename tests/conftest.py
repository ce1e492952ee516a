"""Shared fixtures: a ``device`` fixture that runs a test on every available backend, and the
``gpu`` marker, which skips cleanly on machines without CuPy or a CUDA device."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import minigrad as mg
from minigrad.testing import check_double_grad

_HAS_CUDA = mg.is_cuda_available()

DEVICES = ["cpu0"] + ([pytest.param("gpu0", marks=pytest.mark.gpu)] if _HAS_CUDA else [])


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA device (skipped without)")


def pytest_collection_modifyitems(config, items) -> None:
    """Skip every ``@pytest.mark.gpu`` test when no GPU is usable, with the reason shown."""
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """The name of a device to run on: ``cpu0`` always, ``gpu0`` when CUDA is available."""
    return request.param


@pytest.fixture
def fake_gpu_tensor():
    """Make float32 ones that *claim* to live on gpu0 (the data stays NumPy): enough to reach the
    device checks of an op on machines without a GPU."""
    from minigrad.backend.device import Device

    def make(shape):
        dev = object.__new__(Device)
        dev.kind, dev.index, dev._xp, dev._context = "gpu", 0, np, contextlib.nullcontext()
        return mg.Tensor._wrap(np.ones(shape, np.float32), dev)

    return make


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator so every test draws the same inputs on every run."""
    return np.random.default_rng(0)


@pytest.fixture
def double_grad():
    """``check_double_grad(fn, *arrays, device=...)``: see its docstring."""
    return check_double_grad
