"""Every function of ``minigrad/backend/kernels/gpu.py`` computes what its CPU twin computes, with
its CUDA C running on the CPU (``tests/fakes/cuda_on_cpu.py``: g++ and an emulation of CUDA's
threads, barriers and warp shuffles) on the fake CuPy's arrays.

This is the check a CPU can make of the GPU kernels' arithmetic and of ``gpu.py``'s launch code
(shapes, strides, grid and block sizes, argument types): without it the CUDA C is only compiled.
Each function's results are compared with ``minigrad.backend.kernels.cpu``'s on the same inputs
(float64 to 1e-12, float32 to a few units in the last place: the kernels' formulas are the CPU
loops', their order of summation is not). Skipped where g++ is missing.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fakes import cuda_on_cpu, fake_cupy

from minigrad.backend.kernels import cpu

pytestmark = pytest.mark.skipif(cuda_on_cpu.CXX is None, reason="needs g++")

DTYPES = ("float32", "float64")
RTOL = {"float32": 2e-6, "float64": 1e-12}
ATOL = {"float32": 1e-6, "float64": 1e-13}  # for values that cancel to near zero


@pytest.fixture(scope="module")
def gpu():
    """``gpu.py`` loaded on the fake CuPy whose kernels run their CUDA C on the CPU."""
    with fake_cupy.installed(1) as fake:
        module = cuda_on_cpu.load_gpu_module(fake)
        module.fake = fake
        yield module


def _dev(gpu, a):
    return gpu.fake.asarray(a)


def _host(gpu, x):
    return x if x is None or isinstance(x, np.ndarray) else gpu.fake.asnumpy(x)


def _close(got, want, dtype, scale=0.0):
    """Equal to rounding: relative error RTOL, or absolute ATOL x ``scale`` where a result
    cancels to near zero (``scale``: the size of the terms it is computed from)."""
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=RTOL[dtype], atol=ATOL[dtype] * scale, equal_nan=True)


def _rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_and_its_gradient(gpu, dtype):
    x = _rand((5, 7), dtype)
    x[0, :3] = [0.0, -0.0, np.nan]
    y, mask = gpu.relu(_dev(gpu, x))
    want_y, want_mask = cpu.relu(x)
    np.testing.assert_array_equal(_host(gpu, y), want_y)
    np.testing.assert_array_equal(_host(gpu, mask), want_mask)
    dy = _rand(x.shape, dtype, 1)
    dx = gpu.relu_grad(_dev(gpu, dy), mask)
    np.testing.assert_array_equal(_host(gpu, dx), cpu.relu_grad(dy, want_mask))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_its_gradient(gpu, dtype):
    x, dy = _rand((4, 33), dtype) * 3, _rand((4, 33), dtype, 1)
    y, slope = gpu.gelu(_dev(gpu, x))
    want_y, want_slope = cpu.gelu(x)
    _close(_host(gpu, y), want_y, dtype, 1)
    _close(_host(gpu, slope), want_slope, dtype, 1)
    dx = gpu.gelu_grad(slope, _dev(gpu, dy))
    _close(_host(gpu, dx), cpu.gelu_grad(want_slope, dy), dtype, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [1, 40, 300])  # one warp; three warps, the last partly idle
def test_row_softmaxes_and_their_gradients(gpu, dtype, name, n):
    x, dy = _rand((6, n), dtype) * 4, _rand((6, n), dtype, 1)
    y = getattr(gpu, name)(_dev(gpu, x))
    want = getattr(cpu, name)(x)
    _close(_host(gpu, y), want, dtype, 1)
    dx = getattr(gpu, name + "_grad")(y, _dev(gpu, dy))
    _close(_host(gpu, dx), getattr(cpu, name + "_grad")(want, dy), dtype, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_groups", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length, src", [(5, 7), (9, 150)])
def test_attention_softmax_and_its_gradient(gpu, dtype, bias_groups, causal, length, src):
    groups = 3
    scores = _rand((groups, length, src), dtype)
    bias = None if not bias_groups else _rand((bias_groups, length, src), dtype, 2)
    want = scores.copy()
    cpu.attention_softmax(want, 0.5, bias, causal)
    got = _dev(gpu, scores)
    gpu.attention_softmax(got, 0.5, None if bias is None else _dev(gpu, bias), causal)
    _close(_host(gpu, got), want, dtype, 1)
    dw = _rand(scores.shape, dtype, 3)
    want_dw = dw.copy()
    cpu.attention_softmax_grad(want, want_dw, 0.5)
    got_dw = _dev(gpu, dw)
    gpu.attention_softmax_grad(got, got_dw, 0.5)
    _close(_host(gpu, got_dw), want_dw, dtype, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 33, 200])  # one partial warp; several warps with a partial one
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("rows", [4, 19])  # fewer rows than the column sums' 8 row strides; more
def test_layer_norm_and_its_gradient(gpu, dtype, n, affine, rows):
    x, dy = _rand((rows, n), dtype) * 2 + 1, _rand((rows, n), dtype, 1)
    w = _rand(n, dtype, 2) if affine else None
    b = _rand(n, dtype, 3) if affine else None
    y, xhat, rstd = gpu.layer_norm(_dev(gpu, x), *(None if p is None else _dev(gpu, p)
                                                    for p in (w, b)), 1e-5)
    want = cpu.layer_norm(x, w, b, 1e-5)
    for got, ref in zip((y, xhat, rstd), want):
        _close(_host(gpu, got), ref, dtype, 10)
    grads = gpu.layer_norm_grad(_dev(gpu, dy), xhat, rstd, None if w is None else _dev(gpu, w))
    for got, ref in zip(grads, cpu.layer_norm_grad(dy, *want[1:], w)):
        _close(_host(gpu, got), ref, dtype, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", [((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 0)),
                                      ((3, 3), (2, 1), (1, 1))])  # overlapping windows
def test_max_pool_and_its_gradient(gpu, dtype, geometry):
    kernel, stride, padding = geometry
    x = _rand((2, 3, 7, 6), dtype)
    out_hw = tuple((s + 2 * p - k) // st + 1
                   for s, k, st, p in zip(x.shape[2:], kernel, stride, padding))
    out, argmax = gpu.max_pool2d(_dev(gpu, x), kernel, stride, padding, out_hw)
    want_out, want_arg = cpu.max_pool2d(x, kernel, stride, padding, out_hw)
    np.testing.assert_array_equal(_host(gpu, out), want_out)
    np.testing.assert_array_equal(_host(gpu, argmax), want_arg)
    dy = _rand(want_out.shape, dtype, 1)
    dx = gpu.max_pool2d_grad(_dev(gpu, dy), argmax, x.shape, kernel, stride, padding)
    np.testing.assert_array_equal(  # the same sums in the same order
        _host(gpu, dx), cpu.max_pool2d_grad(dy, want_arg, x.shape, kernel, stride, padding))


@pytest.mark.parametrize("dtype", DTYPES)
def test_im2col_and_col2im(gpu, dtype):
    x = _rand((2, 3, 6, 5), dtype)
    kernel, stride, padding, dilation = (3, 2), (2, 1), (1, 1), (1, 2)
    out_hw = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                   for s, k, st, p, d in zip(x.shape[2:], kernel, stride, padding, dilation))
    cols = gpu.im2col(_dev(gpu, x), kernel, stride, padding, dilation, out_hw)
    want = cpu.im2col(x, kernel, stride, padding, dilation, out_hw)
    np.testing.assert_array_equal(_host(gpu, cols), want)
    back = gpu.col2im(cols, x.shape, kernel, stride, padding, dilation, out_hw)
    _close(_host(gpu, back), cpu.col2im(want, x.shape, kernel, stride, padding, dilation, out_hw),
           dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_product_layouts(gpu, dtype):
    mat, bias = _rand((4, 3, 5), dtype), _rand(4, dtype, 1)
    got = gpu.from_product_layout(_dev(gpu, mat), _dev(gpu, bias))
    np.testing.assert_array_equal(_host(gpu, got), cpu.from_product_layout(mat, bias))
    dy = _rand((3, 4, 5), dtype, 2)
    got_mat, got_bias = gpu.to_product_layout(_dev(gpu, dy))
    want_mat, want_bias = cpu.to_product_layout(dy)
    np.testing.assert_array_equal(_host(gpu, got_mat), want_mat)
    _close(_host(gpu, got_bias), want_bias, dtype, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum, weight_decay, nesterov",
                         [(0.0, 0.0, False), (0.0, 0.1, False), (0.9, 0.0, False),
                          (0.9, 1e-2, True)])
def test_sgd_step(gpu, dtype, momentum, weight_decay, nesterov):
    p, g = _rand((3, 11), dtype), _rand((3, 11), dtype, 1)
    buf = _rand((3, 11), dtype, 2) if momentum else None
    want_p, want_buf = p.copy(), None if buf is None else buf.copy()
    cpu.sgd_step(want_p, g, want_buf, 0.1, momentum, weight_decay, nesterov)
    got_p, got_buf = _dev(gpu, p), None if buf is None else _dev(gpu, buf)
    gpu.sgd_step(got_p, _dev(gpu, g), got_buf, 0.1, momentum, weight_decay, nesterov)
    _close(_host(gpu, got_p), want_p, dtype)
    if buf is not None:
        _close(_host(gpu, got_buf), want_buf, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
def test_adam_step(gpu, dtype, weight_decay, decoupled):
    p, g = _rand((2, 9), dtype), _rand((2, 9), dtype, 1)
    m, v = _rand((2, 9), dtype, 2), np.abs(_rand((2, 9), dtype, 3))
    want = [a.copy() for a in (p, m, v)]
    cpu.adam_step(*want[:1], g, *want[1:], 1e-3, 0.9, 0.999, 1e-8, weight_decay, decoupled, 3)
    got = [_dev(gpu, a) for a in (p, m, v)]
    gpu.adam_step(got[0], _dev(gpu, g), *got[1:], 1e-3, 0.9, 0.999, 1e-8, weight_decay,
                  decoupled, 3)
    for a, ref in zip(got, want):
        _close(_host(gpu, a), ref, dtype)


def test_a_wrong_launch_is_caught(gpu):
    """The emulation refuses what a GPU would misread: a Python int for a ``long long`` parameter
    and an array whose items are not the size its pointer parameter reads."""
    forward = gpu._row_kernels("float32")["layer_norm_forward"]
    x = _dev(gpu, np.ones((2, 4), np.float32))
    args = [x, x, x, np.int32(0), np.int32(0), np.float32(1e-5), np.int64(4), x, x,
            _dev(gpu, np.ones(2, np.float32))]
    bad_scalar = args[:6] + [4] + args[7:]
    with pytest.raises(TypeError, match="argument 6 must be a NumPy scalar of 8 bytes"):
        forward((2,), (32,), bad_scalar)
    bad_array = [_dev(gpu, np.ones((2, 4)))] + args[1:]
    with pytest.raises(TypeError, match="argument 0 is a float64 array"):
        forward((2,), (32,), bad_array)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label_dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_rows_and_their_gradient(gpu, dtype, label_dtype, reduction):
    x = _rand((7, 45), dtype) * 3
    label = np.random.default_rng(4).integers(0, 45, 7).astype(label_dtype)
    nll, prob = gpu.cross_entropy_rows(_dev(gpu, x), _dev(gpu, label))
    want_nll, want_prob = cpu.cross_entropy_rows(x, label)
    _close(_host(gpu, nll), want_nll, dtype, 1)
    _close(_host(gpu, prob), want_prob, dtype, 1)
    dy = _rand(7, dtype, 5) if reduction == "none" else np.asarray(1.5, dtype)
    divisor = 7 if reduction == "mean" else 1
    got = gpu.cross_entropy_rows_grad(prob, _dev(gpu, label), _dev(gpu, dy), divisor)
    want = cpu.cross_entropy_rows_grad(want_prob, label, dy, divisor)
    _close(_host(gpu, got), want, dtype, 1)


def test_cross_entropy_of_a_label_out_of_range_is_nan(gpu):
    """The kernel reads no logit outside the row for a bad label (the caller raises for it)."""
    x = _dev(gpu, _rand((2, 4), "float32"))
    nll, _ = gpu.cross_entropy_rows(x, _dev(gpu, np.array([1, 4], np.int32)))
    got = _host(gpu, nll)
    assert np.isfinite(got[0]) and np.isnan(got[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 1), (19, 33), (300, 70), (0, 5), (3, 0)])
def test_column_sums(gpu, dtype, shape):
    # fewer rows than the 8 row strides, more; one column, a partial block of 32; no rows/columns
    a = _rand(shape, dtype) * 3
    got = gpu.column_sums(_dev(gpu, a))
    assert got.shape == (shape[1],) and got.dtype == np.dtype(dtype)
    _close(_host(gpu, got), cpu.column_sums(a), dtype, 10)


def test_column_sums_hand_the_rest_to_the_reduction(gpu, monkeypatch):
    # float16, a transposed view and too many rows take CuPy's reduction (the CPU twin)
    monkeypatch.setattr(gpu, "COLUMN_SUM_MAX_ROWS", 16)
    for a in (_rand((5, 3), "float16"), _rand((3, 5), "float32").T, _rand((17, 3), "float32")):
        gpu.fake.events.clear()
        got = gpu.column_sums(_dev(gpu, a))
        np.testing.assert_allclose(_host(gpu, got), a.sum(axis=0), rtol=1e-3)
        assert not [e for e in gpu.fake.events if "column_sums" in e], gpu.fake.events
    gpu.fake.events.clear()
    gpu.column_sums(_dev(gpu, _rand((16, 3), "float32")))
    assert [e for e in gpu.fake.events if "column_sums" in e]  # the one case that takes it


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("size", [1, 37, 5000])  # one thread; some warps; many values a thread
def test_min_max(gpu, dtype, size):
    a = np.random.default_rng(6).integers(0, 200, size).astype(dtype)
    if dtype != "uint8":
        a[size // 2] = -7
    lo, hi = gpu.min_max(_dev(gpu, a))
    assert (int(_host(gpu, lo)), int(_host(gpu, hi))) == (int(a.min()), int(a.max()))


def _parameter_lists(dtype, count, seed=7):
    """``count`` parameters of assorted sizes (one over a block of 256 threads, one empty), the
    last of another dtype and the one before it not contiguous: both take their own kernel."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 40)) for _ in range(count)]
    sizes[1], sizes[2] = 300, 0
    arrays = [rng.standard_normal((4, n)).astype(dtype) for n in sizes]
    other = "float64" if dtype == "float32" else "float32"
    arrays[-1] = arrays[-1].astype(other)
    return arrays


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum, weight_decay, nesterov",
                         [(0.0, 0.0, False), (0.9, 1e-2, False), (0.9, 0.0, True)])
