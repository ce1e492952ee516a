"""batch_norm, layer_norm and group_norm against NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def _t(a, device, dtype="float64"):
    return mg.tensor(a, dtype=dtype, device=device)


def _ref_norm(x, axes, eps):
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (6, 4), (3, 2, 5)])
def test_batch_norm_training_updates_running_stats(shape, device, rng):
    x = rng.standard_normal(shape) * 2 + 1
    c = shape[1]
    stat_shape = (1, c) + (1,) * (len(shape) - 2)
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    rm0, rv0 = rng.standard_normal(stat_shape), rng.random(stat_shape) + 0.5
    rm, rv = _t(rm0, device), _t(rv0, device)
    out = F.batch_norm(_t(x, device), rm, rv, _t(w, device), _t(b, device), training=True,
                       momentum=0.8, eps=1e-3)
    axes = (0,) + tuple(range(2, len(shape)))
    ref = _ref_norm(x, axes, 1e-3) * w.reshape(stat_shape) + b.reshape(stat_shape)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10, atol=1e-12)
    batch_mean = x.mean(axis=axes, keepdims=True)
    batch_var = x.var(axis=axes, keepdims=True, ddof=1)  # unbiased for the running estimate
    np.testing.assert_allclose(rm.numpy(), 0.8 * rm0 + 0.2 * batch_mean, rtol=1e-12)
    np.testing.assert_allclose(rv.numpy(), 0.8 * rv0 + 0.2 * batch_var, rtol=1e-12)
    check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b,
               device=device, rtol=1e-4)


def test_batch_norm_eval_uses_running_stats_and_vector_params(device, rng):
    x = rng.standard_normal((5, 3, 2, 2))
    rm, rv = rng.standard_normal(3), rng.random(3) + 0.5
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    out = F.batch_norm(_t(x, device), _t(rm, device), _t(rv, device), _t(w, device),
                       _t(b, device), training=False, eps=1e-5)
    s = (1, 3, 1, 1)
    ref = (x - rm.reshape(s)) / np.sqrt(rv.reshape(s) + 1e-5) * w.reshape(s) + b.reshape(s)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10)
    check_grad(lambda x, w, b: F.batch_norm(x, _t(rm, device), _t(rv, device), w, b), x, w, b,
               device=device)


def test_batch_norm_not_inplace_returns_new_stats(device, rng):
    x = rng.standard_normal((4, 2))
    rm, rv = _t(np.zeros(2), device), _t(np.ones(2), device)
    out, nm, nv = F.batch_norm(_t(x, device), rm, rv, training=True, inplace=False)
    np.testing.assert_array_equal(rm.numpy(), np.zeros(2))  # untouched
    np.testing.assert_allclose(nm.numpy(), 0.1 * x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(nv.numpy(), 0.9 + 0.1 * x.var(0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), _ref_norm(x, (0,), 1e-5), rtol=1e-10)


def test_batch_norm_errors(device):
    x = _t(np.zeros((2, 3)), device)
    with pytest.raises(ValueError, match="batch_norm: weight has shape"):
        F.batch_norm(x, weight=_t(np.zeros(4), device), training=True)
    with pytest.raises(ValueError, match="batch_norm: give both"):
        F.batch_norm(x, _t(np.zeros(3), device), None)


@pytest.mark.parametrize("shape,norm", [((4, 6), 6), ((2, 3, 4), (3, 4)), ((2, 5, 1), (1,))])
def test_layer_norm(shape, norm, device, rng):
    x = rng.standard_normal(shape) * 3
    nshape = (norm,) if isinstance(norm, int) else norm
    w, b = rng.standard_normal(nshape), rng.standard_normal(nshape)
    axes = tuple(range(len(shape) - len(nshape), len(shape)))
    got = F.layer_norm(_t(x, device), norm, True, _t(w, device), _t(b, device), eps=1e-4)
    np.testing.assert_allclose(got.numpy(), _ref_norm(x, axes, 1e-4) * w + b, rtol=1e-9,
                               atol=1e-12)
    plain = F.layer_norm(_t(x, device), norm, affine=False)
    np.testing.assert_allclose(plain.numpy(), _ref_norm(x, axes, 1e-5), rtol=1e-9, atol=1e-12)
    if nshape != (1,):  # a single element normalises to exactly 0: no useful gradient to check
        check_grad(lambda x, w, b: F.layer_norm(x, norm, True, w, b), x, w, b, device=device,
                   rtol=1e-4)


def test_layer_norm_shape_error(device):
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape \(5,\)"):
        F.layer_norm(_t(np.zeros((2, 4)), device), 5)


@pytest.mark.parametrize("shape,groups", [((2, 6, 3, 2), 3), ((3, 4, 5), 2), ((2, 4), 4)])
def test_group_norm(shape, groups, device, rng):
    x = rng.standard_normal(shape)
    c = shape[1]
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    xg = x.reshape(shape[0], groups, -1)
    ref = _ref_norm(xg, (2,), 1e-5).reshape(shape)
    s = (1, c) + (1,) * (len(shape) - 2)
    got = F.group_norm(_t(x, device), groups, True, _t(w, device), _t(b, device))
    np.testing.assert_allclose(got.numpy(), ref * w.reshape(s) + b.reshape(s), rtol=1e-9,
                               atol=1e-12)
    if x.size // (shape[0] * groups) > 1:
        check_grad(lambda x, w, b: F.group_norm(x, groups, True, w, b), x, w, b, device=device,
                   rtol=1e-4)
    with pytest.raises(ValueError, match="group_norm: num_groups=5"):
        F.group_norm(_t(x, device), 5)


def test_layer_norm_second_order(device, rng):
    x0 = rng.standard_normal((3, 5))
    w = rng.standard_normal((3, 5))

    def grad_of(x):
        gm = mg.GradManager().attach(x)
        with gm:
            gm.backward((F.layer_norm(x, 5, affine=False) * _t(w, device)).sum())
        g, x.grad = x.grad, None
        return g

    check_grad(grad_of, x0, device=device, rtol=1e-4)
