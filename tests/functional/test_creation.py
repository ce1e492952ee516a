"""Tensor factories: values against NumPy, float32 default, dtype and device arguments."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F

FACTORIES = [
    ("zeros", lambda **kw: F.zeros((2, 3), **kw), lambda dt: np.zeros((2, 3), dt)),
    ("zeros_int_shape", lambda **kw: mg.zeros(4, **kw), lambda dt: np.zeros(4, dt)),
    ("zeros_empty", lambda **kw: F.zeros((0, 2), **kw), lambda dt: np.zeros((0, 2), dt)),
    ("ones", lambda **kw: F.ones((3,), **kw), lambda dt: np.ones(3, dt)),
    ("ones_scalar", lambda **kw: mg.ones((), **kw), lambda dt: np.ones((), dt)),
    ("full", lambda **kw: F.full((2, 2), 7.0, **kw), lambda dt: np.full((2, 2), 7, dt)),
    ("eye", lambda **kw: F.eye(3, **kw), lambda dt: np.eye(3, dtype=dt)),
    ("eye_rect", lambda **kw: mg.eye(2, 4, **kw), lambda dt: np.eye(2, 4, dtype=dt)),
    ("arange", lambda **kw: F.arange(5, **kw), lambda dt: np.arange(5, dtype=dt)),
    (
        "arange_start_stop",
        lambda **kw: mg.arange(2, 9, 3, **kw),
        lambda dt: np.arange(2, 9, 3, dtype=dt),
    ),
    (
        "linspace",
        lambda **kw: F.linspace(0, 1, 5, **kw),
        lambda dt: np.linspace(0, 1, 5).astype(dt),
    ),
]
IDS = [f[0] for f in FACTORIES]


@pytest.mark.parametrize("name,make,ref", FACTORIES, ids=IDS)
def test_default_dtype_is_float32(name, make, ref, device):
    out = make(device=device)
    assert out.dtype == np.float32
    assert out.device == device
    np.testing.assert_array_equal(out.numpy(), ref(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("name,make,ref", FACTORIES, ids=IDS)
def test_dtype_argument(name, make, ref, dtype, device):
    if name.startswith(("linspace", "arange")) and dtype == "bool":
        pytest.skip("a bool range is meaningless (NumPy rejects it too)")
    out = make(dtype=dtype, device=device)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.numpy(), ref(np.dtype(dtype)))


def test_arange_float_step(device):
    out = F.arange(1, 3, 0.5, device=device)
    np.testing.assert_allclose(out.numpy(), np.arange(1, 3, 0.5))


@pytest.mark.parametrize("dtype", [None, "int32", "float16"])
@pytest.mark.parametrize("name", ["zeros_like", "ones_like", "full_like"])
def test_like_keeps_dtype_shape_device(name, dtype, device):
    x = mg.tensor(np.arange(6, dtype=np.int64).reshape(2, 3), device=device)
    fn = getattr(F, name)
    out = fn(x, 3, dtype=dtype) if name == "full_like" else fn(x, dtype=dtype)
    value = {"zeros_like": 0, "ones_like": 1, "full_like": 3}[name]
    assert out.shape == x.shape and out.device == x.device
    assert out.dtype == (x.dtype if dtype is None else np.dtype(dtype))
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), value))


def test_factories_follow_the_default_device():
    prev = mg.get_default_device()
    try:
        mg.set_default_device("cpu0")
        for out in (
            F.zeros(2),
            F.ones(2),
            F.full(2, 1.0),
            F.eye(2),
            F.arange(2),
            F.linspace(0, 1, 2),
        ):
            assert out.device == "cpu0"
    finally:
        mg.set_default_device(prev)


def test_factories_are_not_recorded():
    x = mg.Parameter(np.ones(2, np.float32))
    gm = mg.GradManager().attach(x)
    with gm:
        y = (x * F.ones(2)).sum() + F.zeros(()).sum()
        gm.backward(y)
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(2))
