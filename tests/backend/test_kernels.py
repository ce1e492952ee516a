"""The fused kernels against the unfused compositions they replace, in float64 and float32.

Each fused op is compared with the same math written as a composition of minigrad primitives
(exp, erf, mean, matmul, ...), forward values and gradients alike (the composition's gradients come
from autodiff, so they are independent of the fused backward). Raw kernel edge cases (tails of the
float32 exp/erfc, masks, empty inputs, odd shapes, im2col/col2im adjointness) follow. The
``device`` fixture adds ``gpu0`` (the CuPy kernels) where CUDA is available.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from numpy_references import ref_pool

import minigrad as mg
import minigrad.functional as F
from minigrad.backend import kernels
from minigrad.testing import check_grad

TOL = {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=2e-5, atol=2e-6)}
DTYPES = ["float64", "float32"]


def _grads(fn, arrays, dtype, device, seed=0):
    """Output and input gradients of ``sum(fn(*tensors) * w)`` for a fixed random ``w``."""
    ts = [mg.Parameter(a.astype(dtype), device=device) for a in arrays]
    gm = mg.GradManager().attach(ts)
    with gm:
        out = fn(*ts)
        w = np.random.default_rng(seed).standard_normal(out.shape).astype(dtype)
        gm.backward(out, mg.tensor(w, device=device))
    return [out.numpy()] + [t.grad.numpy() for t in ts]


def _same(fused, composed, arrays, dtype, device):
    """The fused op and its composition agree on the output and every input gradient."""
    got, want = _grads(fused, arrays, dtype, device), _grads(composed, arrays, dtype, device)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.dtype(dtype), (i, g.dtype)
        np.testing.assert_allclose(g, w, **TOL[dtype], err_msg=f"result {i}")


# --------------------------------------------------------------------------------------------------
# compositions of primitives (what the fused ops replace)


def gelu_composed(x):
    return x * (F.erf(x * (1 / math.sqrt(2))) * 0.5 + 0.5)


def softmax_composed(x, axis):
    e = F.exp(x - F.max(x, axis, keepdims=True).detach())
    return e / F.sum(e, axis, keepdims=True)


def logsoftmax_composed(x, axis):
    s = x - F.max(x, axis, keepdims=True).detach()
    return s - F.log(F.sum(F.exp(s), axis, keepdims=True))


def layer_norm_composed(x, w, b, k, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    c = x - F.mean(x, axes, keepdims=True)
    return c / F.sqrt(F.mean(c * c, axes, keepdims=True) + eps) * w + b


def attention_composed(q, k, v, bias, scale):
    s = F.matmul(q, k, transpose_b=True) * scale
    return F.matmul(softmax_composed(s if bias is None else s + bias, -1), v)


# --------------------------------------------------------------------------------------------------
# ops against compositions


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 13), (3, 1, 5), (1,)])
def test_gelu_matches_composition(shape, dtype, device, rng):
    _same(F.gelu, gelu_composed, [rng.standard_normal(shape) * 3], dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, axis", [((5, 9), -1), ((3, 4, 7), 1), ((6, 5), 0), ((2, 1), 1)])
def test_softmax_family_matches_composition(shape, axis, dtype, device, rng):
    x = [rng.standard_normal(shape) * 4]
    _same(lambda t: F.softmax(t, axis), lambda t: softmax_composed(t, axis), x, dtype, device)
    _same(lambda t: F.logsoftmax(t, axis), lambda t: logsoftmax_composed(t, axis), x, dtype,
          device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, k", [((4, 6, 10), 1), ((3, 5, 7), 2), ((9,), 1)])
def test_layer_norm_matches_composition(shape, k, dtype, device, rng):
    norm = shape[len(shape) - k:]
    arrays = [rng.standard_normal(shape) * 2 + 1, rng.standard_normal(norm),
              rng.standard_normal(norm)]
    _same(lambda x, w, b: F.layer_norm(x, norm, True, w, b),
          lambda x, w, b: layer_norm_composed(x, w, b, k), arrays, dtype, device)


@pytest.mark.parametrize("op", [F.gelu, lambda t: F.softmax(t, -1), lambda t: F.logsoftmax(t, 0),
                                lambda t: F.layer_norm(t, 3), lambda t: F.max_pool2d(t, 1),
                                lambda t: F.scaled_dot_product_attention(t, t, t, is_causal=True)])
def test_empty_batches(op, device):
    x = mg.Parameter(np.zeros((0, 2, 4, 3)), device=device)
    gm = mg.GradManager().attach(x)
    with gm:
        out = op(x)
        gm.backward(out.sum())
    assert out.shape[0] == 0 and x.grad.shape == x.shape


def test_layer_norm_without_affine_or_with_only_a_bias(device, rng):
    x, b = rng.standard_normal((3, 6)), rng.standard_normal(6)
    _same(lambda t: F.layer_norm(t, 6, affine=False), lambda t: layer_norm_composed(t, 1.0, 0.0, 1),
          [x], "float64", device)
    _same(lambda t, bb: F.layer_norm(t, 6, True, None, bb),
          lambda t, bb: layer_norm_composed(t, 1.0, bb, 1), [x, b], "float64", device)


ATTENTION_CASES = [  # (q shape, k shape, mask shape or None, causal)
    ((2, 3, 5, 4), (2, 3, 7, 4), None, False),
    ((2, 3, 6, 4), (2, 3, 6, 4), None, True),
    ((2, 2, 5, 3), (2, 2, 4, 3), (5, 4), True),  # causal with fewer keys than queries
    ((2, 2, 3, 4), (2, 2, 9, 4), None, True),  # causal, most keys hidden: the row-by-row path
    ((2, 3, 4, 2), (2, 3, 4, 2), (2, 1, 4, 4), False),  # a mask per batch, broadcast over heads
    ((4, 2), (3, 2), (2, 4, 3), False),  # the mask broadcasts the scores to a larger shape
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_matches_composition(case, dtype, device, rng):
    qs, ks, ms, causal = case
    q, k = rng.standard_normal(qs), rng.standard_normal(ks)
    v = rng.standard_normal(ks[:-1] + (3,))
    bias = None
    if ms is not None:
        bias = np.where(rng.random(ms) < 0.3, -np.inf, rng.standard_normal(ms)).astype(dtype)
        bias[..., 0] = 0.0  # every query keeps key 0
    if causal:
        causal_bias = np.triu(np.full((qs[-2], ks[-2]), -np.inf), 1).astype(dtype)
        full = causal_bias if bias is None else bias + causal_bias
    else:
        full = bias
    wrap = lambda a: None if a is None else mg.tensor(a, device=device)  # noqa: E731
    scale = 0.7
    _same(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, wrap(bias), causal, scale=scale),
          lambda q, k, v: attention_composed(q, k, v, wrap(full), scale), [q, k, v], dtype, device)


POOL_CASES = [  # (shape, kernel, stride, padding): the 2x2 fast path and the general loop
    ((2, 3, 8, 6), 2, 2, 0),
    ((2, 3, 7, 9), 2, 2, 0),  # odd sizes: the last row/column is dropped
    ((1, 2, 7, 7), 3, 2, 1),
    ((2, 1, 5, 6), (2, 3), (1, 2), (1, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_matches_reference(case, dtype, device, rng):
    shape, k, s, p = case
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(dtype) / 7  # no ties
    got = F.max_pool2d(mg.tensor(x, device=device), k, s, p).numpy()
    np.testing.assert_array_equal(got, ref_pool(x.astype(np.float64), k, s, p, "max"))
    if dtype == "float64":
        check_grad(lambda t: F.max_pool2d(t, k, s, p), x, device=device)


def test_max_pool_nan_wins_and_gets_the_gradient(device):
    x = np.array([[[[1.0, np.nan], [3.0, 2.0]]]])
    t = mg.Parameter(x, device=device)
    gm = mg.GradManager().attach(t)
    with gm:
        out = F.max_pool2d(t, 2)
        gm.backward(out.sum())
    assert np.isnan(out.numpy()).all()
    np.testing.assert_array_equal(t.grad.numpy(), [[[[0.0, 1.0], [0.0, 0.0]]]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_bias_fused_equals_added_after(dtype, device, rng):
    x, w, b = rng.standard_normal((3, 2, 7, 6)), rng.standard_normal((4, 2, 3, 2)), rng.random(4)
    _same(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1),
          lambda x, w, b: F.conv2d(x, w, stride=(2, 1), padding=1) + F.reshape(b, (1, 4, 1, 1)),
          [x, w, b], dtype, device)


def test_conv2d_weight_gradient_over_a_long_pixel_axis(rng):
    """LeNet's first layer: the weight gradient is summed over slabs of the 9216-pixel axis."""
    x, w = rng.standard_normal((16, 1, 28, 28)), rng.standard_normal((6, 1, 5, 5))
    check_grad(lambda x, w: F.conv2d(x, w), x, w, wrt=[1])


