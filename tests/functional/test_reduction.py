"""Reductions: forward against NumPy over several axes/keepdims, backward against finite
differences, second order, integer dtypes and errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def _pnorm(p):
    def ref(x, axis, keepdims):
        return (np.abs(x) ** p).sum(axis=axis, keepdims=keepdims) ** (1.0 / p)

    return ref


def _away(rng, shape):
    """Values at least 0.2 away from zero (abs has a kink there)."""
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0) * rng.uniform(0.2, 2.0, shape)


def _real(rng, shape):
    return rng.standard_normal(shape)


def _near_one(rng, shape):
    """prod of many standard normals underflows/explodes; values near +-1 keep it well scaled."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.7, 1.3, shape)


REDUCTIONS = [
    ("sum", F.sum, np.sum, _real),
    ("mean", F.mean, np.mean, _real),
    ("max", F.max, np.max, _real),
    ("min", F.min, np.min, _real),
    ("prod", F.prod, np.prod, _near_one),
    ("var", F.var, np.var, _real),
    ("std", F.std, np.std, _real),
    (
        "var_ddof1",
        lambda x, a, k: F.var(x, a, k, ddof=1),
        lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims, ddof=1),
        _real,
    ),
    ("norm2", lambda x, a, k: F.norm(x, 2, a, k), _pnorm(2), _real),
    ("norm1", lambda x, a, k: F.norm(x, 1, a, k), _pnorm(1), _away),
    ("norm3", lambda x, a, k: F.norm(x, 3, a, k), _pnorm(3), _away),
    (
        "norm_inf",
        lambda x, a, k: F.norm(x, float("inf"), a, k),
        lambda x, axis, keepdims: np.abs(x).max(axis=axis, keepdims=keepdims),
        _away,
    ),
    (
        "logsumexp",
        F.logsumexp,
        lambda x, axis, keepdims: np.log(np.exp(x).sum(axis=axis, keepdims=keepdims)),
        _real,
    ),
    ("method_sum", lambda x, a, k: x.sum(a, k), np.sum, _real),
    ("method_mean", lambda x, a, k: x.mean(a, k), np.mean, _real),
    ("method_max", lambda x, a, k: x.max(a, k), np.max, _real),
]
IDS = [r[0] for r in REDUCTIONS]

# (input shape, axis): whole tensor, single axes (also negative), several axes, size-1 axes
CASES = [
    ((2, 3, 4), None),
    ((2, 3, 4), 0),
    ((2, 3, 4), -1),
    ((2, 3, 4), (0, 2)),
    ((5,), 0),
    ((1,), None),
    ((3, 1, 2), 1),
    ((), None),
]


def _ref(ref, x, axis, keepdims):
    return np.asarray(ref(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axis", CASES, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen", REDUCTIONS, ids=IDS)
def test_forward(name, fn, ref, gen, shape, axis, keepdims, device, rng):
    if name == "var_ddof1" and (np.prod(shape, dtype=int) == 1 or shape == (3, 1, 2)):
        pytest.skip("ddof=1 over a single element is undefined")
    x = gen(rng, shape).astype(np.float32)
    y = fn(mg.tensor(x, device=device), axis, keepdims)
    expect = _ref(ref, x.astype(np.float64), axis, keepdims)
    assert y.dtype == np.float32
    assert y.shape == expect.shape, f"{name}: shape {y.shape} != NumPy's {expect.shape}"
    np.testing.assert_allclose(y.numpy(), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("shape,axis", CASES, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen", REDUCTIONS, ids=IDS)
def test_grad(name, fn, ref, gen, shape, axis, keepdims, device, rng):
    if name == "var_ddof1" and (np.prod(shape, dtype=int) == 1 or shape == (3, 1, 2)):
        pytest.skip("ddof=1 over a single element is undefined")
    if name == "std" and (np.prod(shape, dtype=int) == 1 or shape == (3, 1, 2)):
        pytest.skip("std of a single element is 0, where sqrt has no derivative")
    check_grad(lambda x: fn(x, axis, keepdims), gen(rng, shape), device=device)


@pytest.mark.parametrize("name,fn,ref,gen", REDUCTIONS, ids=IDS)
def test_noncontiguous(name, fn, ref, gen, device, rng):
    x = gen(rng, (4, 3, 2))

    def f(t):
        return fn(t.transpose(2, 0, 1)[:, ::2], (0, 2), False)

    expect = _ref(ref, x.transpose(2, 0, 1)[:, ::2], (0, 2), False)
    np.testing.assert_allclose(f(mg.tensor(x, device=device)).numpy(), expect, rtol=1e-12)
    check_grad(f, x, device=device)


SECOND_ORDER = ["sum", "mean", "max", "prod", "var", "std", "norm2", "norm3", "logsumexp"]


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize(
    "name,fn,ref,gen",
    [r for r in REDUCTIONS if r[0] in SECOND_ORDER],
    ids=[n for n in IDS if n in SECOND_ORDER],
)
def test_second_order(name, fn, ref, gen, axis, device, rng, double_grad):
    double_grad(lambda x: fn(x, axis, False), gen(rng, (2, 3)), device=device)


def test_max_ties_split_the_gradient(device):
    x = mg.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], device=device)
    gm = mg.GradManager().attach(x)
    with gm:
        gm.backward(F.max(x, axis=1).sum())
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)


