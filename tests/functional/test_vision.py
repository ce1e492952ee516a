"""F.vision: MegEngine's documented examples (several on seeded random data, reproduced exactly),
loop-based NumPy references written from the documented formulas (float64), and central finite
differences for every differentiable input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad

V = F.vision


def t(a, device="cpu0"):
    return mg.tensor(np.asarray(a), device=device)


# -- references ------------------------------------------------------------------------------------


def _border(p: int, n: int, mode: str):
    """OpenCV's border rules: replicate aaa|abc|ccc, reflect cba|abc|cba, reflect_101 cb|abc|ba,
    wrap bc|abc|ab, constant -> None (read the border value)."""
    while not 0 <= p < n:
        if mode == "constant":
            return None
        if mode == "replicate":
            p = min(max(p, 0), n - 1)
        elif mode == "wrap":
            p %= n
        elif mode == "reflect":
            p = -p - 1 if p < 0 else 2 * n - 1 - p
        else:  # reflect_101
            p = -p if p < 0 else 2 * n - 2 - p
    return p


def _bilinear(img, x, y, mode="replicate", value=0.0):
    """img (C, H, W) read at real coordinates (x, y): the four neighbours weighted by area."""
    c, h, w = img.shape
    x0, y0 = math.floor(x), math.floor(y)
    out = np.zeros(c)
    for dy, dx in itertools.product((0, 1), (0, 1)):
        weight = (y - y0 if dy else 1 - (y - y0)) * (x - x0 if dx else 1 - (x - x0))
        r, q = _border(y0 + dy, h, mode), _border(x0 + dx, w, mode)
        out += weight * (img[:, r, q] if r is not None and q is not None else value)
    return out


def _warp_ref(x, mats, out_hw, mode="replicate", value=0.0, perspective=True, src=None):
    n_out = mats.shape[0]
    out = np.zeros((n_out, x.shape[1]) + tuple(out_hw))
    for n, hh, ww in itertools.product(range(n_out), range(out_hw[0]), range(out_hw[1])):
        m = mats[n]
        d = m[2, 0] * ww + m[2, 1] * hh + m[2, 2] if perspective else 1.0
        sx = (m[0, 0] * ww + m[0, 1] * hh + m[0, 2]) / d
        sy = (m[1, 0] * ww + m[1, 1] * hh + m[1, 2]) / d
        img = x[n if src is None else src[n]]
        out[n, :, hh, ww] = _bilinear(img, sx, sy, mode, value)
    return out


# -- interpolate and resize ------------------------------------------------------------------------


def test_interpolate_documented_example(default_device):
    """MegEngine's example: 2x2 [1..4] to 4x4 bilinear without align_corners, and scale_factor=2
    gives the same."""
    x = t(np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2))
    want = [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5],
            [3.0, 3.25, 3.75, 4.0]]
    np.testing.assert_allclose(V.interpolate(x, [4, 4], align_corners=False).numpy()[0, 0], want)
    np.testing.assert_allclose(V.interpolate(x, scale_factor=2.0).numpy()[0, 0], want)


def _axis_samples(n_in, n_out, mode, align):
    """Per output index: [(input index, weight)] from the documented coordinate rules."""
    rows = []
    for i in range(n_out):
        if mode == "nearest":
            rows.append([(min(int(i * n_in / n_out), n_in - 1), 1.0)])
            continue
        pos = i * (n_in - 1) / (n_out - 1) if align else (i + 0.5) * n_in / n_out - 0.5
        if mode == "cubic":
            base, f = math.floor(pos), pos - math.floor(pos)
            a = -0.75
            ws = []
            for k in range(4):
                d = abs(f - (k - 1))  # Keys' kernel at distance d
                ws.append((a + 2) * d**3 - (a + 3) * d**2 + 1 if d <= 1
                          else a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a)
            rows.append([(min(max(base - 1 + k, 0), n_in - 1), ws[k]) for k in range(4)])
            continue
        pos = min(max(pos, 0.0), n_in - 1.0)
        base = min(int(math.floor(pos)), max(n_in - 2, 0))
        f = pos - base
        rows.append([(base, 1 - f), (min(base + 1, n_in - 1), f)])
    return rows


def _interp_ref(x, sizes, mode, align=False):
    for k, n_out in enumerate(sizes):
        axis = x.ndim - len(sizes) + k
        x = np.moveaxis(x, axis, -1)
        out = np.zeros(x.shape[:-1] + (n_out,))
        for i, taps in enumerate(_axis_samples(x.shape[-1], n_out, mode, align)):
            for j, w in taps:
                out[..., i] += w * x[..., j]
        x = np.moveaxis(out, -1, axis)
    return x


@pytest.mark.parametrize("mode,kind,shape,size,align", [
    ("bilinear", "linear", (2, 3, 4, 5), (7, 3), False),
    ("bilinear", "linear", (1, 2, 4, 5), (7, 3), True),
    ("nearest", "nearest", (2, 1, 5, 3), (3, 7), None),
    ("nearest", "nearest", (1, 1, 6, 6), (4, 9), None),
    ("bicubic", "cubic", (1, 2, 4, 5), (6, 3), None),
    ("linear", "linear", (2, 3, 5), (8,), True),
    ("linear", "linear", (2, 3, 5), (3,), False),
    ("trilinear", "linear", (1, 2, 3, 4, 2), (2, 5, 3), False),
])
def test_interpolate_modes(mode, kind, shape, size, align, device, rng):
    """Each mode against per-pixel sums of the documented rules: half-pixel centres clamped to the
    image (linear), corner-aligned centres (align_corners), floor(i * in / out) (nearest), Keys'
    cubic with a = -0.75 and repeated edges (bicubic); differentiable."""
    x = rng.standard_normal(shape)
    got = V.interpolate(t(x, device), size=list(size), mode=mode, align_corners=align)
    np.testing.assert_allclose(got.numpy(), _interp_ref(x, size, kind, bool(align)), rtol=1e-10,
                               atol=1e-12)
    check_grad(lambda z: V.interpolate(z, size=list(size), mode=mode, align_corners=align), x,
               device=device)


def test_interpolate_align_corners_keeps_corners_and_errors(rng, default_device):
    """align_corners=True preserves the four corner pixels; it is only allowed in linear modes;
    exactly one of size and scale_factor."""
    x = rng.standard_normal((1, 1, 3, 4))
    y = V.interpolate(t(x), (5, 9), align_corners=True).numpy()
    np.testing.assert_allclose(y[0, 0, [0, 0, -1, -1], [0, -1, 0, -1]], x[0, 0, [0, 0, -1, -1],
                               [0, -1, 0, -1]], rtol=1e-12)
    with pytest.raises(ValueError, match="interpolate: align_corners can only be set"):
        V.interpolate(t(x), (5, 5), mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match="interpolate: give exactly one of size and scale_factor"):
        V.interpolate(t(x))
    with pytest.raises(ValueError, match="interpolate: mode 'bilinear' needs a 4-D input"):
        V.interpolate(t(x[0]), (2, 2))


def test_resize_documented_example_and_nhwc(default_device):
    """MegEngine's F.vision.resize example: 4x4 arange to 2x2 bilinear is [[2.5, 4.5],
    [10.5, 12.5]]; NHWC input gives the same numbers."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    np.testing.assert_allclose(V.resize(t(x), (2, 2)).numpy()[0, 0], [[2.5, 4.5], [10.5, 12.5]])
    nhwc = V.resize(t(x.transpose(0, 2, 3, 1)), (2, 2), format="NHWC").numpy()
    np.testing.assert_allclose(nhwc[0, :, :, 0], [[2.5, 4.5], [10.5, 12.5]])


