"""Convolution and pooling against explicit-loop NumPy float64 references, plus gradient checks."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_references import ref_conv2d, ref_conv_transpose2d, ref_pool

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def _t(a, device, dtype="float64"):
    return mg.tensor(a, dtype=dtype, device=device)


# --------------------------------------------------------------------------------------------------
# conv2d

CONV_CASES = [  # (n, c, h, w, o, kh, kw, stride, pad, dil, groups)
    (2, 3, 6, 5, 4, 3, 3, (1, 1), (0, 0), (1, 1), 1),
    (2, 4, 7, 6, 6, 3, 2, (2, 1), (1, 2), (1, 1), 2),
    (1, 2, 8, 8, 2, 3, 3, (1, 2), (2, 1), (2, 1), 1),
    (3, 6, 5, 5, 3, 1, 1, (1, 1), (0, 0), (1, 1), 3),
    (1, 4, 9, 7, 8, 2, 3, (3, 2), (1, 1), (1, 2), 4),
    (1, 1, 4, 4, 1, 4, 4, (1, 1), (0, 0), (1, 1), 1),  # kernel covers the image: 1x1 output
]


def _conv_inputs(case, rng):
    """Input, weight and bias of a CONV_CASES entry, plus its stride, padding, dilation, groups."""
    n, c, h, w, o, kh, kw, s, p, d, g = case
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((o, c // g, kh, kw))
    return x, wt, rng.standard_normal(o), (s, p, d, g)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward_matches_loops(case, device, rng):
    x, wt, b, (s, p, d, g) = _conv_inputs(case, rng)
    o = wt.shape[0]
    got = F.conv2d(_t(x, device), _t(wt, device), _t(b.reshape(1, o, 1, 1), device), s, p, d, g)
    ref = ref_conv2d(x, wt, b, s, p, d, g)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_grad(case, device, rng):
    x, wt, b, (s, p, d, g) = _conv_inputs(case, rng)
    check_grad(lambda x, wt, b: F.conv2d(x, wt, b, s, p, d, g), x, wt, b, device=device)


def test_conv2d_float32_and_noncontiguous_input(device, rng):
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    xt = F.transpose(mg.tensor(x, device=device), (0, 1, 3, 2))  # a strided view (2, 3, 7, 5)
    got = F.conv2d(xt, mg.tensor(wt, device=device), padding=1)
    assert got.dtype == np.float32
    ref = ref_conv2d(x.transpose(0, 1, 3, 2).astype(np.float64), wt.astype(np.float64), pad=(1, 1))
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
    check_grad(lambda x, w: F.conv2d(F.transpose(x, (0, 1, 3, 2)), w, stride=2, padding=1),
               x, wt, device=device)


def test_conv2d_grouped_5d_weight_equals_4d(device, rng):
    x = rng.standard_normal((2, 4, 5, 5))
    w5 = rng.standard_normal((2, 3, 2, 3, 3))  # (groups, out/g, in/g, kh, kw)
    a = F.conv2d(_t(x, device), _t(w5, device), groups=2).numpy()
    np.testing.assert_allclose(a, ref_conv2d(x, w5.reshape(6, 2, 3, 3), groups=2), rtol=1e-10)


def test_conv2d_bias_as_vector_and_size1_dims(device, rng):
    x = rng.standard_normal((1, 1, 1, 5))
    wt = rng.standard_normal((2, 1, 1, 3))
    b = rng.standard_normal(2)
    got = F.conv2d(_t(x, device), _t(wt, device), _t(b, device)).numpy()
    np.testing.assert_allclose(got, ref_conv2d(x, wt, b), rtol=1e-10)
    check_grad(lambda x, w, b: F.conv2d(x, w, b), x, wt, b, device=device)


def test_conv2d_input_without_grad_skips_but_weight_grad_is_right(device, rng):
    x = rng.standard_normal((2, 2, 5, 5))
    wt = rng.standard_normal((3, 2, 3, 3))
    check_grad(lambda x, w: F.conv2d(x, w, padding=1), x, wt, device=device, wrt=[1])
    check_grad(lambda x, w: F.conv2d(x, w, padding=1), x, wt, device=device, wrt=[0])


def test_conv1d(device, rng):
    x = rng.standard_normal((2, 4, 9))
    wt = rng.standard_normal((6, 2, 3))
    b = rng.standard_normal(6)
    got = F.conv1d(_t(x, device), _t(wt, device), _t(b.reshape(1, 6, 1), device), stride=2,
                   padding=1, dilation=2, groups=2).numpy()
    ref = ref_conv2d(x[:, :, None], wt[:, :, None], b, (1, 2), (0, 1), (1, 2), 2)[:, :, 0]
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    check_grad(lambda x, w, b: F.conv1d(x, w, b, 2, 1, 2, 2), x, wt, b, device=device)


def test_conv_errors_name_op_and_shapes(device, rng):
    x = _t(rng.standard_normal((1, 3, 5, 5)), device)
    w = _t(rng.standard_normal((4, 2, 3, 3)), device)
    with pytest.raises(ValueError, match=r"conv2d.*\(1, 3, 5, 5\).*\(4, 2, 3, 3\)"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="conv2d: expected a 4-D input"):
        F.conv2d(_t(np.zeros((3, 5, 5)), device), w)
    with pytest.raises(ValueError, match="too small"):
        F.conv2d(x, _t(np.zeros((1, 3, 7, 7)), device))
    with pytest.raises(ValueError, match="groups=2"):
        F.conv2d(x, _t(np.zeros((4, 1, 3, 3)), device), groups=2)
    with pytest.raises(ValueError, match="bias shape"):
        F.conv2d(x, _t(np.zeros((4, 3, 3, 3)), device), _t(np.zeros(5), device))
    with pytest.raises(ValueError, match="conv1d.*channels"):
        F.conv1d(_t(np.zeros((1, 3, 5)), device), _t(np.zeros((2, 2, 3)), device))
    with pytest.raises(ValueError, match="conv_transpose2d.*channels"):
        F.conv_transpose2d(x, _t(np.zeros((2, 2, 3, 3)), device))


# --------------------------------------------------------------------------------------------------
# conv_transpose2d

TRANSPOSE_CASES = [  # (n, cin, h, w, cout, k, stride, pad, out_pad, dil, groups)
    (2, 3, 4, 3, 2, (3, 3), (1, 1), (0, 0), (0, 0), (1, 1), 1),
    (1, 4, 3, 4, 6, (3, 2), (2, 2), (1, 0), (1, 1), (1, 1), 2),
    (2, 2, 3, 3, 3, (2, 3), (3, 1), (0, 1), (2, 0), (1, 2), 1),
]


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_conv_transpose2d_forward_and_grad(case, device, rng):
    n, cin, h, w, cout, k, s, p, op, d, g = case
    x = rng.standard_normal((n, cin, h, w))
    wt = rng.standard_normal((cin, cout // g, *k))
    b = rng.standard_normal(cout)
    got = F.conv_transpose2d(_t(x, device), _t(wt, device), _t(b, device), s, p, op, d, g)
    ref = ref_conv_transpose2d(x, wt, s, p, op, d, g) + b.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-10)
    check_grad(lambda x, w, b: F.conv_transpose2d(x, w, b, s, p, op, d, g), x, wt, b,
               device=device)


def test_conv_transpose2d_is_adjoint_of_conv2d(device, rng):
    # <conv2d(x, w), y> == <x, conv_transpose2d(y, w)> for matching geometry
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((6, 2, 3, 3))
    y = rng.standard_normal((2, 6, 4, 3))
    lhs = (F.conv2d(_t(x, device), _t(w, device), stride=2, padding=1, groups=2).numpy() * y).sum()
    back = F.conv_transpose2d(_t(y, device), _t(w, device), stride=2, padding=1,
                              output_padding=(0, 1), groups=2).numpy()
    assert back.shape == x.shape
    np.testing.assert_allclose(lhs, (x * back).sum(), rtol=1e-10)


# --------------------------------------------------------------------------------------------------
# pooling

POOL_CASES = [  # (shape, kernel, stride, padding)
    ((2, 3, 6, 6), (2, 2), None, (0, 0)),
    ((1, 2, 7, 8), (3, 3), (2, 2), (1, 1)),
    ((2, 1, 5, 7), (3, 2), (1, 2), (1, 0)),
    ((1, 2, 4, 4), (4, 4), None, (0, 0)),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d(case, device, rng):
    shape, k, s, p = case
    x = rng.standard_normal(shape)
    got = F.max_pool2d(_t(x, device), k, s, p).numpy()
    np.testing.assert_array_equal(got, ref_pool(x, k, s or k, p, "max"))
    check_grad(lambda x: F.max_pool2d(x, k, s, p), x, device=device)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("mode", ["average", "average_count_exclude_padding"])
def test_avg_pool2d(case, mode, device, rng):
    shape, k, s, p = case
    x = rng.standard_normal(shape)
    got = F.avg_pool2d(_t(x, device), k, s, p, mode=mode).numpy()
    ref = ref_pool(x, k, s or k, p, "avg", include_pad=(mode == "average"))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    check_grad(lambda x: F.avg_pool2d(x, k, s, p, mode=mode), x, device=device)


def test_max_pool2d_ties_send_gradient_to_first_maximum(device):
    x = _t(np.ones((1, 1, 2, 2)), device)
    gm = mg.GradManager().attach(x)
    with gm:
        gm.backward(F.max_pool2d(x, 2).sum())
    np.testing.assert_array_equal(x.grad.numpy(), [[[[1.0, 0.0], [0.0, 0.0]]]])


def test_pool_noncontiguous_float32(device, rng):
    x = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    xt = F.transpose(mg.tensor(x, device=device), (0, 1, 3, 2))
    got = F.max_pool2d(xt, 2)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), ref_pool(x.transpose(0, 1, 3, 2), (2, 2), (2, 2),
                                                      (0, 0), "max"), rtol=1e-6)


@pytest.mark.parametrize("shape,oshp", [((2, 3, 7, 5), (3, 2)), ((1, 2, 6, 6), 3),
                                        ((1, 1, 5, 4), (5, 4)), ((2, 2, 4, 5), 1)])
def test_adaptive_avg_pool2d(shape, oshp, device, rng):
    x = rng.standard_normal(shape)
    oh, ow = (oshp, oshp) if isinstance(oshp, int) else oshp
    h, w = shape[2:]
    ref = np.zeros(shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
            c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            ref[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    np.testing.assert_allclose(F.adaptive_avg_pool2d(_t(x, device), oshp).numpy(), ref,
                               rtol=1e-12)
    check_grad(lambda x: F.adaptive_avg_pool2d(x, oshp), x, device=device)


def test_pool_errors(device):
    x = _t(np.zeros((1, 1, 3, 3)), device)
    with pytest.raises(ValueError, match="max_pool2d.*too small"):
        F.max_pool2d(x, 4)
    with pytest.raises(ValueError, match="avg_pool2d: mode"):
        F.avg_pool2d(x, 2, mode="bogus")
    with pytest.raises(ValueError, match="max_pool2d: expected a 4-D input"):
        F.max_pool2d(_t(np.zeros((3, 3)), device), 2)


# --------------------------------------------------------------------------------------------------
# optional cross-check against PyTorch (never the only reference)


def test_against_torch(rng, device):
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 2, 3, 3))
    np.testing.assert_allclose(
        F.conv2d(_t(x, device), _t(w, device), stride=2, padding=1, dilation=2, groups=2).numpy(),
        tf.conv2d(torch.tensor(x), torch.tensor(w), stride=2, padding=1, dilation=2,
                  groups=2).numpy(), rtol=1e-10, atol=1e-12)
    wt = rng.standard_normal((4, 3, 3, 2))
    np.testing.assert_allclose(
        F.conv_transpose2d(_t(x, device), _t(wt, device), stride=2, padding=1,
                           output_padding=1, groups=2).numpy(),
        tf.conv_transpose2d(torch.tensor(x), torch.tensor(wt), stride=2, padding=1,
                            output_padding=1, groups=2).numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(F.max_pool2d(_t(x, device), 3, 2, 1).numpy(),
                               tf.max_pool2d(torch.tensor(x), 3, 2, 1).numpy())
    np.testing.assert_allclose(F.avg_pool2d(_t(x, device), 3, 2, 1, mode="average").numpy(),
                               tf.avg_pool2d(torch.tensor(x), 3, 2, 1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(F.adaptive_avg_pool2d(_t(x, device), (4, 3)).numpy(),
                               tf.adaptive_avg_pool2d(torch.tensor(x), (4, 3)).numpy(), rtol=1e-12)


def test_compute_mode_float32_and_unsupported_modes(rng):
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    b = rng.standard_normal((4,)).astype(np.float16)
    xt, wt, bt = mg.tensor(x), mg.tensor(w), mg.tensor(b)
    wide = F.conv2d(xt, wt, bt, padding=1, compute_mode="float32")
    assert wide.dtype == np.float16  # computed in float32, returned in the input dtype
    ref = F.conv2d(xt.astype("float32"), wt.astype("float32"), bt.astype("float32"), padding=1)
    np.testing.assert_array_equal(wide.numpy(), ref.numpy().astype(np.float16))
    assert F.conv2d(xt, wt, bt, padding=1).dtype == np.float16  # "default": float16 throughout
    tw = F.conv_transpose2d(xt, mg.tensor(w.transpose(1, 0, 2, 3)), compute_mode="FLOAT32")
    assert tw.dtype == np.float16
    y1 = F.conv1d(mg.tensor(x[:, :, 0]), mg.tensor(w[:, :, 0]), compute_mode="float32")
    assert y1.dtype == np.float16
    m = F.matmul(mg.tensor(x[0, 0]), mg.tensor(x[0, 1]), compute_mode="float32")
    np.testing.assert_array_equal(
        m.numpy(), (x[0, 0].astype(np.float32) @ x[0, 1].astype(np.float32)).astype(np.float16))
    assert F.linear(mg.tensor(x[0, 0]), mg.tensor(x[0, 1]), compute_mode="float32").dtype == (
        np.float16)
    for call in (lambda: F.conv2d(xt, wt, compute_mode="float16"),
                 lambda: F.conv1d(mg.tensor(x[:, :, 0]), mg.tensor(w[:, :, 0]), compute_mode="x"),
                 lambda: F.matmul(xt, xt, compute_mode="tf32")):
        with pytest.raises(ValueError, match=r"compute_mode must be 'default' or 'float32'"):
            call()
    with pytest.raises(NotImplementedError, match=r"conv2d: conv_mode 'convolution' is not "
                                                  r"supported \(only 'cross_correlation'\)"):
        F.conv2d(xt, wt, conv_mode="convolution")
    with pytest.raises(ValueError, match=r"conv_transpose2d: need stride >= 1"):
        F.conv_transpose2d(xt, wt, stride=0)


def _ref_conv_transpose3d(x, w, stride, padding, out_pad, dilation, groups):
    """Direct loops: every input voxel adds ``x * w[i, o]`` at ``s * pos - p + d * k``."""
    n, c = x.shape[:2]
    wg = w.reshape((groups, c // groups) + w.shape[-4:]) if w.ndim == 5 else w
    ocg, kernel = wg.shape[2], wg.shape[3:]
    size = [(x.shape[2 + a] - 1) * stride[a] - 2 * padding[a] + dilation[a] * (kernel[a] - 1)
            + out_pad[a] + 1 for a in range(3)]
    out = np.zeros((n, groups * ocg) + tuple(size))
    for g in range(groups):
        for i in range(c // groups):
            for pos in np.ndindex(*x.shape[2:]):
                for k in np.ndindex(*kernel):
                    t = [stride[a] * pos[a] - padding[a] + dilation[a] * k[a] for a in range(3)]
                    if all(0 <= t[a] < size[a] for a in range(3)):
                        v = x[:, g * (c // groups) + i][(slice(None),) + pos]
                        out[:, g * ocg:(g + 1) * ocg, t[0], t[1], t[2]] += (
                            v[:, None] * wg[g, i][(slice(None),) + k])
    return out


@pytest.mark.parametrize("stride,padding,out_pad,dilation,groups", [
    ((1, 1, 1), (0, 0, 0), (0, 0, 0), (1, 1, 1), 1),
    ((2, 1, 3), (1, 0, 1), (1, 0, 2), (1, 2, 1), 1),
    ((2, 2, 1), (0, 1, 0), (0, 1, 0), (1, 1, 1), 2),
])
def test_conv_transpose3d_matches_loops_and_gradients(stride, padding, out_pad, dilation, groups,
                                                      device, rng):
    x = rng.standard_normal((2, 4, 2, 3, 2))
    w = rng.standard_normal((4, 3, 2, 2, 3) if groups == 1 else (groups, 2, 3, 2, 2, 3))
    args = dict(stride=stride, padding=padding, output_padding=out_pad, dilation=dilation,
                groups=groups)
    got = F.conv_transpose3d(mg.tensor(x, device=device), mg.tensor(w, device=device), **args)
    ref = _ref_conv_transpose3d(x, w, stride, padding, out_pad, dilation, groups)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)
    check_grad(lambda a, b: F.conv_transpose3d(a, b, **args), x, w, device=device)


def test_conv_transpose3d_layer_shape_and_bias(rng):
    """MegEngine's documented example shape: (20, 16, 10, 50, 100) with kernel (3, 5, 2), stride
    (3, 2, 2), padding (0, 4, 2), output_padding (2, 1, 1) gives (20, 33, 32, 96, 197); here on a
    smaller batch and width, and the bias adds per channel."""
    import minigrad.module as M

    m = M.ConvTranspose3d(16, 33, (3, 5, 2), output_padding=(2, 1, 1), stride=(3, 2, 2),
                          padding=(0, 4, 2))
    assert m.weight.shape == (16, 33, 3, 5, 2) and m.bias.shape == (1, 33, 1, 1, 1)
    x = mg.tensor(rng.standard_normal((1, 16, 10, 50, 5)).astype(np.float32))
    assert m(x).shape == (1, 33, 32, 96, 7)
    no_bias = F.conv_transpose3d(x, m.weight, stride=(3, 2, 2), padding=(0, 4, 2),
                                 output_padding=(2, 1, 1))
    np.testing.assert_allclose((m(x) - no_bias).numpy(),
                               np.broadcast_to(m.bias.numpy(), no_bias.shape), rtol=1e-4,
                               atol=1e-5)


def test_local_conv2d_layer_uses_megengine_weight_layout(rng):
    import minigrad.module as M

    m = M.LocalConv2d(4, 6, 7, 7, 3, groups=2)
    assert m.weight.shape == (2, 5, 5, 2, 3, 3, 3)
    x = rng.standard_normal((2, 4, 7, 7)).astype(np.float32)
    ref = F.local_conv2d(mg.tensor(x), m.weight)
    np.testing.assert_array_equal(m(mg.tensor(x)).numpy(), ref.numpy())
    assert m(mg.tensor(x)).shape == (2, 6, 5, 5)


def test_conv_transpose3d_promotes_a_float16_input_to_the_weight_dtype(rng):
    x = rng.random((1, 2, 3, 3, 3)).astype(np.float16)
    w = mg.tensor(rng.standard_normal((2, 3, 2, 2, 2)).astype(np.float32))
    half = F.conv_transpose3d(mg.tensor(x), w, stride=2)
    full = F.conv_transpose3d(mg.tensor(x.astype(np.float32)), w, stride=2)
    assert half.dtype == np.float32
    np.testing.assert_array_equal(half.numpy(), full.numpy())
