"""Shared fixtures: a ``device`` fixture that runs a test on every available backend, and the
``gpu`` marker, which skips cleanly on machines without CuPy or a CUDA device.

GPUs are counted without initialising CUDA in this process (``probe_gpus`` reads the operating
system), so tests that fork GPU ranks later still can. ``MINIGRAD_TEST_FAKE_GPU=gpu1`` runs the
``device`` tests on the fake CuPy (``tests/fakes/fake_cupy.py``, two devices) as well: on
``gpu1`` while device 0 is current, which finds every kernel launched outside its tensor's device,
every NumPy call on a device array and every implicit host copy, without a GPU; with
``MINIGRAD_TEST_CUDA_ON_CPU=1`` as well, minigrad's kernels there are ``gpu.py``'s CUDA C run on
the CPU (``tests/fakes/cuda_on_cpu.py``) instead of their CPU versions.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from fakes import cuda_on_cpu, fake_cupy

import minigrad as mg
from minigrad.backend import blas
from minigrad.backend.device import probe_gpus
from minigrad.testing import check_double_grad

_HAS_CUDA = mg.is_cuda_available()
_NO_GPU_REASON = f"needs CuPy and a CUDA device ({probe_gpus().reason})"
_FAKE_GPU = os.environ.get("MINIGRAD_TEST_FAKE_GPU")

DEVICES = ["cpu0"] + ([pytest.param("gpu0", marks=pytest.mark.gpu)] if _HAS_CUDA else [])
if _FAKE_GPU and not _HAS_CUDA:
    _FAKE_INSTALL = fake_cupy.installed(2)  # kept: collecting it would uninstall the fake
    _FAKE = _FAKE_INSTALL.__enter__()  # for the whole session
    DEVICES.append(_FAKE_GPU)
    if os.environ.get("MINIGRAD_TEST_CUDA_ON_CPU") == "1":
        cuda_on_cpu.use_gpu_kernels(_FAKE)
# The CPU's products: NumPy's matmul, whatever the machine (MKL where installed would change the
# last bits some tests compare); MINIGRAD_TEST_BLAS=mkl sends every product MKL takes through MKL,
# however small (tests/backend/test_blas.py runs the op tests so).
if os.environ.get("MINIGRAD_TEST_BLAS") == "mkl":
    blas.select("mkl")
    blas.MIN_WORK = 0
else:
    blas.select("numpy")
# Tests place tensors on the GPU explicitly (the ``device`` fixture); everything else stays on the
# CPU on GPU machines too (there the default would be gpu0).
mg.set_default_device("cpu0")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs CuPy and a CUDA device (skipped without)")


def pytest_collection_modifyitems(config, items) -> None:
    """Skip every ``@pytest.mark.gpu`` test when no GPU is usable, with the reason shown."""
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason=_NO_GPU_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """The name of a device to run on: ``cpu0`` always, ``gpu0`` when CUDA is available."""
    return request.param


@pytest.fixture
def default_device(device):
    """``device`` made the default device for the test: for tests whose tensors name no device
    (MegEngine's documented examples), so that they run on ``gpu0`` too."""
    mg.set_default_device(device)
    yield device
    mg.set_default_device("cpu0")


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