# -- warps and remap -------------------------------------------------------------------------------


def test_warp_perspective_documented_example(default_device):
    """MegEngine's example: the translation matrix reads (w + 1, h + 1): [[5, 6], [9, 10]]."""
    x = t(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    m = t(np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], np.float32)[None])
    np.testing.assert_array_equal(V.warp_perspective(x, m, (2, 2)).numpy()[0, 0],
                                  [[5, 6], [9, 10]])


@pytest.mark.parametrize("border", ["replicate", "constant", "reflect", "reflect_101", "wrap"])
def test_warp_perspective_border_modes(border, device, rng):
    """Output (w, h) reads M @ (w, h, 1) divided by its third component, bilinear, with OpenCV's
    border rules; mat_idx maps matrices to source images; differentiable in image and matrix."""
    x = rng.standard_normal((2, 2, 4, 5))
    mats = np.stack([np.array([[1.1, 0.2, -1.3], [-0.1, 0.9, 2.2], [0.01, -0.02, 1.0]]),
                     np.array([[0.7, -0.3, 3.1], [0.4, 1.2, -2.4], [0.0, 0.03, 1.1]]),
                     np.array([[1.3, 0.1, -2.0], [0.2, 1.4, -1.5], [0.02, 0.0, 0.9]])])
    mats += rng.uniform(-0.01, 0.01, mats.shape)  # no sample exactly on a pixel (a kink)
    src = np.array([1, 0, 1])
    want = _warp_ref(x, mats, (3, 6), border, 0.5, src=src)
    got = V.warp_perspective(t(x, device), t(mats, device), (3, 6), mat_idx=src,
                             border_mode=border, border_val=0.5)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    check_grad(lambda a, m: V.warp_perspective(a, m, (3, 6), mat_idx=src, border_mode=border,
                                               border_val=0.5), x, mats, device=device)


