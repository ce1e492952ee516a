"""MegEngine's ``random.gamma``, ``random.beta`` and ``random.poisson``: the distributions (KS tests
and moments on a fixed seed), MegEngine's shape rule (``size`` prepended to the broadcast parameter
shape), tensor parameters, reproducibility and errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import minigrad as mg


def test_gamma_and_beta_follow_their_distributions(device):
    """gamma(k, theta) has density x^(k-1) e^(-x/theta) / (theta^k Gamma(k)); beta(a, b) is Beta."""
    mg.random.seed(0)
    g = mg.random.gamma(3.0, 2.0, size=4000).numpy()
    assert g.dtype == np.float32 and g.shape == (4000,)
    assert stats.kstest(g, stats.gamma(a=3.0, scale=2.0).cdf).pvalue > 1e-3
    b = mg.random.beta(2.0, 5.0, size=(40, 100)).numpy()
    assert b.shape == (40, 100) and 0 < b.min() and b.max() < 1
    assert stats.kstest(b.ravel(), stats.beta(2.0, 5.0).cdf).pvalue > 1e-3


def test_poisson_counts():
    """poisson(lam): non-negative integer counts (returned as float32 like MegEngine) with mean
    and variance lam."""
    mg.random.seed(1)
    p = mg.random.poisson(4.0, size=20000).numpy()
    assert p.dtype == np.float32 and np.all(p == np.round(p)) and p.min() >= 0
    assert abs(p.mean() - 4.0) < 0.1 and abs(p.var() - 4.0) < 0.3


def test_tensor_parameters_broadcast_with_size_in_front():
    """MegEngine: shape (2, 1) and scale (2,) broadcast to (2, 2); size=3 gives (3, 2, 2); each
    element follows its own parameters."""
    shape = mg.tensor([[1.0], [10.0]])
    scale = mg.tensor([1.0, 5.0])
    assert mg.random.gamma(shape, scale).shape == (2, 2)
    mg.random.seed(2)
    draws = mg.random.gamma(shape, scale, size=3000).numpy()
    assert draws.shape == (3000, 2, 2)
    np.testing.assert_allclose(draws.mean(0), [[1.0, 5.0], [10.0, 50.0]], rtol=0.08)
    lam = mg.tensor(np.array([0.5, 50.0], np.float64))
    counts = mg.random.poisson(lam, size=(2000,))
    assert counts.dtype == np.float64 and counts.shape == (2000, 2)
    np.testing.assert_allclose(counts.numpy().mean(0), [0.5, 50.0], rtol=0.08)
    assert mg.random.beta(mg.tensor([1.0, 2.0, 3.0]), 2.0, size=(4, 5)).shape == (4, 5, 3)


def test_seed_reproduces_new_distributions():
    for draw in (lambda: mg.random.gamma(2.0, size=5), lambda: mg.random.beta(1.0, 2.0, size=5),
                 lambda: mg.random.poisson(3.0, size=5)):
        mg.random.seed(7)
        first = draw().numpy()
        mg.random.seed(7)
        np.testing.assert_array_equal(draw().numpy(), first)


@pytest.mark.parametrize("call,msg", [
    (lambda: mg.random.gamma(0.0), r"random.gamma: shape must be positive"),
    (lambda: mg.random.gamma(1.0, mg.tensor([1.0, -1.0])), r"random.gamma: scale must be positive"),
    (lambda: mg.random.beta(1.0, 0), r"random.beta: beta must be positive"),
    (lambda: mg.random.poisson(-2), r"random.poisson: lam must be positive"),
])
def test_invalid_parameters(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


class _DoubleReadingGenerator:
    """A test double of CuPy's ``Generator``: its kernels read array parameters as double without
    casting them, so any other dtype (or a strided view) reaching it is an error here."""

    def __init__(self, seed):
        self.rng, self.seen = np.random.default_rng(seed), []

    def _params(self, name, *arrays):
        for a in arrays:
            assert a.dtype == np.float64, f"{name} got a {a.dtype} parameter, expected float64"
            assert a.flags.c_contiguous, f"{name} got a strided parameter"
        self.seen.append(name)
        return arrays

    def beta(self, a, b):
        return self.rng.beta(*self._params("beta", a, b))

    def gamma(self, k, theta):
        return self.rng.gamma(*self._params("gamma", k, theta))

    def poisson(self, lam):
        return self.rng.poisson(*self._params("poisson", lam))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_distribution_parameters_reach_the_generator_as_float64(monkeypatch, dtype):
    """CuPy's generator reads parameters as double (float32 ones gave garbage on the GPU): every
    distribution with tensor parameters hands it float64 arrays of the output shape, and the
    samples come back in the parameters' dtype, equal to NumPy's from the same parameters."""
    double = _DoubleReadingGenerator(7)
    monkeypatch.setattr(mg.random, "get_rng", lambda device=None: double)
    a = mg.tensor([[0.5], [2.0]], dtype=dtype)
    b = mg.tensor([3.0, 0.25, 1.0], dtype=dtype)
    got = [mg.random.beta(a, b, size=4), mg.random.gamma(a, b), mg.random.poisson(b, size=(2,))]
    assert double.seen == ["beta", "gamma", "poisson"]
    ref = np.random.default_rng(7)
    a64, b64 = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    want = [ref.beta(np.broadcast_to(a64, (4, 2, 3)), b64), ref.gamma(a64, b64),
            ref.poisson(np.broadcast_to(b64, (2, 3)))]
    for g, w in zip(got, want):
        assert g.dtype == np.dtype(dtype) and g.shape == w.shape
        np.testing.assert_array_equal(g.numpy(), w.astype(dtype))


def test_exponential_has_rate_lambda():
    """exponential(rate): density rate * exp(-rate * x), mean 1/rate; shapes as gamma's."""
    mg.random.seed(3)
    e = mg.random.exponential(2.0, size=4000).numpy()
    assert e.dtype == np.float32 and e.shape == (4000,)
    assert stats.kstest(e, stats.expon(scale=0.5).cdf).pvalue > 1e-3
    rate = mg.tensor([[1.0, 1.0], [0.1, 0.1]])
    assert mg.random.exponential(rate, size=(3,)).shape == (3, 2, 2)
    assert mg.random.exponential(1.5, size=(10, 0)).shape == (10, 0)
    with pytest.raises(ValueError, match="exponential: rate must be positive"):
        mg.random.exponential(0.0)


def test_multinomial_draws_indices_in_proportion_to_the_weights():
    mg.random.seed(4)
    w = mg.tensor([[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]])
    s = mg.random.multinomial(w, 4000, replacement=True).numpy()
    assert s.shape == (2, 4000) and s.dtype == np.int32
    assert not (s[0] == 1).any() and (s[1] == 1).all()
    assert abs((s[0] == 2).mean() - 0.75) < 0.03
    # without replacement every index comes at most once
    s = mg.random.multinomial(mg.tensor([1.0, 2.0, 3.0, 4.0]), 4).numpy()
    assert sorted(s.tolist()) == [0, 1, 2, 3]
    assert mg.random.multinomial(mg.random.normal(0, 1, (0, 2)), 2, True).shape == (0, 2)
    with pytest.raises(ValueError, match="cannot draw 5 of 4"):
        mg.random.multinomial(mg.tensor([1.0, 2.0, 3.0, 4.0]), 5)
