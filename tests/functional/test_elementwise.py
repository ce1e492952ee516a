"""Elementwise ops: forward against NumPy (float64 reference), backward against central finite
differences, second order against differences of the first derivative, dtype rules and errors.

Each table row is one op: name, minigrad function, NumPy reference, input domain.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad

# -- input domains: keep finite differences away from kinks and outside-domain points -------------


def _real(rng, shape):
    return rng.standard_normal(shape)


def _pos(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _unit(rng, shape):
    return rng.uniform(-0.9, 0.9, shape)


def _away(rng, shape):
    """Nonzero values at least 0.2 from 0 and from the clip bounds +-0.5."""
    mag = rng.choice([rng.uniform(0.2, 0.3), rng.uniform(0.7, 2.0)], size=shape)
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0) * mag


UNARY = [
    ("neg", F.neg, np.negative, _real),
    ("exp", F.exp, np.exp, _real),
    ("log", F.log, np.log, _pos),
    ("log1p", F.log1p, np.log1p, _pos),
    ("expm1", F.expm1, np.expm1, _real),
    ("sqrt", F.sqrt, np.sqrt, _pos),
    ("square", F.square, np.square, _real),
    ("sin", F.sin, np.sin, _real),
    ("cos", F.cos, np.cos, _real),
    ("tan", F.tan, np.tan, _unit),
    ("tanh", F.tanh, np.tanh, _real),
    ("sigmoid", F.sigmoid, lambda x: 1 / (1 + np.exp(-x)), _real),
    ("erf", F.erf, special.erf, _real),
    ("abs", F.abs, np.abs, _away),
    ("relu", F.relu, lambda x: np.maximum(x, 0), _away),
    ("clip", lambda x: F.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), _away),
    ("clip_lower", lambda x: F.clip(x, lower=-0.5), lambda x: np.maximum(x, -0.5), _away),
    ("pow_scalar", lambda x: x**3, lambda x: x**3, _real),
    ("pow_square", lambda x: x**2, lambda x: x**2, _real),
    ("rpow", lambda x: 2.0**x, lambda x: 2.0**x, _real),
    ("rsub", lambda x: 1.5 - x, lambda x: 1.5 - x, _real),
    ("rdiv", lambda x: 1.5 / x, lambda x: 1.5 / x, _pos),
]
UNARY_IDS = [row[0] for row in UNARY]

# shapes: scalar, size-1, vector, matrix, and a 3-D one with a size-1 axis
SHAPES = [(), (1,), (5,), (3, 4), (2, 1, 3)]


def _noncontig(fn):
    """Apply ``fn`` to a transposed (non-contiguous) view of a (4, 3) input."""
    return lambda x: fn(x.T)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=UNARY_IDS)
def test_unary_forward(name, fn, ref, gen, shape, device, rng):
    x = gen(rng, shape).astype(np.float32)
    y = fn(mg.tensor(x, device=device))
    assert y.dtype == np.float32, f"{name} changed float32 to {y.dtype}"
    assert y.shape == shape
    np.testing.assert_allclose(y.numpy(), ref(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=UNARY_IDS)
def test_unary_grad(name, fn, ref, gen, shape, device, rng):
    check_grad(fn, gen(rng, shape), device=device)


@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=UNARY_IDS)
def test_unary_noncontiguous(name, fn, ref, gen, device, rng):
    x = gen(rng, (4, 3))
    y = _noncontig(fn)(mg.tensor(x, device=device))
    np.testing.assert_allclose(y.numpy(), ref(x.T), rtol=1e-12, atol=1e-12)
    check_grad(_noncontig(fn), x, device=device)
    # a strided slice is non-contiguous too
    check_grad(lambda t: fn(t[:, ::2]), x, device=device)


@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=UNARY_IDS)
def test_unary_float16_and_float64(name, fn, ref, gen, device, rng):
    x = gen(rng, (3, 4))
    y64 = fn(mg.tensor(x, device=device))
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64.numpy(), ref(x), rtol=1e-12, atol=1e-12)
    x16 = x.astype(np.float16)
    y16 = fn(mg.tensor(x16, device=device))
    assert y16.dtype == np.float16, f"{name} changed float16 to {y16.dtype}"
    np.testing.assert_allclose(y16.numpy(), ref(x16.astype(np.float64)), rtol=5e-3, atol=5e-3)


SECOND_ORDER_UNARY = [
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "erf",
    "relu",
    "abs",
    "square",
    "pow_scalar",
    "rpow",
    "rdiv",
]


@pytest.mark.parametrize(
    "name,fn,ref,gen",
    [r for r in UNARY if r[0] in SECOND_ORDER_UNARY],
    ids=[n for n in UNARY_IDS if n in SECOND_ORDER_UNARY],
)
def test_unary_second_order(name, fn, ref, gen, device, rng, double_grad):
    double_grad(fn, gen(rng, (2, 3)), device=device)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("name", ["exp", "log1p", "sqrt", "sin", "tanh", "sigmoid"])
def test_float_math_on_integers_gives_float32(name, dtype, device):
    x = np.array([0, 1, 3], dtype=dtype) if dtype != "bool" else np.array([True, False])
    y = getattr(F, name)(mg.tensor(x, device=device))
    assert y.dtype == np.float32
    ref = UNARY[UNARY_IDS.index(name)][2]
    np.testing.assert_allclose(y.numpy(), ref(x.astype(np.float64)), rtol=1e-6)


# -- piecewise-constant ops: exact forward, zero gradient -----------------------------------------

ROUNDING = [
    ("floor", F.floor, np.floor),
    ("ceil", F.ceil, np.ceil),
    ("sign", F.sign, np.sign),
]


@pytest.mark.parametrize("name,fn,ref", ROUNDING, ids=[r[0] for r in ROUNDING])
def test_rounding_forward_and_zero_grad(name, fn, ref, device, rng):
    x = rng.uniform(-3, 3, (3, 4)).astype(np.float32)
    xt = mg.tensor(x, device=device)
    gm = mg.GradManager().attach(xt)
    with gm:
        y = fn(xt)
        gm.backward(y.sum())
    np.testing.assert_array_equal(y.numpy(), ref(x))
    np.testing.assert_array_equal(xt.grad.numpy(), np.zeros_like(x))


def test_round_is_half_away_from_zero(device):
    # MegEngine (C) semantics; NumPy's np.round would give [0, 2, 2, -0, -2]
    x = mg.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49], device=device)
    np.testing.assert_array_equal(F.round(x).numpy(), np.array([1, 2, 3, -1, -3, 0], np.float32))


def test_floor_div_and_mod_follow_python(device):
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    ta, tb = mg.tensor(a, device=device), mg.tensor(b, device=device)
    np.testing.assert_array_equal(
        (ta // tb).numpy(), np.array([x // y for x, y in zip(a, b, strict=True)])
    )
    np.testing.assert_array_equal(
        (ta % tb).numpy(), np.array([x % y for x, y in zip(a, b, strict=True)])
    )
    np.testing.assert_array_equal((ta % 3).numpy(), a % 3)


# -- binary ops -----------------------------------------------------------------------------------

BINARY = [
    ("add", F.add, np.add, _real, _real),
    ("sub", F.sub, np.subtract, _real, _real),
    ("mul", F.mul, np.multiply, _real, _real),
    ("div", F.div, np.divide, _real, _pos),
    ("pow", F.pow, np.power, _pos, _real),
    ("maximum", F.maximum, np.maximum, _real, _real),
    ("minimum", F.minimum, np.minimum, _real, _real),
    ("operator_add", lambda a, b: a + b, np.add, _real, _real),
    ("operator_sub", lambda a, b: a - b, np.subtract, _real, _real),
    ("operator_mul", lambda a, b: a * b, np.multiply, _real, _real),
    ("operator_div", lambda a, b: a / b, np.divide, _real, _pos),
    ("operator_pow", lambda a, b: a**b, np.power, _pos, _real),
]
BINARY_IDS = [row[0] for row in BINARY]

SHAPE_PAIRS = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((4,), (3, 4)),
    ((2, 1, 4), (3, 1)),
    ((), (2, 3)),
    ((1,), (1,)),
    ((2, 3), (1, 1)),
]


@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen_a,gen_b", BINARY, ids=BINARY_IDS)
def test_binary_forward(name, fn, ref, gen_a, gen_b, shapes, device, rng):
    a, b = gen_a(rng, shapes[0]), gen_b(rng, shapes[1])
    y = fn(
        mg.tensor(a.astype(np.float32), device=device),
        mg.tensor(b.astype(np.float32), device=device),
    )
    expect = ref(a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64))
    assert y.shape == expect.shape and y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), expect, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
@pytest.mark.parametrize("name,fn,ref,gen_a,gen_b", BINARY, ids=BINARY_IDS)
def test_binary_grad(name, fn, ref, gen_a, gen_b, shapes, device, rng):
    check_grad(fn, gen_a(rng, shapes[0]), gen_b(rng, shapes[1]), device=device)


@pytest.mark.parametrize("name,fn,ref,gen_a,gen_b", BINARY, ids=BINARY_IDS)
def test_binary_noncontiguous(name, fn, ref, gen_a, gen_b, device, rng):
    a, b = gen_a(rng, (4, 3)), gen_b(rng, (3, 8))

    def f(x, y):
        return fn(x.T, y[:, ::2])

    out = f(mg.tensor(a, device=device), mg.tensor(b, device=device))
    np.testing.assert_allclose(out.numpy(), ref(a.T, b[:, ::2]), rtol=1e-12)
    check_grad(f, a, b, device=device)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_second_order(name, device, rng, double_grad):
    _, fn, _, gen_a, gen_b = BINARY[BINARY_IDS.index(name)]
    double_grad(fn, gen_a(rng, (2, 3)), gen_b(rng, (3,)), device=device)


@pytest.mark.parametrize("scalar", [2, 0.5, -1.5])
@pytest.mark.parametrize("name,fn,ref,gen_a,gen_b", BINARY, ids=BINARY_IDS)
def test_binary_with_python_scalar(name, fn, ref, gen_a, gen_b, scalar, device, rng):
    a = gen_a(rng, (2, 3)) if name not in ("pow", "operator_pow") else _pos(rng, (2, 3))
    right = fn(mg.tensor(a.astype(np.float32), device=device), scalar)
    assert right.dtype == np.float32
    np.testing.assert_allclose(
        right.numpy(), ref(a.astype(np.float32).astype(np.float64), scalar), rtol=2e-6, atol=1e-6
    )
    if name not in ("pow", "operator_pow", "div", "operator_div"):  # keep the base/divisor valid
        left = fn(scalar, mg.tensor(a.astype(np.float32), device=device))
        assert left.dtype == np.float32
        np.testing.assert_allclose(
            left.numpy(), ref(scalar, a.astype(np.float32).astype(np.float64)), rtol=2e-6, atol=1e-6
        )
    check_grad(lambda t: fn(t, scalar), a, device=device)


def test_maximum_tie_splits_gradient_by_mask(device):
    # at a tie the whole gradient goes to the first operand (the >= mask), none is lost
    a = mg.tensor([1.0, 2.0, 3.0], device=device)
    b = mg.tensor([1.0, 0.0, 5.0], device=device)
    gm = mg.GradManager().attach([a, b])
    with gm:
        gm.backward(F.maximum(a, b).sum())
    np.testing.assert_array_equal(a.grad.numpy() + b.grad.numpy(), np.ones(3))


# -- where ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes",
    [((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (3, 1)), ((2, 1, 3), (1, 4, 3), ())],
    ids=str,
)
def test_where(shapes, device, rng):
    cond = rng.random(shapes[0]) < 0.5
    a, b = rng.standard_normal(shapes[1]), rng.standard_normal(shapes[2])
    c = mg.tensor(cond, device=device)
    out = F.where(c, mg.tensor(a, device=device), mg.tensor(b, device=device))
    np.testing.assert_array_equal(out.numpy(), np.where(cond, a, b))
    check_grad(lambda x, y: F.where(c, x, y), a, b, device=device)
    check_grad(lambda x, y: F.where(c, x * x, y * y * y), a, b, device=device)


def test_where_with_scalar_branch(device, rng):
    x = rng.standard_normal((3, 4))
    xt = mg.tensor(x, device=device)
    np.testing.assert_array_equal(F.where(xt > 0, xt, 0.0).numpy(), np.where(x > 0, x, 0.0))
    check_grad(lambda t: F.where(mg.tensor(x > 0, device=device), t, 0.0), x, device=device)


# -- comparisons and logic ------------------------------------------------------------------------

COMPARE = [
    ("equal", F.equal, np.equal),
    ("not_equal", F.not_equal, np.not_equal),
    ("less", F.less, np.less),
    ("less_equal", F.less_equal, np.less_equal),
    ("greater", F.greater, np.greater),
    ("greater_equal", F.greater_equal, np.greater_equal),
    ("logical_and", F.logical_and, np.logical_and),
    ("logical_or", F.logical_or, np.logical_or),
    ("logical_xor", F.logical_xor, np.logical_xor),
]


@pytest.mark.parametrize("name,fn,ref", COMPARE, ids=[r[0] for r in COMPARE])
def test_compare_and_logic(name, fn, ref, device, rng):
    a = rng.integers(0, 3, (3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (4,)).astype(np.float32)
    out = fn(mg.tensor(a, device=device), mg.tensor(b, device=device))
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out.numpy(), ref(a, b))
    np.testing.assert_array_equal(fn(mg.tensor(a, device=device), 1).numpy(), ref(a, 1))


def test_logical_not_isnan_isinf(device):
    x = np.array([0.0, np.nan, np.inf, -np.inf, 1.0], np.float32)
    t = mg.tensor(x, device=device)
    np.testing.assert_array_equal(F.isnan(t).numpy(), np.isnan(x))
    np.testing.assert_array_equal(F.isinf(t).numpy(), np.isinf(x))
    b = mg.tensor([True, False], device=device)
    np.testing.assert_array_equal(F.logical_not(b).numpy(), [False, True])
    np.testing.assert_array_equal((~b).numpy(), [False, True])


# -- dtypes: promotion and astype -----------------------------------------------------------------

PROMOTE = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_]


@pytest.mark.parametrize("da", PROMOTE, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("db", PROMOTE, ids=lambda d: np.dtype(d).name)
def test_tensor_tensor_promotion_follows_numpy(da, db, device):
    a = np.array([1, 0, 1], dtype=da)
    b = np.array([1, 1, 0], dtype=db)
    out = F.add(mg.tensor(a, device=device), mg.tensor(b, device=device))
    expect = np.add(a, b)
    assert out.dtype == expect.dtype
    np.testing.assert_array_equal(out.numpy(), expect)


@pytest.mark.parametrize(
    "dtype", [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8]
)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_tensor_scalar_keeps_tensor_dtype(dtype, op, device):
    x = np.array([3, 4, 5], dtype=dtype)
    out = getattr(F, op)(mg.tensor(x, device=device), 2)
    assert out.dtype == dtype
    np.testing.assert_array_equal(
        out.numpy(),
        getattr(np, {"sub": "subtract", "mul": "multiply"}.get(op, op))(x.astype(np.float64), 2),
    )
    out = getattr(F, op)(mg.tensor(x, device=device), 0.5)
    expect = np.float32 if np.dtype(dtype).kind != "f" else dtype
    assert out.dtype == expect, f"{op}({np.dtype(dtype).name}, 0.5) gave {out.dtype}"


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_int_div_gives_float32(dtype, device):
    a = mg.tensor(np.array([1, 2, 3], dtype), device=device)
    for out in (a / 2, a / a, 2 / a):
        assert out.dtype == np.float32
    np.testing.assert_allclose((a / 2).numpy(), [0.5, 1.0, 1.5])


def test_astype_roundtrip_and_grad(device, rng):
    x = rng.standard_normal((3, 4))
    t = mg.tensor(x, device=device)
    assert t.astype("float16").dtype == np.float16
    assert t.astype(mg.int32).dtype == np.int32
    np.testing.assert_array_equal(t.astype("int32").numpy(), x.astype(np.int32))
    check_grad(
        lambda v: v.astype("float32").astype("float64") * 2.0, x, device=device, rtol=1e-4, eps=1e-3
    )


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "equal", "less", "logical_and"],
)
def test_non_broadcastable_shapes_name_the_op(name, device):
    a = mg.tensor(np.ones((2, 3), np.float32), device=device)
    b = mg.tensor(np.ones((4,), np.float32), device=device)
    with pytest.raises(
        ValueError, match=rf"{name}: shapes \(2, 3\) and \(4,\) cannot be broadcast"
    ):
        getattr(F, name)(a, b)


def test_operator_and_array_operand_errors_name_the_op(device):
    a = mg.tensor(np.ones((2, 3), np.float32), device=device)
    with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        a + np.ones(4)
    with pytest.raises(ValueError, match=r"mul: shapes \(5,\) and \(2, 3\) cannot be broadcast"):
        F.mul(np.ones(5), a)
    with pytest.raises(ValueError, match=r"where: shapes"):
        F.where(
            mg.tensor(np.ones((2, 3), bool), device=device), a, mg.tensor(np.ones(4), device=device)
        )


@pytest.mark.parametrize("name", ["add", "mul", "maximum", "less", "matmul"])
def test_mixed_devices_name_op_shapes_and_devices(name, fake_gpu_tensor):
    a = mg.tensor(np.ones((2, 2), np.float32), device="cpu0")
    b = fake_gpu_tensor((2, 2))
    with pytest.raises(
        RuntimeError, match=rf"{name}: .*\(2, 2\) float32 on cpu0 .*\(2, 2\) float32 on gpu0"
    ):
        getattr(F, name)(a, b)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_relu_special_values_and_gradient_mask(dtype, device):
    """``-inf`` gives 0 (``x * (x > 0)`` gave NaN), NaN propagates, ``-0.0`` gives ``+0.0``; the
    gradient is ``dy`` where ``x > 0`` and exactly 0 elsewhere, even where ``dy`` is NaN."""
    x = np.array([-np.inf, -2.0, -0.0, 0.0, 1e-30, 3.0, np.inf, np.nan], dtype)
    t = mg.Parameter(x, device=device)
    gm = mg.GradManager().attach(t)
    dy = np.array([1.0, np.nan, 2.0, 3.0, 4.0, np.inf, 5.0, 6.0], dtype)
    with gm:
        y = F.relu(t)
        gm.backward(y, mg.tensor(dy, device=device))
    want = np.where(x > 0, x, np.where(np.isnan(x), x, 0)).astype(dtype)
    got = y.numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[:4]).any()  # +0.0, not -0.0
    np.testing.assert_array_equal(t.grad.numpy(), np.where(x > 0, dy, 0).astype(dtype))


@pytest.mark.parametrize("dtype, complex_dtype", [("float32", "complex64"),
                                                  ("float64", "complex128")])
def test_polar_builds_the_complex_number_from_abs_and_angle(dtype, complex_dtype, device):
    rng = np.random.default_rng(0)
    r, theta = rng.random((2, 3, 4)).astype(dtype), (rng.random((2, 3, 4)) * 7 - 3.5).astype(dtype)
    z = F.polar(mg.tensor(r, device=device), mg.tensor(theta, device=device))
    assert z.dtype == np.dtype(complex_dtype) and z.shape == (2, 3, 4)
    want = r.astype(np.float64) * np.exp(1j * theta.astype(np.float64))
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-6 if dtype == "float32" else 1e-14,
                               atol=1e-6 if dtype == "float32" else 1e-14)