def test_warp_affine_nhwc_default_and_nearest(device, rng):
    """warp_affine: (B, 2, 3) matrices, MegEngine's default NHWC layout; "nearest" rounds the
    source coordinate half to even; differentiable (in image and matrix) with linear sampling."""
    x = rng.standard_normal((2, 4, 5, 3))  # NHWC
    mats = np.array([[[0.9, 0.3, -0.4], [-0.2, 1.1, 0.7]], [[1.2, 0.0, 0.5], [0.1, 0.8, -0.3]]])
    mats += rng.uniform(-0.01, 0.01, mats.shape)  # no sample exactly on a pixel (a kink)
    full = np.concatenate([mats, np.tile([[[0.0, 0.0, 1.0]]], (2, 1, 1))], axis=1)
    want = _warp_ref(x.transpose(0, 3, 1, 2), full, (3, 4), "reflect", perspective=False)
    got = V.warp_affine(t(x, device), t(mats, device), (3, 4), border_mode="reflect")
    np.testing.assert_allclose(got.numpy(), want.transpose(0, 2, 3, 1), rtol=1e-10, atol=1e-12)
    check_grad(lambda a, m: V.warp_affine(a, m, (3, 4), border_mode="constant"), x, mats,
               device=device)
    near = V.warp_affine(t(x, device), t(mats, device), (3, 4), interp_mode="nearest").numpy()
    for n, hh, ww in itertools.product(range(2), range(3), range(4)):
        sx = np.rint(mats[n, 0] @ [ww, hh, 1.0])
        sy = np.rint(mats[n, 1] @ [ww, hh, 1.0])
        r, q = _border(int(sy), 4, "replicate"), _border(int(sx), 5, "replicate")
        np.testing.assert_array_equal(near[n, hh, ww], x[n, r, q])