# --------------------------------------------------------------------------------------------------
# raw kernels: float32 math, edge cases, layout


def _xp(device):
    return mg.tensor(np.zeros(1), device=device).xp


def test_float32_exp_and_normal_cdf_are_accurate_over_the_whole_range(device):
    xp = _xp(device)
    x = np.linspace(-120, 90, 200_001).astype(np.float32)
    shifted = np.float64(x - x.max())  # the float32 shift, as the kernel (and NumPy) compute it
    want = np.exp(shifted) / np.exp(shifted).sum()  # softmax of one long row
    got = kernels.softmax(xp.asarray(x)[None], -1)
    got = (got.get() if hasattr(got, "get") else got)[0]
    assert got.dtype == np.float32
    normal = want > np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], want[normal], rtol=3e-6)
    if device == "cpu0":  # the numba exp flushes what would be a float32 denormal to exactly 0
        assert np.all(got[shifted < -87.34] == 0.0)
    grid = np.linspace(-12, 12, 4001).astype(np.float32)
    y, slope = kernels.gelu(xp.asarray(grid))
    y, slope = [a.get() if hasattr(a, "get") else a for a in (y, slope)]
    v = grid.astype(np.float64)
    cdf = np.array([math.erfc(-u / math.sqrt(2)) / 2 for u in v])
    want_y, want_slope = v * cdf, cdf + v * np.exp(-v * v / 2) / math.sqrt(2 * math.pi)
    # float32 arithmetic on the argument -x^2/2 of the normal's exp limits the lower tail (as
    # NumPy's float32); the slope's tail is a difference of two such terms
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-37)
    middle = np.abs(v) < 4
    np.testing.assert_allclose(y[middle], want_y[middle], rtol=1e-6, atol=1e-37)
    np.testing.assert_allclose(slope[middle], want_slope[middle], rtol=3e-6, atol=2e-7)
    np.testing.assert_allclose(slope, want_slope, rtol=1e-3, atol=2e-7)


