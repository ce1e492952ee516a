"""MegEngine's functional ops that minigrad adds for compatibility, checked against NumPy references
(forward, float64), central finite differences (backward) and the values in MegEngine's documented
examples. Each test's docstring names the documented behaviour it pins down."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def t(a, device="cpu0"):
    return mg.tensor(np.asarray(a), device=device)


# -- elementwise ---------------------------------------------------------------------------------

UNARY = [
    ("asin", F.asin, np.arcsin, lambda r, s: r.uniform(-0.9, 0.9, s)),
    ("acos", F.acos, np.arccos, lambda r, s: r.uniform(-0.9, 0.9, s)),
    ("atan", F.atan, np.arctan, lambda r, s: r.standard_normal(s)),
    ("sinh", F.sinh, np.sinh, lambda r, s: r.standard_normal(s)),
    ("cosh", F.cosh, np.cosh, lambda r, s: r.standard_normal(s)),
    ("asinh", F.asinh, np.arcsinh, lambda r, s: 3 * r.standard_normal(s)),
    ("acosh", F.acosh, np.arccosh, lambda r, s: r.uniform(1.2, 4.0, s)),
    ("atanh", F.atanh, np.arctanh, lambda r, s: r.uniform(-0.9, 0.9, s)),
    ("logsigmoid", F.logsigmoid, lambda x: -np.logaddexp(0, -x),
     lambda r, s: 4 * r.standard_normal(s)),
]


@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=[u[0] for u in UNARY])
def test_unary_math(name, fn, ref, gen, device, rng, double_grad):
    """MegEngine's elemwise math: values of the NumPy function, float32 in -> float32 out, int in ->
    float32, and first and second derivatives."""
    x = gen(rng, (3, 4))
    np.testing.assert_allclose(fn(t(x, device)).numpy(), ref(x), rtol=1e-12, atol=1e-12)
    assert fn(t(x.astype(np.float32), device)).dtype == np.float32
    check_grad(fn, x, device=device)
    double_grad(fn, x, device=device)


def test_logsigmoid_documented_values_and_no_overflow(default_device):
    """MegEngine's documented example: logsigmoid(arange(-5, 5)) rounds to -5.0067 ... -0.0181;
    and it is -softplus(-x), finite for huge |x|."""
    y = F.logsigmoid(F.arange(-5, 5)).numpy().round(4)
    np.testing.assert_allclose(y, [-5.0067, -4.0182, -3.0486, -2.1269, -1.3133, -0.6931, -0.3133,
                                   -0.1269, -0.0486, -0.0181], atol=1e-4)
    big = F.logsigmoid(t(np.array([-1000.0, 1000.0]))).numpy()
    np.testing.assert_allclose(big, [-1000.0, 0.0])
    assert F.nn.logsigmoid is F.logsigmoid


@pytest.mark.parametrize("name,fn,ref", [("atan2", F.atan2, np.arctan2),
                                         ("logaddexp", F.logaddexp, np.logaddexp)])
def test_binary_math(name, fn, ref, device, rng, double_grad):
    """atan2(y, x) and logaddexp(x, y) broadcast like every elementwise op; both are smooth in both
    arguments (away from the origin for atan2)."""
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,)) + 3.0
    np.testing.assert_allclose(fn(t(a, device), t(b, device)).numpy(), ref(a, b), rtol=1e-12)
    check_grad(fn, a, b, device=device)
    double_grad(fn, a, b, device=device)
    np.testing.assert_allclose(fn(2.0, t(b, device)).numpy(), ref(2.0, b), rtol=1e-12)
    assert fn(t(np.array([1, 2])), t(np.array([3, 4]))).dtype == np.float32


def test_logaddexp_splits_the_gradient_at_ties(default_device):
    """d/dx log(e^x + e^y) = sigmoid(x - y): 0.5 each at x == y (no one-sided maximum)."""
    x, y = mg.Parameter(np.float64(2.0)), mg.Parameter(np.float64(2.0))
    gm = mg.GradManager().attach([x, y])
    with gm:
        gm.backward(F.logaddexp(x, y))
    assert x.grad.item() == 0.5 and y.grad.item() == 0.5
    big = F.logaddexp(t(np.array([1000.0])), t(np.array([1000.0]))).numpy()
    np.testing.assert_allclose(big, 1000.0 + np.log(2.0))


def test_shifts_match_numpy(default_device):
    """left_shift/right_shift are NumPy's bitwise shifts (arithmetic right shift)."""
    a, s = np.array([1, -8, 255], np.int32), np.array([3, 1, 4], np.int32)
    np.testing.assert_array_equal(F.left_shift(t(a), t(s)).numpy(), np.left_shift(a, s))
    np.testing.assert_array_equal(F.right_shift(t(a), 2).numpy(), np.right_shift(a, 2))