def test_remap(device, rng):
    """MegEngine's example ([[1, 4], [4, 4]]); in general out[n, :, h, w] reads the image at
    (map_xy[n, h, w, 0], map_xy[n, h, w, 1]); differentiable in the image and the map."""
    x = t(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    m = t(np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]], np.float32)[None])
    np.testing.assert_array_equal(V.remap(x, m).numpy()[0, 0], [[1, 4], [4, 4]])
    img = rng.standard_normal((2, 3, 4, 5))
    coords = rng.uniform(-1.5, 5.5, (2, 3, 2, 2))
    want = np.zeros((2, 3, 3, 2))
    for n, hh, ww in itertools.product(range(2), range(3), range(2)):
        want[n, :, hh, ww] = _bilinear(img[n], *coords[n, hh, ww], "constant", -1.0)
    got = V.remap(t(img, device), t(coords, device), border_mode="constant", scalar=-1.0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    check_grad(lambda a, c: V.remap(a, c, border_mode="wrap"), img, coords, device=device)


def test_sampling_errors():
    x = t(np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="warp_perspective: mat must be \\(batch, 3, 3\\)"):
        V.warp_perspective(x, t(np.zeros((1, 2, 3))), (2, 2))
    with pytest.raises(ValueError, match="warp_perspective: 2 matrices for a batch of 1"):
        V.warp_perspective(x, t(np.tile(np.eye(3), (2, 1, 1))), (2, 2))
    with pytest.raises(ValueError, match="remap: border_mode must be one of"):
        V.remap(x, t(np.zeros((1, 2, 2, 2))), border_mode="mirror")
    with pytest.raises(NotImplementedError, match="warp_affine: interp_mode 'cubic'"):
        V.warp_affine(x, t(np.zeros((1, 2, 3))), (2, 2), format="NCHW", interp_mode="cubic")


# -- roi ops and nms -------------------------------------------------------------------------------


def test_roi_ops_documented_examples(default_device):
    """MegEngine's examples on np.random.seed(42) data: roi_pooling gives [[-0.1383, -0.1383],
    [-0.5035, -0.5035]] and roi_align [[0.175, 0.175], [0.1359, 0.1359]] for the first roi; nms of
    its 100 seeded boxes keeps [75, 69]."""
    for fn, want in ((V.roi_pooling, [[-0.1383, -0.1383], [-0.5035, -0.5035]]),
                     (V.roi_align, [[0.175, 0.175], [0.1359, 0.1359]])):
        np.random.seed(42)
        inp = t(np.random.randn(1, 1, 128, 128).astype(np.float32))
        rois = t(np.random.random((4, 5)).astype(np.float32))
        np.testing.assert_allclose(fn(inp, rois, (2, 2)).numpy()[0, 0].round(4), want)
    x = np.zeros((100, 4))
    np.random.seed(42)
    x[:, :2] = np.random.rand(100, 2) * 20
    x[:, 2:] = np.random.rand(100, 2) * 20 + 100
    keep = V.nms(t(x), t(np.random.rand(100)), iou_thresh=0.7)
    assert keep.dtype == np.int32 and keep.numpy().tolist() == [75, 69]


ROIS = np.array([[1, 0.6, 1.2, 5.3, 4.1], [0, -1.0, 2.0, 3.0, 7.5], [1, 2.0, 0.5, 2.4, 1.0]])


@pytest.mark.parametrize("mode", ["average", "max"])
@pytest.mark.parametrize("aligned", [True, False])
def test_roi_align(mode, aligned, device, rng):
    """Each bin of each roi reduces sample_points^2 bilinear samples at
    start + bin * (p + (i + 0.5) / samples), outside pixels counting 0 (Mask R-CNN's RoIAlign);
    differentiable in the feature map."""
    x = rng.standard_normal((2, 3, 6, 7))
    out_hw, samples, scale = (2, 3), (2, 3), 0.8
    off = 0.5 if aligned else 0.0
    want = np.zeros((len(ROIS), 3) + out_hw)
    for k, (b, x1, y1, x2, y2) in enumerate(ROIS):
        sx, sy = x1 * scale - off, y1 * scale - off
        bw = max(x2 * scale - off - sx, 0) / out_hw[1]
        bh = max(y2 * scale - off - sy, 0) / out_hw[0]
        for ph, pw in itertools.product(range(out_hw[0]), range(out_hw[1])):
            vals = [_bilinear(x[int(b)], sx + bw * (pw + (j + 0.5) / samples[1]),
                              sy + bh * (ph + (i + 0.5) / samples[0]), "constant", 0.0)
                    for i in range(samples[0]) for j in range(samples[1])]
            want[k, :, ph, pw] = np.mean(vals, 0) if mode == "average" else np.max(vals, 0)
    fn = lambda z: V.roi_align(z, t(ROIS, device), out_hw, mode, scale, samples, aligned)  # noqa: E731
    np.testing.assert_allclose(fn(t(x, device)).numpy(), want, rtol=1e-10, atol=1e-12)
    check_grad(fn, x, device=device)


@pytest.mark.parametrize("mode", ["max", "average"])
def test_roi_pooling(mode, device, rng):
    """Fast R-CNN's RoI pooling: the roi is scaled and rounded, bin (i, j) covers pixels
    [floor(i * h / ph), ceil((i + 1) * h / ph)) from the roi's corner, clipped to the image, and
    is reduced by max or average; empty bins give 0; differentiable in the feature map."""
    x = rng.standard_normal((2, 2, 7, 6))
    rois = np.vstack([ROIS, [[0, 30.0, 30.0, 40.0, 40.0]]])  # the last one is outside: zeros
    out_hw, scale = (3, 2), 1.3
    want = np.zeros((len(rois), 2) + out_hw)
    for k, (b, *box) in enumerate(rois):
        x1, y1, x2, y2 = (int(np.sign(v) * np.floor(abs(v) + 0.5)) for v in np.array(box) * scale)
        h, w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for i, j in itertools.product(range(out_hw[0]), range(out_hw[1])):
            r0 = min(max(math.floor(i * h / out_hw[0]) + y1, 0), 7)
            r1 = min(max(math.ceil((i + 1) * h / out_hw[0]) + y1, 0), 7)
            c0 = min(max(math.floor(j * w / out_hw[1]) + x1, 0), 6)
            c1 = min(max(math.ceil((j + 1) * w / out_hw[1]) + x1, 0), 6)
            region = x[int(b), :, r0:r1, c0:c1].reshape(2, -1)
            if region.shape[1]:
                want[k, :, i, j] = region.max(1) if mode == "max" else region.mean(1)
    fn = lambda z: V.roi_pooling(z, t(rois, device), out_hw, mode, scale)  # noqa: E731
    np.testing.assert_allclose(fn(t(x, device)).numpy(), want, rtol=1e-12)
    check_grad(fn, x, device=device)


def test_nms_greedy_reference(rng, default_device):
    """Boxes are visited by decreasing score; one is dropped when its IoU with a kept box exceeds
    the threshold (equality keeps it); max_output truncates."""
    xy = rng.uniform(0, 10, (30, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(2, 6, (30, 2))], 1)
    scores = rng.random(30)

    def iou(a, b):
        iw = max(min(a[2], b[2]) - max(a[0], b[0]), 0)
        ih = max(min(a[3], b[3]) - max(a[1], b[1]), 0)
        inter = iw * ih
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    keep = []
    for i in np.argsort(-scores, kind="stable"):
        if all(iou(boxes[i], boxes[j]) <= 0.3 for j in keep):
            keep.append(i)
    assert V.nms(t(boxes), t(scores), 0.3).numpy().tolist() == keep
    assert V.nms(t(boxes), t(scores), 0.3, max_output=3).numpy().tolist() == keep[:3]
    same = np.array([[0.0, 0, 2, 2], [0.0, 0, 2, 2]])
    assert V.nms(t(same), t([0.5, 0.9]), 1.0).numpy().tolist() == [1, 0]  # IoU 1 is not > 1


# -- flip, rot90, cvt_color ------------------------------------------------------------------------


def test_flip_and_rot90(device, rng):
    """MegEngine's NHWC examples (flip both: [3, 2, 1, 0]; rot90 clockwise: [2, 0, 3, 1]) and
    np.flip / np.rot90 (which turns counter-clockwise) on the H, W axes; differentiable."""
    x = t(np.arange(4, dtype=np.float32).reshape(1, 2, 2, 1))
    assert V.flip(x).numpy().ravel().tolist() == [3, 2, 1, 0]
    assert V.rot90(x).numpy().ravel().tolist() == [2, 0, 3, 1]
    a = rng.standard_normal((2, 3, 4, 2))
    np.testing.assert_array_equal(V.flip(t(a, device), horizontal=False).numpy(), a[:, ::-1])
    np.testing.assert_array_equal(V.flip(t(a, device), vertical=False).numpy(), a[:, :, ::-1])
    np.testing.assert_array_equal(V.rot90(t(a, device)).numpy(), np.rot90(a, -1, (1, 2)))
    np.testing.assert_array_equal(V.rot90(t(a, device), clockwise=False).numpy(),
                                  np.rot90(a, 1, (1, 2)))
    check_grad(lambda z: V.rot90(V.flip(z, horizontal=False)), a, device=device)


def test_cvt_color_float(device, rng):
    """MegEngine's example (RGB2GRAY of [-0.587, 1.753, 0.107] is 0.86555), gray = 0.299 R +
    0.587 G + 0.114 B (BGR2GRAY reads channel 0 as blue), GRAY2RGB repeats, YUV2RGB inverts
    RGB2YUV, channel swaps; float conversions are differentiable."""
    x = t(np.array([[[[-0.58675045, 1.7526233, 0.10702174]]]], np.float32))
    np.testing.assert_allclose(V.cvt_color(x, mode="RGB2GRAY").numpy(), [[[[0.86555195]]]],
                               rtol=1e-6)
    a = rng.uniform(0, 1, (2, 3, 4, 3))
    gray = a @ [0.299, 0.587, 0.114]
    np.testing.assert_allclose(V.cvt_color(t(a, device), "RGB2GRAY").numpy()[..., 0], gray)
    np.testing.assert_allclose(V.cvt_color(t(a[..., ::-1].copy(), device), "BGR2GRAY").numpy()[
        ..., 0], gray)
    np.testing.assert_array_equal(V.cvt_color(t(a[..., :1], device), "GRAY2RGB").numpy(),
                                  np.repeat(a[..., :1], 3, -1))
    np.testing.assert_array_equal(V.cvt_color(t(a, device), "rgb2bgr").numpy(), a[..., ::-1])
    yuv = V.cvt_color(t(a, device), "RGB2YUV")
    np.testing.assert_allclose(yuv.numpy()[..., 0], a @ [0.114, 0.587, 0.299])
    np.testing.assert_allclose(V.cvt_color(yuv, "YUV2RGB").numpy(), a, atol=5e-3)
    check_grad(lambda z: V.cvt_color(z, "RGB2YUV"), a, device=device)
    with pytest.raises(ValueError, match="cvt_color: mode RGB2GRAY needs NHWC images with 3"):
        V.cvt_color(t(a[..., :2]), "RGB2GRAY")


def test_cvt_color_uint8(rng, default_device):
    """uint8 images use 14-bit fixed point with rounding: gray = (4899 R + 9617 G + 1868 B +
    2^13) >> 14; YUV2RGB(RGB2YUV(x)) is within a couple of grey levels of x."""
    a = rng.integers(0, 256, (1, 5, 6, 3)).astype(np.uint8)
    v = a.astype(np.int64)
    gray = (4899 * v[..., 0] + 9617 * v[..., 1] + 1868 * v[..., 2] + 8192) >> 14
    out = V.cvt_color(t(a), "RGB2GRAY")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out.numpy()[..., 0], gray)
    np.testing.assert_array_equal(V.cvt_color(t(a[..., ::-1].copy()), "BGR2GRAY").numpy()[..., 0],
                                  gray)
    back = V.cvt_color(V.cvt_color(t(a), "RGB2YUV"), "YUV2RGB").numpy().astype(int)
    assert np.abs(back - a).max() <= 3