def test_sgd_steps_of_many_parameters(gpu, dtype, momentum, weight_decay, nesterov):
    count = gpu.LIST_SLOTS + 5  # two launches
    ps = _parameter_lists(dtype, count)
    gs = [np.random.default_rng(k).standard_normal(p.shape).astype(p.dtype)
          for k, p in enumerate(ps)]
    bufs = [np.ones_like(p) * 0.5 for p in ps] if momentum else [None] * count
    want_p, want_b = [p.copy() for p in ps], [None if b is None else b.copy() for b in bufs]
    cpu.sgd_steps(want_p, gs, want_b, 0.1, momentum, weight_decay, nesterov)
    got_p = [_dev(gpu, p) for p in ps]
    got_p[-2] = _dev(gpu, np.asfortranarray(ps[-2]))  # not C-contiguous
    got_b = [None if b is None else _dev(gpu, b) for b in bufs]
    gpu.sgd_steps(got_p, [_dev(gpu, g) for g in gs], got_b, 0.1, momentum, weight_decay,
                  nesterov)
    for k in range(count):
        _close(_host(gpu, got_p[k]), want_p[k], str(ps[k].dtype))
        if momentum:
            _close(_host(gpu, got_b[k]), want_b[k], str(ps[k].dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_decay, decoupled", [(0.0, False), (0.1, False), (0.1, True)])
def test_adam_steps_of_many_parameters(gpu, dtype, weight_decay, decoupled):
    count = gpu.LIST_SLOTS + 3
    ps = _parameter_lists(dtype, count)
    gs = [np.random.default_rng(k).standard_normal(p.shape).astype(p.dtype)
          for k, p in enumerate(ps)]
    ms = [np.full_like(p, 0.1) for p in ps]
    vs = [np.full_like(p, 0.2) for p in ps]
    steps = [1 + k % 4 for k in range(count)]  # parameters may have taken different steps
    want = [[a.copy() for a in arrays] for arrays in (ps, ms, vs)]
    cpu.adam_steps(want[0], gs, want[1], want[2], 1e-3, 0.9, 0.999, 1e-8, weight_decay,
                   decoupled, steps)
    got = [[_dev(gpu, a) for a in arrays] for arrays in (ps, ms, vs)]
    gpu.adam_steps(got[0], [_dev(gpu, g) for g in gs], got[1], got[2], 1e-3, 0.9, 0.999, 1e-8,
                   weight_decay, decoupled, steps)
    for got_arrays, want_arrays in zip(got, want):
        for k in range(count):
            _close(_host(gpu, got_arrays[k]), want_arrays[k], str(ps[k].dtype))


def _training_step(model: str, device: str) -> tuple:
    """Two SGD-with-momentum steps of a small model in float64 on ``device``: the loss and the
    parameters after them, and the kernel launches of the second step (on a GPU)."""
    import minigrad as mg
    import minigrad.functional as F

    rng = np.random.default_rng(0)

    def param(*shape):
        return mg.Parameter(rng.standard_normal(shape) * 0.3, device=device)

    if model == "mlp":
        p = {"w1": param(16, 12), "b1": param(16), "w2": param(5, 16), "b2": param(5)}
        x = mg.tensor(rng.standard_normal((8, 12)), device=device)
        y = mg.tensor(rng.integers(0, 5, 8).astype(np.int32), device=device)

        def loss_of():
            h = F.relu(F.linear(x, p["w1"], p["b1"]))
            return F.cross_entropy(F.linear(h, p["w2"], p["b2"]), y)
    else:
        d, heads = 8, 2
        p = {"w_qkv": param(3 * d, d), "b_qkv": param(3 * d), "w_o": param(d, d),
             "b_o": param(d), "g": param(d), "b": param(d), "w1": param(16, d), "b1": param(16)}
        x = mg.tensor(rng.standard_normal((2, 5, d)), device=device)
        y = mg.tensor(rng.standard_normal((2, 5, 16)), device=device)

        def loss_of():
            h = F.layer_norm(x, d, True, p["g"], p["b"])
            h = x + F.multi_head_attention(h, h, h, heads, p["w_qkv"], p["b_qkv"], p["w_o"],
                                           p["b_o"], is_causal=True)
            return F.square_loss(F.gelu(F.linear(h, p["w1"], p["b1"])), y)

    gm = mg.autodiff.GradManager().attach(list(p.values()))
    opt = mg.optimizer.SGD(list(p.values()), lr=0.1, momentum=0.9)
    fake = None if device == "cpu0" else sys.modules["cupy"]
    for step in range(2):
        if fake is not None and step == 1:
            fake.clear()
        with gm:
            loss = loss_of()
            gm.backward(loss)
        opt.step().clear_grad()
    launches = [] if fake is None else [e for e in fake.events if e.startswith("launch ")]
    return float(loss.numpy()), {k: v.numpy() for k, v in p.items()}, launches


@pytest.mark.parametrize("model, launches", [("mlp", 17), ("transformer", 41)])
def test_a_training_step_with_the_gpu_kernels(gpu, model, launches):
    """A whole training step with every minigrad kernel running gpu.py's CUDA C: the same loss
    and parameters as on the CPU, and the kernel launches a GPU step makes (each costs the host
    microseconds), counted without the calls that launch nothing on a GPU (views, allocations,
    ascontiguousarray of an array that already is)."""
    want_loss, want, _ = _training_step(model, "cpu0")
    with cuda_on_cpu.gpu_kernels_counted(gpu.fake, gpu):
        loss, got, events = _training_step(model, "gpu0")
    assert abs(loss - want_loss) <= 1e-12 * abs(want_loss)
    for name in want:
        _close(got[name], want[name], "float64", 1)
    names = [e.split(" on ")[0].removeprefix("launch ") for e in events]
    real = sorted(n for n in names if n not in cuda_on_cpu.NO_LAUNCH)
    assert len(real) == launches, ", ".join(real)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [None, 1 / 35])
@pytest.mark.parametrize("shape", [(5, 7), (3, 40, 30)])  # under and over one element a thread
def test_squared_error_and_its_gradient(gpu, dtype, scale, shape):
    pred, label = _rand(shape, dtype), _rand(shape, dtype, 1)
    total, diff = gpu.squared_error_sum(_dev(gpu, pred), _dev(gpu, label), scale)
    want_total, want_diff = cpu.squared_error_sum(pred, label, scale)
    assert diff is None  # the backward recomputes it
    _close(_host(gpu, total), want_total, dtype)
    dy = np.asarray(0.7, dtype)
    got = gpu.squared_error_grad(_dev(gpu, pred), _dev(gpu, label), None, _dev(gpu, dy), scale)
    _close(_host(gpu, got), cpu.squared_error_grad(pred, label, want_diff, dy, scale), dtype, 1)


def test_unscale_grads_flags_each_gradient_that_overflowed(gpu):
    """More gradients than one launch takes (LIST_SLOTS), of three dtypes (float16 takes the
    composed path, float64 its own lists after float32's), one non-contiguous; infs and NaNs in
    some: the unscaled copies and the flags equal the CPU's, and the inputs are left alone."""
    rng = np.random.default_rng(0)
    grads = []
    for k in range(gpu.LIST_SLOTS + 5):
        dtype = ("float32", "float64", "float16")[k % 3]
        g = (rng.standard_normal((3, 7)) * 1e3).astype(dtype)
        if k in (1, 6, gpu.LIST_SLOTS + 3):
            g[1, 2] = (np.inf, np.nan, -np.inf)[k % 3]
        grads.append(g.T if k == 4 else g)
    want, want_bad = cpu.unscale_grads([g.copy() for g in grads], 2.0**-10)
    got, got_bad = gpu.unscale_grads([_dev(gpu, g) for g in grads], 2.0**-10)
    assert _host(gpu, got_bad).tolist() == want_bad.tolist()
    assert want_bad.tolist() == [int(k in (1, 6, gpu.LIST_SLOTS + 3)) for k in range(len(grads))]
    for g, a, b in zip(grads, got, want):
        assert a.dtype == b.dtype == g.dtype and a.shape == b.shape
        np.testing.assert_array_equal(_host(gpu, a), b)  # one rounding of one product: exact