def test_elemwise_module_is_megengine_names():
    """megengine.functional.elemwise holds the elementwise ops under the same names as F."""
    for name in F.elemwise.__all__:
        assert getattr(F.elemwise, name) is getattr(F, name), name


# -- shape ---------------------------------------------------------------------------------------


def test_roll(device, rng):
    """MegEngine's documented example and NumPy's np.roll (negative shifts, several axes, None)."""
    x = t(np.array([[1, 2], [3, 4], [5, 6]], np.int32), device)
    np.testing.assert_array_equal(F.roll(x, 1, 0).numpy(), [[5, 6], [1, 2], [3, 4]])
    a = rng.standard_normal((3, 4, 5))
    for shift, axis in [(2, 1), (-7, -1), ((1, -2), (0, 2)), (5, None), ((1, 1), (1, 1))]:
        got = F.roll(t(a, device), shift, axis).numpy()
        np.testing.assert_array_equal(got, np.roll(a, shift, axis))
    check_grad(lambda v: F.roll(v, (1, -2), (0, 2)), a, device=device)


def test_cond_take_and_non_zero(device, rng):
    """MegEngine's documented examples: cond_take returns the picked values and their flat int32
    indices; non_zero gives (count, ndim) indices, or one tensor per axis with as_tuple."""
    mask = np.array([[True, False], [False, True]])
    x = np.array([[1, np.inf], [np.nan, 4]], np.float32)
    v, i = F.cond_take(t(mask, device), t(x, device))
    np.testing.assert_array_equal(v.numpy(), [1.0, 4.0])
    assert i.dtype == np.int32 and i.numpy().tolist() == [0, 3]
    (idx,) = F.non_zero(t(np.array([1, 1, 0, 1]), device), as_tuple=True)
    assert idx.dtype == np.int32 and idx.numpy().tolist() == [0, 1, 3]
    a = rng.integers(0, 2, (3, 4, 2))
    np.testing.assert_array_equal(F.non_zero(t(a, device)).numpy(), np.argwhere(a))
    m = rng.random((3, 4)) > 0.5
    check_grad(lambda z: F.cond_take(t(m, device), z)[0], rng.standard_normal((3, 4)),
               device=device)
    with pytest.raises(TypeError, match="cond_take: mask must be a bool tensor"):
        F.cond_take(t(a, device), t(a, device))
    with pytest.raises(ValueError, match=r"cond_take: mask shape \(2,\) differs"):
        F.cond_take(t(np.array([True, False]), device), t(x, device))


def test_diag(device, rng):
    """MegEngine's documented examples: a vector becomes a (shifted) diagonal matrix, a matrix
    yields its k-th diagonal; both directions are differentiable."""
    np.testing.assert_array_equal(F.diag(t(np.array([1, 2, 3]), device), k=1).numpy(),
                                  np.diag([1, 2, 3], k=1))
    a = rng.standard_normal((3, 5))
    for k in (-2, 0, 1, 4, 6):
        np.testing.assert_array_equal(F.diag(t(a, device), k).numpy(), np.diag(a, k))
        check_grad(lambda z, k=k: F.diag(z, k), a, device=device)
    v = rng.standard_normal(4)
    for k in (-1, 0, 2):
        np.testing.assert_array_equal(F.diag(t(v, device), k).numpy(), np.diag(v, k))
        check_grad(lambda z, k=k: F.diag(z, k), v, device=device)


def test_pixel_shuffle(device, rng):
    """(..., C*r*r, H, W) -> (..., C, H*r, W*r) with
    out[c, h*r+i, w*r+j] = in[c*r*r + i*r + j, h, w] (MegEngine's definition), as loops here."""
    r = 2
    a = rng.standard_normal((2, 3, 2 * r * r, 3, 2))  # two leading batch axes
    got = F.nn.pixel_shuffle(t(a, device), r).numpy()
    want = np.zeros((2, 3, 2, 3 * r, 2 * r))
    for c, h, w, i, j in itertools.product(range(2), range(3), range(2), range(r), range(r)):
        want[:, :, c, h * r + i, w * r + j] = a[:, :, c * r * r + i * r + j, h, w]
    np.testing.assert_array_equal(got, want)
    check_grad(lambda z: F.pixel_shuffle(z, r), a, device=device)