def test_prod_grad_with_zeros(device):
    # the gradient of a product with a zero entry must not divide by zero
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.5, -2.0, 4.0]])
    t = mg.tensor(x, device=device)
    gm = mg.GradManager().attach(t)
    with gm:
        gm.backward(F.prod(t, axis=1).sum())
    expect = np.array([[np.prod(np.delete(row, j)) for j in range(3)] for row in x])
    np.testing.assert_allclose(t.grad.numpy(), expect)
    check_grad(lambda v: F.prod(v, axis=0), x, device=device)


def test_logsumexp_is_stable(device):
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, 0.0]], np.float32)
    out = F.logsumexp(mg.tensor(x, device=device), axis=1)
    np.testing.assert_allclose(
        out.numpy(), special.logsumexp(x.astype(np.float64), axis=1), rtol=1e-6
    )
    check_grad(
        lambda v: F.logsumexp(v, axis=0), np.array([[500.0, -3.0], [501.0, 2.0]]), device=device
    )


@pytest.mark.parametrize(
    "dtype,expect",
    [
        ("int32", np.int32),
        ("int64", np.int64),
        ("uint8", np.int32),
        ("bool", np.int32),
        ("float16", np.float16),
        ("float64", np.float64),
    ],
)
@pytest.mark.parametrize("name", ["sum", "prod"])
def test_integer_and_float_dtypes(name, dtype, expect, device):
    # MegEngine keeps int32 sums int32 (NumPy would widen to int64); small ints accumulate in int32
    x = np.array([[1, 2, 3], [4, 1, 2]]).astype(dtype)
    y = getattr(F, name)(mg.tensor(x, device=device), axis=1)
    assert y.dtype == expect
    np.testing.assert_array_equal(y.numpy(), getattr(np, name)(x.astype(np.float64), axis=1))


def test_sum_of_uint8_does_not_wrap(device):
    x = np.full(10, 200, np.uint8)
    assert F.sum(mg.tensor(x, device=device)).item() == 2000


def test_mean_of_integers_is_float32(device):
    y = F.mean(mg.tensor([1, 2, 4], device=device))
    assert y.dtype == np.float32 and abs(y.item() - 7 / 3) < 1e-6


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name, axis, keepdims, device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = getattr(F, name)(mg.tensor(x, device=device), axis, keepdims)
    expect = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y.numpy(), expect)


def test_errors_name_the_op(device):
    x = mg.tensor(np.ones((2, 3), np.float32), device=device)
    with pytest.raises(ValueError, match=r"sum: axis 2 is out of range for a tensor of rank 2"):
        F.sum(x, axis=2)
    with pytest.raises(ValueError, match=r"mean: axis -3"):
        F.mean(x, axis=-3)
    with pytest.raises(ValueError, match=r"max: cannot reduce an empty tensor of shape \(0, 3\)"):
        F.max(mg.tensor(np.ones((0, 3), np.float32), device=device))
    with pytest.raises(ValueError, match=r"argmax: axis 5"):
        F.argmax(x, axis=5)


def test_var_with_ddof_equal_to_count_is_nan(device):
    # NumPy answers nan (with a warning) instead of raising ZeroDivisionError
    out = F.var(mg.tensor([[1.0], [2.0]], device=device), axis=1, ddof=1)
    assert out.shape == (2,) and np.isnan(out.numpy()).all()


def test_normalize_scales_vectors_to_unit_norm():
    """F.normalize(x, ord, axis, eps) = x / max(norm(x, ord, axis), eps) (MegEngine)."""
    x = np.random.default_rng(0).normal(size=(2, 3, 4))
    x[1, :, 2] = 0.0  # an all-zero vector along axis 1 stays zero
    for ord_, axis in [(None, 1), (1, -1), (2, None)]:
        n = np.linalg.norm(x.reshape(-1) if axis is None else x, ord=1 if ord_ == 1 else 2,
                           axis=axis, keepdims=axis is not None)
        ref = x / np.maximum(n, 1e-12)
        got = F.normalize(mg.tensor(x), ord_, axis)
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)
    got = F.normalize(mg.tensor(np.arange(1, 7, dtype=np.int32).reshape(2, 3)), axis=-1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.numpy()[0], np.array([1, 2, 3]) / np.sqrt(14), rtol=1e-6)
    check_grad(lambda t: F.normalize(t, axis=1), x[:1])


def test_axis_may_be_a_tensor_and_may_not_repeat():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(F.sum(mg.tensor(x), axis=mg.tensor(-1)).numpy(), x.sum(-1))
    values, idx = F.sort(mg.tensor(x[:, ::-1].copy()), mg.tensor(False), mg.tensor(0))
    np.testing.assert_array_equal(values.numpy(), np.sort(x[:, ::-1], 0))
    with pytest.raises(ValueError, match=r"sum: axis \(-1, 1\) names axis 1 twice"):
        F.sum(mg.tensor(x), axis=(-1, 1))


def test_functional_math_is_megengine_module_path():
    from minigrad.functional.math import normalize, sort

    assert normalize is F.normalize and sort is F.sort


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_extremum_over_several_axes_reduces_last_axis_first(name):
    """MegEngine: argmax(x, axis=(0, 1)) is argmax over axis 1, then argmax of those indices over
    axis 0; negative axes name the same axes; keepdims keeps both."""
    x = np.random.default_rng(5).normal(size=(4, 5, 3))
    np_arg = getattr(np, name)
    ref = np_arg(np_arg(x, axis=1), axis=0)
    fn = getattr(F, name)
    np.testing.assert_array_equal(fn(mg.tensor(x), axis=(0, 1)).numpy(), ref)
    np.testing.assert_array_equal(fn(mg.tensor(x), axis=(-2, -3)).numpy(), ref)
    assert fn(mg.tensor(x), axis=(0, 2), keepdims=True).shape == (1, 5, 1)
