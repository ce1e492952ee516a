"""Autocast's op table (docs/amp.md), row by row: the output dtype under autocast, the value
against a float64 reference within the low dtype's tolerance, and the gradient against float64
central differences within that tolerance. Plus the state itself: nesting, ``enabled=False``,
the decorator, per-thread state, and backward running with autocast off."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import minigrad as mg
import minigrad.amp as amp
import minigrad.autodiff as ad
import minigrad.functional as F
from minigrad.backend.dtypes import bfloat16

RNG = np.random.default_rng(0)


def _r(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


LOW, F32, SAME = "low", "float32", "same"

# name, function of tensors, input arrays, expected output dtype class
ROWS = [
    ("matmul", lambda a, b: F.matmul(a, b), [_r(3, 4), _r(4, 5)], LOW),
    ("batched matmul", lambda a, b: F.matmul(a, b), [_r(2, 3, 4), _r(2, 4, 5)], LOW),
    ("linear", lambda x, w, b: F.linear(x, w, b), [_r(3, 4), _r(5, 4), _r(5)], LOW),
    ("einsum", lambda a, b: F.einsum("bij,bjk->bik", a, b), [_r(2, 3, 4), _r(2, 4, 2)], LOW),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, padding=1),
     [_r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3)], LOW),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b), [_r(2, 2, 6), _r(3, 2, 3), _r(3)], LOW),
    ("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, stride=2),
     [_r(1, 2, 3, 3), _r(2, 3, 2, 2)], LOW),
    ("attention", lambda q, k, v: F.nn.scaled_dot_product_attention(q, k, v, is_causal=True),
     [_r(2, 4, 3), _r(2, 4, 3), _r(2, 4, 3)], LOW),
    ("softmax", lambda x: F.softmax(x, axis=-1), [_r(3, 5)], F32),
    ("logsoftmax", lambda x: F.logsoftmax(x, axis=-1), [_r(3, 5)], F32),
    ("cross_entropy", lambda x: F.nn.cross_entropy(x, mg.tensor([0, 2, 4])), [_r(3, 5)], F32),
    ("binary_cross_entropy", lambda x: F.nn.binary_cross_entropy(
        x, mg.tensor(np.array([[0, 1, 1], [1, 0, 0]], np.float32))), [_r(2, 3)], F32),
    ("square_loss", lambda x, y: F.nn.square_loss(x, y), [_r(3, 4), _r(3, 4)], F32),
    ("l1_loss", lambda x, y: F.nn.l1_loss(x, y), [_r(3, 4), _r(3, 4)], F32),
    ("layer_norm", lambda x: F.nn.layer_norm(x, (4,), affine=False), [_r(3, 4)], F32),
    ("batch_norm", lambda x: F.nn.batch_norm(x, training=True), [_r(4, 3, 2)], F32),
    ("group_norm", lambda x: F.nn.group_norm(x, 2, affine=False), [_r(2, 4, 3)], F32),
    ("exp", lambda x: F.exp(x), [_r(3, 4)], F32),
    ("log", lambda x: F.log(x), [np.abs(_r(3, 4)) + 0.5], F32),
    ("log1p", lambda x: F.log1p(x), [np.abs(_r(3, 4))], F32),
    ("expm1", lambda x: F.expm1(x), [_r(3, 4)], F32),
    ("sum", lambda x: F.sum(x, axis=1), [_r(3, 40)], F32),
    ("mean", lambda x: F.mean(x), [_r(3, 40)], F32),
    ("relu (unlisted: keeps dtype)", lambda x: F.relu(x), [_r(3, 4)], SAME),
    ("tanh (unlisted: keeps dtype)", lambda x: F.tanh(x), [_r(3, 4)], SAME),
]
IDS = [r[0] for r in ROWS]
LOW_DTYPES = ["float16", "bfloat16"]
# relative accuracy of one rounding, times a slack for sums of a few products
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def _inputs(arrays, row_kind, low):
    """The op's inputs: float32, except that a float32-list op receives low-precision inputs
    (what it meets in a network: the output of a matrix product)."""
    dtype = low if row_kind in (F32, SAME) else "float32"
    return [mg.tensor(a, dtype=dtype) for a in arrays]


def _reference(fn, arrays, row_kind, low):
    """The op in float64 without autocast, on the inputs rounded as autocast rounds them."""
    rounded = [mg.tensor(a, dtype=low).astype("float64") for a in arrays]
    return fn(*rounded).numpy().astype(np.float64)


def _expected_dtype(row_kind, low, inputs):
    if row_kind == LOW:
        return mg.tensor([0.0], dtype=low).dtype
    if row_kind == F32:
        return np.dtype(np.float32)
    return inputs[0].dtype


@pytest.mark.parametrize("low", LOW_DTYPES)
@pytest.mark.parametrize("name,fn,arrays,kind", ROWS, ids=IDS)
def test_autocast_output_dtype_and_value(name, fn, arrays, kind, low):
    inputs = _inputs(arrays, kind, low)
    with amp.autocast(low_prec_dtype=low):
        out = fn(*inputs)
    assert out.dtype == _expected_dtype(kind, low, inputs), name
    ref = _reference(fn, arrays, kind, low)
    got = out.numpy().astype(np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=TOL[low], atol=TOL[low] * scale, err_msg=name)


@pytest.mark.parametrize("name,fn,arrays,kind", ROWS, ids=IDS)
def test_autocast_off_keeps_float32(name, fn, arrays, kind):
    out = fn(*[mg.tensor(a) for a in arrays])
    assert out.dtype == np.float32


def _loss64(fn, arrays, weights):
    """``sum(fn(arrays) * weights)`` in float64, no autocast: the reference function."""
    out = fn(*[mg.tensor(a.astype(np.float64)) for a in arrays]).numpy().astype(np.float64)
    return float((out * weights).sum())


@pytest.mark.parametrize("low", LOW_DTYPES)
@pytest.mark.parametrize("name,fn,arrays,kind", ROWS, ids=IDS)
def test_autocast_gradients_against_float64_differences(name, fn, arrays, kind, low):
    """The gradient of every input under autocast against float64 central differences of the
    float64 op (the exact function autocast approximates), element by element."""
    rng = np.random.default_rng(1)
    params = [mg.Parameter(a) for a in arrays]  # float32 leaves, as a model's weights are
    gm = ad.GradManager().attach(params)
    with amp.autocast(low_prec_dtype=low):
        ref_out = fn(*[mg.tensor(a) for a in arrays])
    weights = rng.standard_normal(ref_out.shape)
    with gm:
        with amp.autocast(low_prec_dtype=low):
            out = fn(*params)
        gm.backward((out.astype("float32") * mg.tensor(weights.astype(np.float32))).sum())
    eps = 1e-6
    base = [a.astype(np.float64) for a in arrays]
    for i, p in enumerate(params):
        assert p.grad is not None and p.grad.dtype == np.float32, name  # the leaf's dtype
        numeric = np.zeros(arrays[i].shape)
        for idx in np.ndindex(*arrays[i].shape):
            plus = [a.copy() for a in base]
            minus = [a.copy() for a in base]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            numeric[idx] = (_loss64(fn, plus, weights) - _loss64(fn, minus, weights)) / (2 * eps)
        scale = max(1.0, float(np.abs(numeric).max()))
        np.testing.assert_allclose(p.grad.numpy(), numeric, rtol=3 * TOL[low],
                                   atol=3 * TOL[low] * scale, err_msg=f"{name} input {i}")


def test_mixed_inputs_promote_and_gradients_keep_each_input_dtype():
    a = mg.Parameter(_r(3, 4), dtype="float16")
    b = mg.Parameter(_r(3, 4))
    gm = ad.GradManager().attach([a, b])
    with gm:
        with amp.autocast():
            c = a + b  # not on a list: NumPy promotion
            assert c.dtype == np.float32
        gm.backward(c.sum())
    assert a.grad.dtype == np.float16 and b.grad.dtype == np.float32


def test_autocast_nesting_disable_and_restore():
    x, w = mg.tensor(_r(2, 3)), mg.tensor(_r(4, 3))
    assert not amp.is_autocast_enabled()
    with amp.autocast():
        assert F.linear(x, w).dtype == np.float16
        with amp.autocast(enabled=False):
            assert F.linear(x, w).dtype == np.float32
            with amp.autocast(low_prec_dtype="bfloat16"):
                assert F.linear(x, w).dtype == bfloat16()
        assert F.linear(x, w).dtype == np.float16
    assert F.linear(x, w).dtype == np.float32 and not amp.is_autocast_enabled()


def test_autocast_as_decorator():
    @amp.autocast()
    def forward(x, w):
        return F.linear(x, w)

    @amp.autocast(enabled=False)
    def forward_off(x, w):
        return F.linear(x, w)

    x, w = mg.tensor(_r(2, 3)), mg.tensor(_r(4, 3))
    assert forward(x, w).dtype == np.float16
    with amp.autocast():
        assert forward_off(x, w).dtype == np.float32
    assert F.linear(x, w).dtype == np.float32


def test_autocast_is_per_thread():
    x, w = mg.tensor(_r(2, 3)), mg.tensor(_r(4, 3))
    seen = []
    with amp.autocast():
        t = threading.Thread(target=lambda: seen.append(F.linear(x, w).dtype))
        t.start()
        t.join()
        assert F.linear(x, w).dtype == np.float16
    assert seen == [np.float32]


def test_backward_inside_autocast_runs_with_autocast_off():
    """A backward started inside autocast runs its gradient ops without autocast (they follow the
    dtypes of the recorded forward): a Function's backward sees autocast off."""
    seen = []

    class Probe(ad.Function):
        def forward(self, x):
            return x._data * 2

        def backward(self, dy):
            seen.append(amp.is_autocast_enabled())
            return dy * 2

    w = mg.Parameter(_r(4, 3), dtype="float16")
    b = mg.Parameter(_r(4), dtype="float16")
    x = mg.tensor(_r(5, 3), dtype="float16")
    gm = ad.GradManager().attach([w, b])
    with gm:
        with amp.autocast():
            y = Probe()(F.linear(x, w, b))
            gm.backward(y.sum())
            assert amp.is_autocast_enabled()  # restored after the backward
    assert seen == [False]
    assert w.grad.dtype == np.float16 and b.grad.dtype == np.float16
    np.testing.assert_allclose(b.grad.numpy(), np.full(4, 10.0))


def test_autocast_rejects_non_float_dtypes():
    with pytest.raises(ValueError, match="low_prec_dtype must be a floating dtype, got int32"):
        amp.autocast(low_prec_dtype="int32")


def test_autocast_on_a_gpu_uses_float16_products_and_refuses_bfloat16():
    """On a GPU (the fake CuPy here) the float16 inputs go to CuPy's float16 product directly
    (no float32 round trip), and bfloat16 is refused with the reason."""
    from fakes import fake_cupy

    with fake_cupy.installed(1):
        x = mg.tensor(_r(2, 3), device="gpu0")
        w = mg.Parameter(_r(4, 3), device="gpu0")
        with amp.autocast():
            y = F.linear(x, w)
        assert y.dtype == np.float16 and y.device == mg.tensor([0.0], device="gpu0").device
        expected = x.numpy().astype(np.float16) @ w.numpy().astype(np.float16).T
        np.testing.assert_allclose(y.numpy(), expected, rtol=2e-3)
        with amp.autocast(low_prec_dtype="bfloat16"):
            with pytest.raises(TypeError, match="linear: autocast to bfloat16 on gpu0"):
                F.linear(x, w)
