"""Shared fixtures: a ``device`` fixture that runs a test on every available backend, and the
``gpu`` marker, which skips cleanly on machines without CuPy or a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg

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
        if "gpu" in item.keywords:
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
        dev.kind, dev.index, dev._xp = "gpu", 0, np
        return mg.Tensor._wrap(np.ones(shape, np.float32), dev)

    return make


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded NumPy generator so every test draws the same inputs on every run."""
    return np.random.default_rng(0)


def _first_grads(fn, arrays, weights, device) -> list:
    """Gradients of ``sum(fn(*arrays) * weights)`` w.r.t. every array, as float64 NumPy arrays."""
    ts = [mg.tensor(a, device=device) for a in arrays]
    gm = mg.GradManager().attach(ts)
    with gm:
        gm.backward(fn(*ts), mg.tensor(weights, device=device))
    return [
        np.zeros_like(a) if t.grad is None else t.grad.numpy()
        for a, t in zip(arrays, ts, strict=True)
    ]


def check_double_grad(fn, *inputs, device="cpu0", eps=1e-5, rtol=1e-4, atol=1e-6, seed=0) -> None:
    """MegEngine's nested-GradManager second-order gradient, checked against finite differences.

    Inside ``with gm1: with gm2:``, ``gm2.backward`` leaves ``x.grad = g(x)`` (the first derivative,
    itself recorded by gm1); ``gm1.backward(x.grad)`` then adds ``d/dx sum(g(x))``. The added part
    is compared, along a random direction, with central differences of ``sum(g)`` where ``g`` comes
    from plain first-order backward passes (float64 throughout).
    """
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, np.float64) for a in inputs]
    with mg.no_grad():
        out_shape = fn(*[mg.tensor(a, device=device) for a in arrays]).shape
    weights = rng.standard_normal(out_shape)

    ts = [mg.tensor(a, device=device) for a in arrays]
    gm1 = mg.GradManager().attach(ts)
    gm2 = mg.GradManager().attach(ts)
    with gm1:
        with gm2:
            gm2.backward(fn(*ts), mg.tensor(weights, device=device))
        first = [t.grad for t in ts]
        first_np = [
            np.zeros_like(a) if g is None else g.numpy() for a, g in zip(arrays, first, strict=True)
        ]
        gm1.backward([g for g in first if g is not None])
    second = [
        np.zeros_like(a) if t.grad is None else t.grad.numpy() - g
        for a, t, g in zip(arrays, ts, first_np, strict=True)
    ]

    expected_first = _first_grads(fn, arrays, weights, device)
    for i, (got, want) in enumerate(zip(first_np, expected_first, strict=True)):
        np.testing.assert_allclose(
            got,
            want,
            rtol=1e-7,
            atol=1e-10,
            err_msg=f"first derivative of input {i} (nested managers)",
        )
    for _ in range(2):
        dirs = [rng.standard_normal(a.shape) for a in arrays]

        def total(sign, dirs=dirs):
            moved = [a + sign * eps * d for a, d in zip(arrays, dirs, strict=True)]
            return sum(float(g.sum()) for g in _first_grads(fn, moved, weights, device))

        numeric = (total(1) - total(-1)) / (2 * eps)
        analytic = sum(float((s * d).sum()) for s, d in zip(second, dirs, strict=True))
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol), (
            f"second-order gradient: analytic directional derivative {analytic!r} vs finite "
            f"differences {numeric!r}"
        )


@pytest.fixture
def double_grad():
    """``check_double_grad(fn, *arrays, device=...)``: see its docstring."""
    return check_double_grad