@pytest.mark.parametrize("mode,np_mode", [("reflect", "reflect"), ("replicate", "edge"),
                                          ("edge", "edge"), ("constant", "constant")])
def test_nn_pad_modes(mode, np_mode, device, rng):
    """F.nn.pad: MegEngine's documented examples ('constant', 'reflect' without repeating the edge,
    'replicate'), leading-axes-only pad_width, NumPy's np.pad as the reference, and gradients that
    sum the mirrored copies."""
    doc = t(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), device)
    if mode == "reflect":
        np.testing.assert_array_equal(F.nn.pad(doc, ((1, 1), (1, 2)), mode=mode).numpy(),
                                      [[5, 4, 5, 6, 5, 4], [2, 1, 2, 3, 2, 1],
                                       [5, 4, 5, 6, 5, 4], [2, 1, 2, 3, 2, 1]])
    if mode == "constant":
        np.testing.assert_array_equal(F.nn.pad(doc, ((1, 1),), constant_value=9).numpy(),
                                      [[9, 9, 9], [1, 2, 3], [4, 5, 6], [9, 9, 9]])
    a = rng.standard_normal((3, 4, 2))
    width = ((2, 1), (0, 3), (1, 1))
    np.testing.assert_array_equal(F.nn.pad(t(a, device), width, mode=mode).numpy(),
                                  np.pad(a, width, mode=np_mode))
    check_grad(lambda z: F.pad(z, width, mode=mode), a, device=device)


def test_pad_errors():
    with pytest.raises(ValueError, match="pad: mode must be 'constant', 'reflect'"):
        F.pad(t(np.ones((2, 2))), ((1, 1),), mode="circular")
    with pytest.raises(ValueError, match="pad: cannot reflect-pad axis 0 of size 1"):
        F.pad(t(np.ones((1, 2))), ((1, 1),), mode="reflect")


def test_split_sizes_follow_megengine(default_device):
    """split(x, n): sizes ceil then floor of size/n — 20 rows in 3 give 7, 7, 6; MegEngine's
    documented 10 rows in 3 give 4, 3, 3; more parts than rows is an error."""
    x = t(np.arange(40.0).reshape(20, 2))
    parts = F.split(x, 3)
    assert [p.shape[0] for p in parts] == [7, 7, 6]
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts]), x.numpy())
    assert [p.shape for p in F.split(t(np.zeros((10, 20))), 3)] == [(4, 20), (3, 20), (3, 20)]
    assert [p.shape for p in F.split(t(np.zeros((10, 20))), [6, 17], axis=1)] == [
        (10, 6), (10, 11), (10, 3)]
    with pytest.raises(ValueError, match="split: axis 0 of size 2 cannot be split into 3 parts"):
        F.split(t(np.zeros(2)), 3)


def test_full_dtype_follows_the_value_and_eye_takes_a_shape(default_device):
    """MegEngine: full's dtype is inferred from the value (bool -> bool, int -> int32, float ->
    float32); eye accepts (N, M) as one shape argument."""
    assert F.full((2, 3), True).dtype == np.bool_ and F.full((2,), True).numpy().all()
    assert F.full((2, 3), 6).dtype == np.int32
    assert F.full((2, 3), 6.0).dtype == np.float32 and mg.full(2, 1.5).dtype == np.float32
    assert F.full((2,), 6, dtype="float64").dtype == np.float64
    np.testing.assert_array_equal(F.eye((2, 4)).numpy(), np.eye(2, 4))
    np.testing.assert_array_equal(F.eye([3]).numpy(), np.eye(3))
    np.testing.assert_array_equal(F.eye(4, 6).numpy(), np.eye(4, 6))


# -- linear algebra --------------------------------------------------------------------------------


def test_einsum_implicit_output(device, rng):
    """Without '->' the output is NumPy's: the letters used once, in alphabetical order."""
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    for spec, ops in [("ij,jk", (a, b)), ("ji", (a,)), ("ij", (a,)), ("ij,ij", (a, a)),
                      ("ba,ac", (a.T, a))]:
        got = F.einsum(spec, *[t(o, device) for o in ops]).numpy()
        np.testing.assert_allclose(got, np.einsum(spec, *ops), rtol=1e-12)
    check_grad(lambda x, y: F.einsum("ij,jk", x, y), a, b, device=device)