def test_float32_layer_norm_keeps_its_accuracy_far_from_zero():
    """The CPU kernel centres float32 rows in float32 with the mean split in two: rows around
    1e4 (where one float32 ulp is 1e-3) still normalise to float32 rounding, forward and back."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 128)) + 1e4).astype(np.float32)
    w, b = rng.standard_normal((2, 128)).astype(np.float32)
    y, xhat, rstd = kernels.layer_norm(x, w, b, 1e-5, 128)
    x64 = x.astype(np.float64)
    want_xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(xhat, want_xhat, rtol=0, atol=1e-5)
    np.testing.assert_allclose(y, want_xhat * w + b, rtol=0, atol=2e-5)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx = kernels.layer_norm_grad(dy, xhat, rstd, w)[0]
    g = dy * w.astype(np.float64)
    want_dx = (g - g.mean(1, keepdims=True) - want_xhat * (g * want_xhat).mean(1, keepdims=True)
               ) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=1e-6 * np.abs(want_dx).max())


def test_softmax_of_masked_and_infinite_rows(device):
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 0.0],
                  [np.nan, 0.0, 1.0]])
    got = F.softmax(mg.tensor(x, device=device), -1).numpy()
    e = np.exp(1.0)
    np.testing.assert_allclose(got[0], [1 / (1 + e), 0.0, e / (1 + e)])
    assert np.isnan(got[1:]).all()  # as NumPy: -inf - -inf and inf - inf are NaN


def test_attention_rows_that_see_no_key_are_nan(device, rng):
    q = mg.tensor(rng.standard_normal((2, 3, 2)), device=device)
    mask = np.ones((3, 3), bool)
    mask[1] = False
    out = F.scaled_dot_product_attention(q, q, q, mg.tensor(mask, device=device)).numpy()
    assert np.isnan(out[:, 1]).all() and np.isfinite(out[:, [0, 2]]).all()


@pytest.mark.parametrize("case", [((2, 3, 6, 5), (3, 2), (1, 2), (1, 0), (1, 1)),
                                  ((1, 2, 9, 8), (3, 3), (2, 3), (2, 1), (2, 1))])
def test_im2col_is_the_adjoint_of_col2im(case, device, rng):
    shape, kern, stride, pad, dil = case
    oh, ow = ((shape[2 + a] + 2 * pad[a] - dil[a] * (kern[a] - 1) - 1) // stride[a] + 1
              for a in range(2))
    xp = _xp(device)
    x = rng.standard_normal(shape)
    cols = kernels.im2col(xp.asarray(x), kern, stride, pad, dil, (oh, ow))
    # column (n, y, x) of row (c, i, j) reads x[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw]
    padded = np.pad(x, ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
    want = np.stack([padded[:, c, i * dil[0]: i * dil[0] + stride[0] * (oh - 1) + 1: stride[0],
                            j * dil[1]: j * dil[1] + stride[1] * (ow - 1) + 1: stride[1]].ravel()
                     for c in range(shape[1]) for i in range(kern[0]) for j in range(kern[1])])
    np.testing.assert_array_equal(mg.tensor(cols).numpy() if device == "cpu0" else cols.get(),
                                  want)
    c = rng.standard_normal(want.shape)
    back = kernels.col2im(xp.asarray(c), shape, kern, stride, pad, dil, (oh, ow))
    back = back.get() if hasattr(back, "get") else back
    np.testing.assert_allclose((want * c).sum(), (x * back).sum(), rtol=1e-12)


def test_product_layout_round_trip_with_bias(device, rng):
    xp = _xp(device)
    mat, bias = rng.standard_normal((4, 3 * 10)), rng.standard_normal(4)
    out = kernels.from_product_layout(xp.asarray(mat), 3, xp.asarray(bias))
    got = out.get() if hasattr(out, "get") else out
    np.testing.assert_array_equal(got, mat.reshape(4, 3, 10).transpose(1, 0, 2) + bias[:, None])
    back, dbias = kernels.to_product_layout(out)
    back = back.get() if hasattr(back, "get") else back
    np.testing.assert_allclose(back, mat + bias[:, None], rtol=1e-15)
    np.testing.assert_allclose(mg.tensor(dbias).numpy() if device == "cpu0" else dbias.get(),
                               got.sum(axis=(0, 2)), rtol=1e-12)


# --------------------------------------------------------------------------------------------------
# compilation and caching


def _python(code: str, **env) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env = dict(os.environ, PYTHONPATH=root, **env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=240)


def test_import_minigrad_does_not_import_numba_until_a_kernel_runs():
    code = ("import sys, numpy as np, minigrad, minigrad.functional as F\n"
            "print('numba' in sys.modules)\n"
            "F.softmax(minigrad.tensor(np.ones((2, 3), np.float32)))\n"
            "print('numba' in sys.modules)\n")
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_kernels_compile_without_a_writable_cache():
    """With no cache folder numba refuses cache=True: the kernels compile in memory, with one
    warning."""
    code = ("import warnings, numpy as np, minigrad as mg, minigrad.functional as F\n"
            "warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    y = F.softmax(mg.tensor([[0.0, 1.0]]))\n"
            "n = sum('cannot cache' in str(x.message) for x in w)\n"
            "print(round(float(y.numpy()[0, 1]), 6), n)\n")
    out = _python(code, NUMBA_CACHE_LOCATOR_CLASSES="ZipCacheLocator")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(round(math.e / (1 + math.e), 6)), "1"]


@pytest.mark.parametrize("self_attention", [True, False])
def test_multi_head_attention_head_layout_is_twice_differentiable(self_attention, device, rng,
                                                                   double_grad):
    """The fused head split/merge of multi_head_attention records Tensor ops in a recorded
    backward, so second-order gradients flow through them."""
    x, m = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    w_in, w_out = rng.standard_normal((12, 4)) * 0.5, rng.standard_normal((4, 4)) * 0.5
    if self_attention:
        fn = lambda x: F.multi_head_attention(x, x, x, 2, mg.tensor(w_in, device=device),  # noqa
                                              None, mg.tensor(w_out, device=device))
        double_grad(fn, x, device=device)
    else:
        fn = lambda x, m: F.multi_head_attention(x, m, m, 2, mg.tensor(w_in, device=device),  # noqa
                                                 None, mg.tensor(w_out, device=device))
        double_grad(fn, x, m, device=device)


class _Tagged(np.ndarray):
    """An array type of its own (a NumPy subclass, so the kernels' shape code works on it)."""


class _TaggedKernels:
    """Kernels for :class:`_Tagged` that say they ran (and what they got)."""

    def __init__(self):
        self.calls = []

    def gelu(self, x):
        self.calls.append(("gelu", type(x), x.shape))
        return x * 0 + 7, x * 0

    def softmax(self, rows):
        self.calls.append(("softmax", type(rows), rows.shape))
        return rows * 0 + 3


def test_registered_kernels_run_on_their_array_type_only():
    tagged = np.arange(6.0).reshape(2, 3).view(_Tagged)
    mine = _TaggedKernels()
    kernels.register_kernels(_Tagged, mine)
    try:
        y, slope = kernels.gelu(tagged)
        s = kernels.softmax(tagged, 0)  # the reduced axis is brought last for the backend
        plain = kernels.gelu(np.array([0.0, 1.0]))[0]  # NumPy arrays keep the built-in kernels
    finally:
        kernels.unregister_kernels(_Tagged)
    assert mine.calls == [("gelu", _Tagged, (2, 3)), ("softmax", _Tagged, (3, 2))]
    assert (y == 7).all() and (s == 3).all() and s.shape == (2, 3)
    np.testing.assert_allclose(plain, [0.0, 0.5 * (1 + math.erf(1 / math.sqrt(2)))], rtol=1e-12)
    y_after, _ = kernels.gelu(tagged)  # unregistered: the CPU kernels again
    assert y_after[0, 1] == pytest.approx(plain[1], rel=1e-12) and len(mine.calls) == 2
    with pytest.raises(TypeError, match="array_type must be a type, got _Tagged"):
        kernels.register_kernels(tagged, mine)
