"""MegEngine's ``F.nn.region_restricted_conv`` and ``F.deformable_psroi_pooling``, checked against
direct NumPy loops written from their documented definitions (forward, float64), central finite
differences (backward) and the values of MegEngine's own example."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.autodiff import GradManager
from minigrad.testing import check_grad


def t(a, device="cpu0"):
    return mg.tensor(np.asarray(a), device=device)


# -- region_restricted_conv ----------------------------------------------------------------------


def _rrconv_ref(x, w, rin, rout, stride, padding, dilation):
    """Loop form: a tap of the grouped cross-correlation counts only where rin == rout."""
    n, c, h, wd = x.shape
    g, ocg, icg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, g * ocg, oh, ow))
    for b, gi, o, y, xx in itertools.product(range(n), range(g), range(ocg), range(oh), range(ow)):
        acc = 0.0
        for i, a, bb in itertools.product(range(icg), range(kh), range(kw)):
            iy, ix = y * sh - ph + a * dh, xx * sw - pw + bb * dw
            if 0 <= iy < h and 0 <= ix < wd and rin[b, iy, ix] == rout[b, y, xx]:
                acc += w[gi, o, i, a, bb] * x[b, gi * icg + i, iy, ix]
        out[b, gi * ocg + o, y, xx] = acc
    return out


def test_region_restricted_conv_megengine_example():
    """MegEngine's test: 2 groups, one region everywhere, out = [14, 126]; with dy = 1 the input
    gradient is the filter and the filter gradient the input."""
    src = t(np.arange(8).reshape(1, 2, 2, 2).astype(np.float32))
    flt = t(np.arange(8).reshape(2, 1, 1, 2, 2).astype(np.float32))
    gm = GradManager().attach([src, flt])
    with gm:
        out = F.nn.region_restricted_conv(src, flt, t(np.ones((1, 2, 2), np.int32)),
                                          t(np.ones((1, 1, 1), np.int32)), groups=2)
        gm.backward(out, t(np.ones((1, 2, 1, 1), np.float32)))
    np.testing.assert_allclose(out.numpy().ravel(), [14, 126])
    np.testing.assert_allclose(src.grad.numpy().ravel(), np.arange(8))
    np.testing.assert_allclose(flt.grad.numpy().ravel(), np.arange(8))


@pytest.mark.parametrize("rtype", [np.int32, np.uint8])
def test_region_restricted_conv_matches_loops(device, rng, rtype):
    """Region ids mask every tap whose input region differs from the output region; stride,
    padding, dilation, groups and bias as in conv2d; gradients in input, weight and bias."""
    x = rng.standard_normal((2, 4, 6, 5))
    w = rng.standard_normal((2, 3, 2, 3, 2))  # groups=2, OC/G=3, IC/G=2, 3x2 kernel
    bias = rng.standard_normal((1, 6, 1, 1))
    kw = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2))
    rin = rng.integers(0, 3, (2, 6, 5)).astype(rtype)
    rout = rng.integers(0, 3, (2, 3, 5)).astype(rtype)
    got = F.region_restricted_conv(t(x, device), t(w, device), t(rin, device), t(rout, device),
                                   bias=t(bias, device), groups=2, **kw)
    want = _rrconv_ref(x, w, rin, rout, (2, 1), (1, 1), (1, 2)) + bias
    assert got.shape == (2, 6, 3, 5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    # the mask matters: with all ids equal it is conv2d, which differs from the masked result
    plain = _rrconv_ref(x, w, np.zeros_like(rin), np.zeros_like(rout), (2, 1), (1, 1), (1, 2))
    assert np.abs(plain + bias - want).max() > 1e-3
    check_grad(lambda a, b, c: F.region_restricted_conv(a, b, t(rin, device), t(rout, device),
                                                         bias=c, groups=2, **kw),
               x, w, bias, device=device)


def test_region_restricted_conv_errors():
    """Float region ids, a non-grouped weight and mis-shaped ids are refused, naming the op."""
    x, w = t(np.zeros((1, 2, 3, 3))), t(np.zeros((1, 2, 2, 2, 2)))
    ids_in, ids_out = t(np.zeros((1, 3, 3), np.int32)), t(np.zeros((1, 2, 2), np.int32))
    with pytest.raises(TypeError, match="region_restricted_conv: rin must hold integer region "
                                        "ids .* got float32"):
        F.region_restricted_conv(x, w, t(np.zeros((1, 3, 3), np.float32)), ids_out)
    with pytest.raises(ValueError, match=r"region_restricted_conv: weight must be grouped"):
        F.region_restricted_conv(x, t(np.zeros((2, 2, 2, 2))), ids_in, ids_out)
    with pytest.raises(ValueError, match=r"rout must have shape \(1, 2, 2\), got \(1, 3, 3\)"):
        F.region_restricted_conv(x, w, ids_in, ids_in)


# -- deformable_psroi_pooling --------------------------------------------------------------------


def _round_away(v):
    return math.copysign(math.floor(abs(v) + 0.5), v)


def _bilinear(img, y, x):
    y0, x0 = math.floor(y), math.floor(x)
    y1, x1 = min(y0 + 1, img.shape[0] - 1), min(x0 + 1, img.shape[1] - 1)
    fy, fx = y - y0, x - x0
    return ((1 - fy) * (1 - fx) * img[y0, x0] + (1 - fy) * fx * img[y0, x1]
            + fy * (1 - fx) * img[y1, x0] + fy * fx * img[y1, x1])


def _dpsroi_ref(x, rois, trans, no_trans, part, ph, pw, spp, scale, std):
    """Loop form of the documented definition (one output per input channel)."""
    n_roi, c = rois.shape[0], x.shape[1]
    h, w = x.shape[2:]
    out = np.zeros((n_roi, c, ph, pw))
    for r, ch, i, j in itertools.product(range(n_roi), range(c), range(ph), range(pw)):
        b = int(rois[r, 0])
        x1, y1, x2, y2 = (_round_away(v) for v in rois[r, 1:])
        left, top = x1 * scale - 0.5, y1 * scale - 0.5
        rw = max((x2 + 1) * scale - 0.5 - left, 0.1)
        rh = max((y2 + 1) * scale - 0.5 - top, 0.1)
        bw, bh = rw / pw, rh / ph
        ox = oy = 0.0
        if not no_trans:
            pi, pj = math.floor(i / ph * part), math.floor(j / pw * part)
            ox, oy = trans[r, 0, pi, pj] * std, trans[r, 1, pi, pj] * std
        x0, y0 = j * bw + left + ox * rw, i * bh + top + oy * rh
        vals = []
        for a, bb in itertools.product(range(spp), range(spp)):
            sy, sx = y0 + a * bh / spp, x0 + bb * bw / spp
            if sx < -0.5 or sx > w - 0.5 or sy < -0.5 or sy > h - 0.5:
                continue
            vals.append(_bilinear(x[b, ch], min(max(sy, 0.0), h - 1.0), min(max(sx, 0.0), w - 1.0)))
        out[r, ch, i, j] = np.mean(vals) if vals else 0.0
    return out


@pytest.mark.parametrize("no_trans", [False, True])
def test_deformable_psroi_pooling_matches_loops(device, rng, no_trans):
    """Boxes rounded and scaled, bins moved by trans * trans_std * roi size, samples outside the
    image left out of the mean (the first roi hangs over the border), parts coarser than bins."""
    x = rng.standard_normal((2, 3, 9, 10))
    rois = np.array([[1, -3.4, 2.6, 7.2, 14.4], [0, 2.0, 1.0, 12.5, 10.0], [1, 5, 5, 5, 5]])
    trans = rng.standard_normal((3, 2, 4, 3))
    args = (no_trans, 2, 4, 3, 3, 0.6, 0.3)
    got = F.deformable_psroi_pooling(t(x, device), t(rois, device), t(trans, device), *args)
    want = _dpsroi_ref(x, rois, trans, *args)
    assert got.shape == (3, 3, 4, 3)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    if not no_trans:  # the offsets matter
        plain = _dpsroi_ref(x, rois, trans, True, *args[1:])
        assert np.abs(plain - want).max() > 1e-3


def test_deformable_psroi_pooling_gradients(device, rng):
    """Gradients in the feature map and the offsets against finite differences (samples kept
    inside the image, off integer coordinates)."""
    x = rng.standard_normal((1, 2, 12, 12))
    rois = np.array([[0, 3.0, 2.0, 8.0, 9.0], [0, 1.0, 4.0, 6.0, 7.0]])
    trans = 0.3 * rng.uniform(-1, 1, (2, 2, 3, 3)) + 0.013
    check_grad(lambda a, b: F.deformable_psroi_pooling(a, t(rois, device), b, False, 3, 3, 3, 2,
                                                       1.0, 0.1), x, trans, device=device)


def test_deformable_psroi_pooling_megengine_call():
    """MegEngine's test call: float32 (1, 256, 64, 64) input, trans with spare rows; float32
    (R, C, pooled_h, pooled_w) out, equal to the loops on a few channels."""
    r = np.random.default_rng(1)
    x = r.random((1, 256, 64, 64)).astype(np.float32)
    rois = r.random((1, 5)).astype(np.float32)
    trans = r.random((24, 2, 7, 7)).astype(np.float32)
    y = F.deformable_psroi_pooling(t(x), t(rois), t(trans), False, 7, 7, 7, 4, 1 / 64, 0.1)
    assert y.shape == (1, 256, 7, 7) and y.dtype == np.float32
    want = _dpsroi_ref(x[:, :4].astype(np.float64), rois, trans, False, 7, 7, 7, 4, 1 / 64, 0.1)
    np.testing.assert_allclose(y.numpy()[:, :4], want, rtol=1e-5, atol=1e-6)


def test_deformable_psroi_pooling_errors():
    """A trans of the wrong shape and part_size above the bins are refused, naming the op."""
    x, rois = t(np.zeros((1, 1, 4, 4))), t(np.array([[0, 0, 0, 3, 3.0]]))
    with pytest.raises(ValueError, match=r"deformable_psroi_pooling: trans must be "
                                         r"\(1, 2, 2, 2\) .* got shape \(1, 2, 3, 3\)"):
        F.deformable_psroi_pooling(x, rois, t(np.zeros((1, 2, 3, 3))), False, 2, 2, 2, 1, 1.0)
    with pytest.raises(ValueError, match=r"part_size 3 must be <= pooled_h 2"):
        F.deformable_psroi_pooling(x, rois, t(np.zeros((1, 2, 2, 2))), False, 3, 2, 2, 1, 1.0)