def test_cross(device, rng):
    """MegEngine's documented example ([1,2,3] x [4,5,6] = [-3,6,-3]), np.cross for batches and
    axisa/axisb/axisc, 2-vectors read as (x, y, 0), gradients."""
    np.testing.assert_array_equal(F.cross(t([1.0, 2.0, 3.0]), t([4.0, 5.0, 6.0])).numpy(),
                                  [-3.0, 6.0, -3.0])
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3,))
    np.testing.assert_allclose(F.cross(t(a, device), t(b, device)).numpy(), np.cross(a, b))
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((5, 3))
    got = F.cross(t(a, device), t(b, device), axisa=0, axisc=0).numpy()
    np.testing.assert_allclose(got, np.cross(a, b, axisa=0, axisc=0), rtol=1e-12)
    a2, b3 = rng.standard_normal((4, 2)), rng.standard_normal((4, 3))
    want = np.cross(np.concatenate([a2, np.zeros((4, 1))], 1), b3)
    np.testing.assert_allclose(F.cross(t(a2, device), t(b3, device)).numpy(), want, rtol=1e-12)
    check_grad(lambda x, y: F.cross(x, y, axis=0), rng.standard_normal((3, 2)),
               rng.standard_normal((3, 2)), device=device)
    with pytest.raises(ValueError, match="cross: a has 4 components"):
        F.cross(t(np.ones(4)), t(np.ones(3)))


def test_matinv(device, rng, double_grad):
    """MegEngine's documented example and np.linalg.inv on a batch; d(A^-1) = -A^-1 dA A^-1."""
    np.testing.assert_allclose(F.matinv(t([[1.0, 0.0], [1.0, 1.0]])).numpy(), [[1, 0], [-1, 1]])
    a = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    np.testing.assert_allclose(F.matinv(t(a, device)).numpy(), np.linalg.inv(a), rtol=1e-10)
    check_grad(F.matinv, a, device=device)
    double_grad(F.matinv, a[0], device=device)
    with pytest.raises(ValueError, match=r"matinv: expected square matrices .* got shape \(2, 3\)"):
        F.matinv(t(np.ones((2, 3))))


# -- losses and normalisation ------------------------------------------------------------------


def test_hinge_loss(device, rng):
    """MegEngine's documented example: mean 1.5, per-sample [2.1, 0.9], sum 3.0; L2 squares the
    margins."""
    pred = t(np.array([[0.5, -0.5, 0.1], [-0.6, 0.7, 0.8]]), device)
    label = t(np.array([[1.0, -1, -1], [-1, 1, 1]]), device)
    np.testing.assert_allclose(F.nn.hinge_loss(pred, label).numpy(), 1.5)
    np.testing.assert_allclose(F.nn.hinge_loss(pred, label, reduction="none").numpy(), [2.1, 0.9])
    np.testing.assert_allclose(F.nn.hinge_loss(pred, label, reduction="sum").numpy(), 3.0)
    p = rng.standard_normal((4, 5))
    y = np.where(rng.random((4, 5)) > 0.5, 1.0, -1.0)
    want = (np.maximum(0, 1 - p * y) ** 2).sum(1).mean()
    np.testing.assert_allclose(F.hinge_loss(t(p), t(y), norm="L2").numpy(), want, rtol=1e-12)
    check_grad(lambda z: F.hinge_loss(z, t(y, device), norm="L2"), p, device=device)


def _ctc_brute_force(probs, label, blank):
    """-log p(label) by enumerating every frame-level path that collapses to ``label``."""
    steps, classes = probs.shape
    total = 0.0
    for path in itertools.product(range(classes), repeat=steps):
        collapsed = [k for i, k in enumerate(path) if k != blank and (i == 0 or path[i - 1] != k)]
        if collapsed == list(label):
            total += np.prod([probs[i, k] for i, k in enumerate(path)])
    return -np.log(total)


def test_ctc_loss_documented_example(default_device):
    """MegEngine's documented example gives 0.1504417."""
    pred = t(np.array([[[0.0614, 0.9386], [0.8812, 0.1188]], [[0.699, 0.301], [0.2572, 0.7428]]],
                      np.float32))
    loss = F.nn.ctc_loss(pred, t(np.array([2, 2])), t(np.array([1, 1])), t(np.array([1, 1])))
    np.testing.assert_allclose(loss.numpy(), 0.1504417, rtol=1e-6)


