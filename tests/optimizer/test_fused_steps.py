"""The one-pass optimizer steps of ``minigrad.backend.kernels`` against NumPy's operations written
out (same order, same dtype): on the CPU they must agree to the bit, in float32 and float64."""

import numpy as np
import pytest

from minigrad.backend import kernels

STEPS = 3


def _arrays(dtype, n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for _ in range(4)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("wd, momentum, nesterov", [(0.0, 0.0, False), (1e-2, 0.0, False),
                                                    (0.0, 0.9, False), (1e-2, 0.8, True)])
def test_sgd_step_equals_numpy_bit_for_bit(dtype, wd, momentum, nesterov):
    p, g, buf, _ = _arrays(dtype)
    ref_p, ref_buf = p.copy(), buf.copy()
    for step in range(STEPS):
        grad = g * (step + 1)
        kernels.sgd_step(p, grad, buf if momentum else None, 0.1, momentum, wd, nesterov)
        d = grad + wd * ref_p if wd else grad
        if momentum:
            ref_buf *= momentum
            ref_buf += d
            d = d + momentum * ref_buf if nesterov else ref_buf
        ref_p -= 0.1 * d
    np.testing.assert_array_equal(p, ref_p)
    np.testing.assert_array_equal(buf, ref_buf)
    assert p.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("wd, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
def test_adam_step_equals_numpy_bit_for_bit(dtype, wd, decoupled):
    p, g, _, _ = _arrays(dtype)
    m, v = np.zeros_like(p), np.zeros_like(p)
    ref_p, ref_m, ref_v = p.copy(), m.copy(), v.copy()
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 1e-2
    for step in range(1, STEPS + 1):
        grad = g * step
        kernels.adam_step(p, grad, m, v, lr, (b1, b2), eps, wd, decoupled, step)
        d = grad + wd * ref_p if wd and not decoupled else grad
        ref_m *= b1
        ref_m += (1 - b1) * d
        ref_v *= b2
        ref_v += (1 - b2) * (d * d)
        delta = (ref_m / (1 - b1**step)) / (np.sqrt(ref_v / (1 - b2**step)) + eps)
        if wd and decoupled:
            delta = delta + wd * ref_p
        ref_p -= lr * delta
    for got, want in ((p, ref_p), (m, ref_m), (v, ref_v)):
        np.testing.assert_array_equal(got, want)


def test_other_layouts_and_dtypes_take_the_numpy_path():
    p = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous
    g = np.ones_like(p)
    kernels.sgd_step(p, g, None, 0.5, 0.0, 0.0, False)
    np.testing.assert_array_equal(p, np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2] - 0.5)
    h = np.ones(4, np.float16)
    kernels.sgd_step(h, np.full(4, 2, np.float16), None, 0.25, 0.0, 0.0, False)
    assert h.dtype == np.float16 and (h == 0.5).all()
