"""``mg.random``: seeding reproduces draws, distributions are right (KS tests on a fixed seed),
dtype/shape/device arguments."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import minigrad as mg


@pytest.mark.parametrize(
    "draw",
    [
        lambda d: mg.random.normal(size=(3, 4), device=d),
        lambda d: mg.random.uniform(size=(5,), device=d),
        lambda d: mg.random.permutation(10, device=d),
    ],
    ids=["normal", "uniform", "permutation"],
)
def test_seed_reproduces_and_different_seeds_differ(draw, device):
    mg.random.seed(123)
    a = draw(device).numpy()
    b = draw(device).numpy()
    mg.random.seed(123)
    np.testing.assert_array_equal(draw(device).numpy(), a)
    np.testing.assert_array_equal(draw(device).numpy(), b)
    assert not np.array_equal(a, b), "consecutive draws must differ"
    mg.random.seed(124)
    assert not np.array_equal(draw(device).numpy(), a)


def test_normal_distribution(device):
    mg.random.seed(0)
    x = mg.random.normal(2.0, 3.0, size=(4000,), device=device)
    assert x.dtype == np.float32 and x.shape == (4000,) and x.device == device
    # Kolmogorov-Smirnov against N(2, 3^2): a wrong mean/std/shape of distribution gives p ~ 0
    assert stats.kstest(x.numpy(), stats.norm(2.0, 3.0).cdf).pvalue > 1e-3


def test_uniform_distribution(device):
    mg.random.seed(0)
    x = mg.random.uniform(-1.0, 3.0, size=(50, 80), device=device).numpy()
    assert x.min() >= -1.0 and x.max() < 3.0
    assert stats.kstest(x.ravel(), stats.uniform(-1.0, 4.0).cdf).pvalue > 1e-3


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_dtype_and_scalar_size(dtype, device):
    assert mg.random.normal(size=(2,), dtype=dtype, device=device).dtype == np.dtype(dtype)
    assert mg.random.uniform(size=(2,), dtype=dtype, device=device).dtype == np.dtype(dtype)
    assert mg.random.normal(device=device).shape == ()
    assert mg.random.uniform(device=device).shape == ()


def test_permutation_is_a_permutation(device):
    mg.random.seed(5)
    p = mg.random.permutation(50, device=device)
    assert p.dtype == np.int32
    np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(50))


def test_get_rng_is_the_seeded_cpu_generator():
    mg.random.seed(7)
    rng = mg.random.get_rng("cpu0")
    assert isinstance(rng, np.random.Generator)
    first = rng.standard_normal(3)
    mg.random.seed(7)
    np.testing.assert_array_equal(mg.random.get_rng("cpu0").standard_normal(3), first)