def test_ctc_loss_against_path_enumeration(device, rng):
    """Per-sample loss = -log of the total probability of all alignments (enumerated by brute
    force), with per-sample frame counts, repeated symbols (which need a blank between them),
    padded and concatenated labels, a non-zero blank, and the mean over loss/label_length."""
    steps, classes, blank = 5, 3, 2
    logits = rng.standard_normal((steps, 3, classes))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = [[0, 0], [1], [0, 1, 0]]
    p_len, l_len = np.array([5, 3, 5]), np.array([len(lb) for lb in labels])
    padded = np.full((3, 3), 1)
    for i, lb in enumerate(labels):
        padded[i, : len(lb)] = lb
    want = np.array([_ctc_brute_force(probs[: p_len[i], i], lb, blank)
                     for i, lb in enumerate(labels)])
    got = F.ctc_loss(t(probs, device), t(p_len), t(padded), t(l_len), blank=blank, reduction="none")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    flat = t(np.concatenate([np.array(lb) for lb in labels]))
    mean = F.ctc_loss(t(probs, device), t(p_len), flat, t(l_len), blank=blank)
    np.testing.assert_allclose(mean.numpy(), (want / l_len).mean(), rtol=1e-10)
    check_grad(lambda p: F.ctc_loss(p, t(p_len), t(padded), t(l_len), blank=blank, reduction="sum"),
               probs, device=device)


def test_ctc_loss_impossible_label_and_errors():
    """A label longer than the frames allow has infinite loss and a zero (not NaN) gradient; bad
    lengths and blanks are rejected with the op's name."""
    probs = mg.Parameter(np.full((2, 1, 3), 1 / 3))
    gm = mg.GradManager().attach(probs)
    with gm:
        loss = F.ctc_loss(probs, t([2]), t([[1, 1]]), t([2]), reduction="sum")
        gm.backward(loss)
    assert np.isinf(loss.item()) and np.all(probs.grad.numpy() == 0)
    with pytest.raises(ValueError, match=r"ctc_loss: pred_lengths must be in \[1, 2\]"):
        F.ctc_loss(probs, t([3]), t([[1]]), t([1]))
    with pytest.raises(ValueError, match=r"ctc_loss: blank must be in \[0, 3\)"):
        F.ctc_loss(probs, t([2]), t([[1]]), t([1]), blank=3)


def test_instance_norm(device, rng):
    """Every (sample, channel) normalised over its spatial axes with the biased variance, then the
    per-channel affine; MegEngine requires weight and bias when affine."""
    x = rng.standard_normal((2, 3, 4, 5))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    mu = x.mean((2, 3), keepdims=True)
    want = (x - mu) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5) * w[:, None, None] + b[
        :, None, None]
    got = F.nn.instance_norm(t(x, device), True, t(w, device), t(b, device))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    check_grad(lambda a, ww, bb: F.nn.instance_norm(a, True, ww, bb), x, w, b, device=device)
    with pytest.raises(ValueError, match="instance_norm: affine=True needs both weight and bias"):
        F.nn.instance_norm(t(x), True)


# -- sliding windows, local and 3-D convolution ----------------------------------------------------


def _windows_ref(x, kernel, stride, padding, dilation):
    nd = len(kernel)
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
    out = [(n + 2 * p - d * (k - 1) - 1) // s + 1
           for n, k, s, p, d in zip(x.shape[2:], kernel, stride, padding, dilation)]
    res = np.zeros(x.shape[:2] + tuple(out) + tuple(kernel))
    for o in itertools.product(*(range(n) for n in out)):
        for k in itertools.product(*(range(n) for n in kernel)):
            src = tuple(oi * s + ki * d for oi, ki, s, d in zip(o, k, stride, dilation))
            res[(Ellipsis,) + o + k] = xp[(slice(None), slice(None)) + src]
    assert res.ndim == 2 + 2 * nd
    return res


def test_sliding_window_and_its_transpose(device, rng):
    """sliding_window (MegEngine's Images2Neibs): out[n, c, oh, ow, i, j] = padded input at
    (oh*s + i*d, ow*s + j*d); sliding_window_transpose is its adjoint (<unfold x, y> = <x, fold y>).
    """
    x = rng.standard_normal((2, 3, 6, 5))
    args = dict(kernel=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    want = _windows_ref(x, **args)
    got = F.sliding_window(t(x, device), (3, 2), padding=(1, 0), stride=(2, 1), dilation=(1, 2))
    np.testing.assert_array_equal(got.numpy(), want)
    y = rng.standard_normal(want.shape)
    folded = F.sliding_window_transpose(t(y, device), (6, 5), (3, 2), padding=(1, 0),
                                        stride=(2, 1), dilation=(1, 2)).numpy()
    np.testing.assert_allclose((want * y).sum(), (x * folded).sum(), rtol=1e-12)
    check_grad(lambda z: F.sliding_window(z, (3, 2), (1, 0), (2, 1), (1, 2)), x, device=device)
    check_grad(lambda z: F.sliding_window_transpose(z, (6, 5), (3, 2), (1, 0), (2, 1), (1, 2)), y,
               device=device)


def test_conv3d(device, rng):
    """conv3d: cross-correlation of (N, C, D, H, W) with (O, C/g, kd, kh, kw) or the grouped
    (g, O/g, C/g, kd, kh, kw) layout, stride/padding/dilation per axis, bias added per channel."""
    x = rng.standard_normal((2, 4, 4, 5, 3))
    w = rng.standard_normal((6, 2, 2, 3, 2))
    b = rng.standard_normal(6)
    args = dict(kernel=(2, 3, 2), stride=(1, 2, 1), padding=(1, 1, 0), dilation=(2, 1, 1))
    win = _windows_ref(x, **args)  # (N, C, od, oh, ow, kd, kh, kw)
    want = np.zeros((2, 6) + win.shape[2:5])
    for o in range(6):  # output channel o sees input channels of its group g = o // 3
        g = o // 3
        want[:, o] = np.tensordot(win[:, 2 * g : 2 * g + 2], w[o], ([1, 5, 6, 7], [0, 1, 2, 3]))
    want += b[:, None, None, None]
    conv = lambda xx, ww, bb: F.conv3d(xx, ww, bb, stride=(1, 2, 1), padding=(1, 1, 0),  # noqa: E731
                                       dilation=(2, 1, 1), groups=2)
    np.testing.assert_allclose(conv(t(x, device), t(w, device), t(b, device)).numpy(), want,
                               rtol=1e-10)
    grouped = t(w.reshape(2, 3, 2, 2, 3, 2), device)
    np.testing.assert_allclose(conv(t(x, device), grouped, t(b, device)).numpy(), want, rtol=1e-10)
    check_grad(conv, x[:1, :, :3, :4], w, b, device=device)
    with pytest.raises(ValueError, match=r"conv3d: input has 4 channels .* expects 6"):
        F.conv3d(t(x), t(rng.standard_normal((2, 3, 1, 1, 1))), groups=2)


def test_local_conv2d(device, rng):
    """local_conv2d: an untied kernel per output position, weight (OH, OW, IC, kh, kw, OC) or
    grouped (G, OH, OW, IC/G, kh, kw, OC/G): out[n, o, y, x] = sum window * weight[y, x, ..., o]."""
    x = rng.standard_normal((2, 4, 5, 4))
    w = rng.standard_normal((2, 3, 2, 2, 3, 2, 3))  # G=2, OH=3, OW=2, IC/G=2, 3x2 kernel, OC/G=3
    win = _windows_ref(x, (3, 2), (1, 2), (0, 0), (1, 1))  # (N, C, 3, 2, 3, 2)
    want = np.zeros((2, 6, 3, 2))
    for g, o, yy, xx in itertools.product(range(2), range(3), range(3), range(2)):
        patch = win[:, 2 * g : 2 * g + 2, yy, xx]  # (N, IC/G, kh, kw)
        want[:, 3 * g + o, yy, xx] = (patch * w[g, yy, xx, :, :, :, o]).sum((1, 2, 3))
    got = F.local_conv2d(t(x, device), t(w, device), stride=(1, 2))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    check_grad(lambda a, b: F.local_conv2d(a, b, stride=(1, 2)), x, w, device=device)
    w1 = rng.standard_normal((3, 2, 4, 3, 2, 5))  # no groups
    win1 = _windows_ref(x, (3, 2), (1, 2), (0, 0), (1, 1))
    np.testing.assert_allclose(F.local_conv2d(t(x), t(w1), stride=(1, 2)).numpy(),
                               np.einsum("niyxhw,yxihwo->noyx", win1, w1), rtol=1e-10)
    with pytest.raises(ValueError, match=r"local_conv2d: weight is for a \(3, 2\) output"):
        F.local_conv2d(t(x), t(w1))
