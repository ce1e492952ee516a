"""Image ops (``F.vision``), MegEngine names, arguments and numerics.

Three mechanisms cover everything:

* **Separable resampling** (``interpolate``, ``resize``): nearest, linear and cubic interpolation
  of one axis is a constant ``(out, in)`` matrix, so resizing an image is ``M_h @ x @ M_w^T``;
  gradients of any order come for free from ``matmul``.
* **Point sampling** (``warp_perspective``, ``warp_affine``, ``remap``, ``roi_align``,
  ``deformable_psroi_pooling``): one
  primitive, ``Sample``, reads an image at arbitrary ``(x, y)`` coordinates with bilinear or
  nearest interpolation and a border mode, and owns its backward: the image gradient scatters
  ``dy`` onto the four neighbours, the coordinate gradient is the slope of the bilinear surface.
  The coordinates are built with Tensor ops from the transformation matrix, so ``warp_perspective``
  is differentiable in its matrix too (as in MegEngine). These gradients are first order.
* **Index ops** (``flip``, ``rot90``), a linear map over channels (``cvt_color`` on floats), and
  non-differentiable selection (``nms``); ``roi_pooling`` owns a small backward.

Coordinates follow MegEngine's kernels: the output pixel ``(w, h)`` of a warp reads the input at
``M @ (w, h, 1)`` (the matrix maps output to input, i.e. it is the inverse of OpenCV's), pixel
centres are at integer coordinates, and interpolation without ``align_corners`` uses half-pixel
centres like OpenCV's resize.
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device_checks import check_range
from minigrad.backend.xp import scatter_add
from minigrad.functional._util import ntuple
from minigrad.functional.elementwise import _f
from minigrad.functional.linalg import matmul
from minigrad.functional.reduction import max as _max
from minigrad.functional.reduction import mean as _mean
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import getitem, reshape, stack, transpose

__all__ = [
    "cvt_color",
    "deformable_psroi_pooling",
    "flip",
    "interpolate",
    "nms",
    "remap",
    "resize",
    "roi_align",
    "roi_pooling",
    "rot90",
    "warp_affine",
    "warp_perspective",
]


def _const(like: Tensor, array) -> Tensor:
    """A constant (never recorded) tensor on ``like``'s device with ``like``'s dtype."""
    return Tensor._wrap(like._device.put(array, like.dtype), like._device)


def _pair(value, name: str, op: str) -> tuple:
    return ntuple(value, 2, name, op)


def _check_nchw(op: str, x: Tensor, layout: str = "(N, C, H, W)") -> None:
    if x.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D input {layout}, got shape {x.shape}")


# --------------------------------------------------------------------------------------------------
# separable resampling: interpolate and resize


def _cubic_weights(t):
    """Keys' cubic convolution weights (a = -0.75, OpenCV's and MegEngine's choice) for the four
    neighbours at offsets -1, 0, 1, 2 of a sample at fractional position ``t``."""
    a = -0.75
    w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    w1 = ((a + 2) * t - (a + 3)) * t * t + 1
    w2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    return [w0, w1, w2, 1.0 - w0 - w1 - w2]


def _resample_matrix(n_in: int, n_out: int, mode: str, align_corners: bool) -> np.ndarray:
    """The (n_out, n_in) matrix that resamples one axis, with MegEngine's coordinate rules.

    nearest: source ``floor(i * n_in / n_out)`` (computed in float32, as MegEngine does);
    linear: half-pixel centres ``(i + 0.5) * n_in / n_out - 0.5`` clamped to the edge pixels, or
    ``i * (n_in - 1) / (n_out - 1)`` with ``align_corners``; cubic: half-pixel centres, four taps,
    edge pixels repeated.
    """
    m = np.zeros((n_out, n_in))
    i = np.arange(n_out)
    if mode == "nearest":
        scale = np.float32(n_out) / np.float32(n_in)
        src = np.minimum((i.astype(np.float32) / scale).astype(np.int64), n_in - 1)
        m[i, src] = 1.0
        return m
    if align_corners:
        pos = i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    else:
        pos = (i + 0.5) * (n_in / n_out) - 0.5
    base = np.floor(pos).astype(np.int64)
    t = pos - base
    if mode == "cubic":
        for k, w in enumerate(_cubic_weights(t)):
            np.add.at(m, (i, np.clip(base - 1 + k, 0, n_in - 1)), w)
        return m
    if n_in == 1:
        m[:, 0] = 1.0
        return m
    low = base < 0
    high = base + 1 >= n_in
    t = np.where(low, 0.0, np.where(high, 1.0, t))
    base = np.clip(base, 0, n_in - 2)
    np.add.at(m, (i, base), 1.0 - t)
    np.add.at(m, (i, base + 1), t)
    return m


def _resample(x: Tensor, sizes: tuple, mode: str, align_corners: bool) -> Tensor:
    """Resample the trailing ``len(sizes)`` axes of ``x`` to ``sizes``, one axis at a time."""
    nd = len(sizes)
    for k, n_out in enumerate(sizes):
        axis = x.ndim - nd + k
        n_in = x.shape[axis]
        if n_in == n_out:
            continue  # every mode maps n pixels onto the same n pixels
        mat_t = _const(x, _resample_matrix(n_in, n_out, mode, align_corners).T)
        if axis == x.ndim - 1:
            x = matmul(x, mat_t)
        else:  # bring the axis last, resample, put it back
            order = list(range(x.ndim))
            order.append(order.pop(axis))
            back = list(range(x.ndim))
            back.insert(axis, back.pop())
            x = transpose(matmul(transpose(x, order), mat_t), back)
    return x


_INTERP_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear",
                 "trilinear": "linear", "bicubic": "cubic"}


def interpolate(inp, size=None, scale_factor=None, mode: str = "bilinear",
                align_corners: bool | None = None) -> Tensor:
    """Resize the spatial axes of ``inp`` to ``size`` (or by ``scale_factor``; give exactly one).

    ``mode``: ``"nearest"``, ``"bilinear"`` and ``"bicubic"`` for (N, C, H, W) input, ``"linear"``
    for (N, C, L) and ``"trilinear"`` for (N, C, D, H, W). ``align_corners`` (linear modes only,
    default False) maps the corner pixel centres onto each other instead of using half-pixel
    centres. ``scale_factor`` gives ``floor(size * scale)`` outputs. Differentiable (any order).

    Example::

        F.vision.interpolate(x, scale_factor=2.0)  # (N, C, 2H, 2W), bilinear, half-pixel centres
    """
    op = "interpolate"
    mode = mode.lower()
    if mode not in _INTERP_MODES:
        raise ValueError(
            f"{op}: unsupported mode {mode!r}, expected one of {sorted(_INTERP_MODES)}"
        )
    kind = _INTERP_MODES[mode]
    if align_corners is not None and kind != "linear":
        raise ValueError(f"{op}: align_corners can only be set in the linear modes, not {mode!r}")
    x = _f(inp)
    nd = {"linear": 1, "trilinear": 3}.get(mode, 2)
    if x.ndim != nd + 2:
        raise ValueError(
            f"{op}: mode {mode!r} needs a {nd + 2}-D input (N, C, {nd} spatial axes), "
            f"got shape {x.shape}"
        )
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    spatial = x.shape[2:]
    if size is not None:
        sizes = ntuple(size, nd, "size", op)
    else:
        scales = ntuple(scale_factor, nd, "scale_factor", op, cast=float)
        # MegEngine computes floor(size * scale) in float32
        sizes = tuple(int(np.floor(np.float32(n) * np.float32(s))) for n, s in zip(spatial, scales))
    if min(sizes) < 1:
        raise ValueError(f"{op}: output size {sizes} must be positive (input {x.shape})")
    return _resample(x, sizes, kind, bool(align_corners))


def resize(inp, size, format: str = "NCHW", imode: str = "bilinear",  # noqa: A002
           max_size: int | None = None) -> Tensor:
    """Resize (N, C, H, W) (or NHWC with ``format="NHWC"``) images to ``size`` = (h, w) with
    ``imode`` ``"bilinear"``, ``"nearest"`` or ``"bicubic"`` (half-pixel centres); ``max_size``
    caps each requested side. Differentiable."""
    op = "resize"
    size = [min(s, max_size) if max_size is not None else s for s in _pair(size, "size", op)]
    x = _to_nchw(op, _f(inp), format)
    if imode.lower() not in ("bilinear", "nearest", "bicubic", "linear", "cubic"):
        raise ValueError(f"{op}: imode must be 'bilinear', 'nearest' or 'bicubic', got {imode!r}")
    kind = {"bilinear": "linear", "bicubic": "cubic"}.get(imode.lower(), imode.lower())
    return _from_nchw(_resample(x, tuple(size), kind, False), format)


def _to_nchw(op: str, x: Tensor, format: str) -> Tensor:  # noqa: A002
    if format not in ("NCHW", "NHWC"):
        raise ValueError(f"{op}: format must be 'NCHW' or 'NHWC', got {format!r}")
    _check_nchw(op, x, "(N, C, H, W)" if format == "NCHW" else "(N, H, W, C)")
    return x if format == "NCHW" else transpose(x, (0, 3, 1, 2))


def _from_nchw(x: Tensor, format: str) -> Tensor:  # noqa: A002
    return x if format == "NCHW" else transpose(x, (0, 2, 3, 1))


# --------------------------------------------------------------------------------------------------
# point sampling: one primitive for warps, remap and roi_align

_BORDER_MODES = ("replicate", "constant", "reflect", "reflect_101", "wrap")


def _border_mode(mode: str, op: str) -> str:
    m = mode.lower()
    m = m[len("border_"):] if m.startswith("border_") else m
    if m not in _BORDER_MODES:
        raise ValueError(f"{op}: border_mode must be one of {_BORDER_MODES}, got {mode!r}")
    return m


def _border_index(xp, i, n: int, mode: str):
    """Map integer coordinates ``i`` into ``[0, n)`` by the border rule; also return where the
    pixel is real (everything but ``constant``'s outside is)."""
    if mode == "constant":
        return xp.clip(i, 0, n - 1), (i >= 0) & (i < n)
    if mode == "replicate" or n == 1:
        return xp.clip(i, 0, n - 1), None
    if mode == "wrap":
        return i % n, None
    period = 2 * n if mode == "reflect" else 2 * n - 2  # reflect repeats the edge, _101 does not
    j = i % period
    return xp.where(j < n, j, period - 1 - j if mode == "reflect" else period - j), None


class Sample(Function):
    """Read ``x`` (N, C, H, W) at ``coords`` (M, OH, OW, 2) = (x, y) pixel coordinates from image
    ``batch[m]``: output (M, C, OH, OW). Bilinear (or nearest, rounding half to even) with a border
    mode; non-finite coordinates read ``value``."""

    def forward(self, x, coords, batch, border, value, nearest):
        xp = x.xp
        c = coords._data
        finite = xp.isfinite(c).all(axis=-1)
        cx = xp.where(finite, c[..., 0], 0.0)
        cy = xp.where(finite, c[..., 1], 0.0)
        self.x, self.args = x, (batch, border, value, nearest, finite)
        if nearest:
            taps = [(xp.rint(cy).astype(np.int64), xp.rint(cx).astype(np.int64), None)]
        else:
            x0, y0 = xp.floor(cx), xp.floor(cy)
            fx, fy = cx - x0, cy - y0
            self.frac = (fx, fy)
            x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
            taps = [(y0, x0, (1 - fy) * (1 - fx)), (y0, x0 + 1, (1 - fy) * fx),
                    (y0 + 1, x0, fy * (1 - fx)), (y0 + 1, x0 + 1, fy * fx)]
        self.taps = [self._locate(iy, ix) + (w,) for iy, ix, w in taps]
        out = sum(self._corner_values())
        out = xp.where(finite[..., None], out, value).astype(x.dtype, copy=False)
        return xp.ascontiguousarray(out.transpose(0, 3, 1, 2))

    def _locate(self, iy, ix):
        """(rows, cols, valid) of one tap after the border rule."""
        xp, (_, _, h, w) = self.x.xp, self.x.shape
        border = self.args[1]
        ry, vy = _border_index(xp, iy, h, border)
        rx, vx = _border_index(xp, ix, w, border)
        valid = None if vy is None else vy & vx
        return ry, rx, valid

    def _corner_values(self, weighted: bool = True):
        """Each tap's (M, OH, OW, C) values (times its weight when ``weighted``)."""
        xp, batch, value = self.x.xp, self.args[0], self.args[2]
        image = self.x._data.transpose(0, 2, 3, 1)  # (N, H, W, C) view
        b = batch[:, None, None]
        out = []
        for ry, rx, valid, w in self.taps:
            v = image[b, ry, rx]
            if valid is not None:
                v = xp.where(valid[..., None], v, value)
            out.append(v * w[..., None] if weighted and w is not None else v)
        return out

    def backward(self, dy):
        x, (batch, _, _, nearest, finite) = self.x, self.args
        xp = x.xp
        g = dy._data.transpose(0, 2, 3, 1) * finite[..., None]  # (M, OH, OW, C)
        dx = dcoords = None
        if self.needs_input_grad(0):
            dimg = xp.zeros((x.shape[0], x.shape[2], x.shape[3], x.shape[1]), dy.dtype)
            b = xp.broadcast_to(batch[:, None, None], g.shape[:3])
            for ry, rx, valid, w in self.taps:
                gw = g if w is None else g * w[..., None]
                if valid is not None:
                    gw = gw * valid[..., None]
                scatter_add(xp, dimg, (b, ry, rx), gw)
            dx = Tensor._wrap(xp.ascontiguousarray(dimg.transpose(0, 3, 1, 2)), dy._device)
        if self.needs_input_grad(1) and not nearest:
            v00, v01, v10, v11 = self._corner_values(weighted=False)
            fx, fy = self.frac
            d_fx = ((1 - fy)[..., None] * (v01 - v00) + fy[..., None] * (v11 - v10)) * g
            d_fy = ((1 - fx)[..., None] * (v10 - v00) + fx[..., None] * (v11 - v01)) * g
            dc = xp.stack([d_fx.sum(axis=-1), d_fy.sum(axis=-1)], axis=-1)
            dcoords = Tensor._wrap(dc.astype(dy.dtype, copy=False), dy._device)
        return dx, dcoords, None, None, None, None


def _sample(op, x, coords, batch, border_mode, value, interp_mode):
    interp = interp_mode.lower()
    if interp not in ("linear", "nearest"):
        raise NotImplementedError(
            f"{op}: interp_mode {interp_mode!r} is not supported ('linear' or 'nearest')"
        )
    value = float(value)
    return Sample()(x, coords, batch, _border_mode(border_mode, op), value, interp == "nearest")


def _grid(like: Tensor, oh: int, ow: int):
    """Output pixel coordinates ``w`` (1, 1, OW) and ``h`` (1, OH, 1) as constant tensors."""
    xp = like.xp
    return (_const(like, xp.arange(ow).reshape(1, 1, ow)),
            _const(like, xp.arange(oh).reshape(1, oh, 1)))


def _entry(mat: Tensor, i: int, j: int) -> Tensor:
    return reshape(getitem(mat, (slice(None), i, j)), (-1, 1, 1))


def _batch_index(op, x: Tensor, n_mat: int, mat_idx):
    """The image of each matrix, checked on the host, as an int64 array on ``x``'s device."""
    if mat_idx is None:
        if n_mat != x.shape[0]:
            raise ValueError(
                f"{op}: {n_mat} matrices for a batch of {x.shape[0]} images; pass mat_idx to "
                f"map matrices to images"
            )
        return x._device.put(np.arange(n_mat))
    idx = np.asarray(mat_idx.numpy() if isinstance(mat_idx, Tensor) else mat_idx).reshape(-1)
    if idx.shape[0] != n_mat or idx.dtype.kind not in "iu":
        raise ValueError(f"{op}: mat_idx must be {n_mat} integers, got {idx.shape} {idx.dtype}")
    check_range(idx, 0, x.shape[0], lambda lo, hi: IndexError(
        f"{op}: mat_idx must be in [0, {x.shape[0]}), got {idx.tolist()}"))
    return x._device.put(idx.astype(np.int64))


def warp_perspective(inp, mat, out_shape, mat_idx=None, border_mode: str = "replicate",
                     border_val: float = 0.0, format: str = "NCHW",  # noqa: A002
                     interp_mode: str = "linear") -> Tensor:
    """Perspective warp: output pixel ``(w, h)`` of image ``n`` reads the input at
    ``((M00 w + M01 h + M02) / d, (M10 w + M11 h + M12) / d)``, ``d = M20 w + M21 h + M22``
    (``M = mat[n]``, (B, 3, 3); the inverse of the matrix ``cv2.warpPerspective`` takes).
    ``mat_idx`` (B,) picks the source image of each matrix; ``border_mode`` is ``"replicate"``,
    ``"constant"`` (``border_val``), ``"reflect"``, ``"reflect_101"`` or ``"wrap"``.
    Differentiable in ``inp`` and ``mat``.

    Example::

        shift = mg.tensor([[[1.0, 0, 1], [0, 1, 1], [0, 0, 1]]])  # read (w + 1, h + 1)
        F.vision.warp_perspective(x, shift, (2, 2))  # x (1, 1, 4, 4) -> x[..., 1:3, 1:3]
    """
    return _warp("warp_perspective", inp, mat, 3, out_shape, mat_idx, border_mode, border_val,
                 format, interp_mode)


def warp_affine(inp, mat, out_shape, border_mode: str = "replicate", border_val: float = 0.0,
                format: str = "NHWC", interp_mode: str = "linear") -> Tensor:  # noqa: A002
    """Affine warp: output pixel ``(w, h)`` reads the input at ``M @ (w, h, 1)`` with
    ``M = mat[n]`` (B, 2, 3). Note MegEngine's default ``format="NHWC"``. Interpolation
    ``"linear"`` or ``"nearest"``; border modes as in :func:`warp_perspective`. Differentiable in
    ``inp`` and ``mat`` (MegEngine's is forward-only)."""
    return _warp("warp_affine", inp, mat, 2, out_shape, None, border_mode, border_val, format,
                 interp_mode)


def _warp(op, inp, mat, rows: int, out_shape, mat_idx, border_mode, border_val, format,  # noqa: A002
          interp_mode) -> Tensor:
    """The warps' shared body: output pixel ``(w, h)`` reads the input at ``mat @ (w, h, 1)``,
    divided by the third component for a perspective (3 x 3) matrix. The coordinates are Tensor
    ops of ``mat``, so the gradient reaches the matrix through ``Sample``'s coordinate gradient."""
    x = _to_nchw(op, _f(inp), format)
    m = mat if isinstance(mat, Tensor) else Tensor(mat, device=x._device)
    m = m.astype(x.dtype)
    if m.ndim != 3 or m.shape[1:] != (rows, 3):
        raise ValueError(f"{op}: mat must be (batch, {rows}, 3), got shape {m.shape}")
    oh, ow = _pair(out_shape, "out_shape", op)
    batch = _batch_index(op, x, m.shape[0], mat_idx)
    w, h = _grid(x, oh, ow)
    sx, sy = (_entry(m, r, 0) * w + _entry(m, r, 1) * h + _entry(m, r, 2) for r in range(2))
    if rows == 3:
        den = _entry(m, 2, 0) * w + _entry(m, 2, 1) * h + _entry(m, 2, 2)
        sx, sy = sx / den, sy / den
    out = _sample(op, x, stack([sx, sy], axis=-1), batch, border_mode, border_val, interp_mode)
    return _from_nchw(out, format)


def remap(inp, map_xy, border_mode: str = "replicate", scalar: float = 0.0,
          interp_mode: str = "linear") -> Tensor:
    """Relocate pixels: ``out[n, c, h, w] = inp[n, c, map_xy[n, h, w, 1], map_xy[n, h, w, 0]]``
    (x first, then y; interpolated). ``map_xy`` is (N, OH, OW, 2); border modes as in
    :func:`warp_perspective` with ``scalar`` for ``"constant"``. Differentiable in both inputs.

    Example::

        F.vision.remap(x, map_xy)  # x (1, 1, 4, 4), map_xy (1, 2, 2, 2) -> (1, 1, 2, 2)
    """
    op = "remap"
    x = _f(inp)
    _check_nchw(op, x)
    coords = map_xy if isinstance(map_xy, Tensor) else Tensor(map_xy, device=x._device)
    coords = coords.astype(x.dtype)
    if coords.ndim != 4 or coords.shape[-1] != 2 or coords.shape[0] != x.shape[0]:
        raise ValueError(
            f"{op}: map_xy must be ({x.shape[0]}, OH, OW, 2) for input {x.shape}, got "
            f"{coords.shape}"
        )
    batch = x._device.put(np.arange(x.shape[0]))
    return _sample(op, x, coords, batch, border_mode, scalar, interp_mode)


def _rois(op: str, x: Tensor, rois):
    r = rois._data if isinstance(rois, Tensor) else x._device.put(rois)
    if r.ndim != 2 or r.shape[1] != 5:
        raise ValueError(f"{op}: rois must be (K, 5) rows of (batch_idx, x1, y1, x2, y2), got "
                         f"shape {r.shape}")
    with x._device.context():
        batch = r[:, 0].astype(np.int64)
        if r.shape[0] and (int(batch.min()) < 0 or int(batch.max()) >= x.shape[0]):
            raise IndexError(f"{op}: roi batch indices must be in [0, {x.shape[0]})")
        return r.astype(np.float64), batch


def roi_align(inp, rois, output_shape, mode: str = "average", spatial_scale: float = 1.0,
              sample_points=2, aligned: bool = True) -> Tensor:
    """RoI Align (Mask R-CNN): each roi ``(batch_idx, x1, y1, x2, y2)`` of ``rois`` (K, 5) is cut
    into ``output_shape`` bins; each bin averages (``mode="average"``) or maxes (``"max"``)
    ``sample_points`` x ``sample_points`` bilinear samples at regular positions (pixels outside the
    image count as 0). ``aligned`` shifts the scaled box by -0.5 pixel. Output (K, C, ph, pw);
    differentiable in ``inp``."""
    op = "roi_align"
    x = _f(inp)
    _check_nchw(op, x)
    if mode.lower() not in ("average", "max"):
        raise ValueError(f"{op}: mode must be 'average' or 'max', got {mode!r}")
    ph, pw = _pair(output_shape, "output_shape", op)
    sh, sw = _pair(sample_points, "sample_points", op)
    if min(ph, pw, sh, sw) < 1:
        raise ValueError(f"{op}: output_shape {(ph, pw)} and sample_points {(sh, sw)} must be "
                         f">= 1 (adaptive sampling, sample_points=0, is not supported)")
    xp = x.xp
    r, batch = _rois(op, x, rois)
    with x._device.context():  # the sampling grid is built on x's device
        offset = 0.5 if aligned else 0.0
        start_x, start_y = r[:, 1] * spatial_scale - offset, r[:, 2] * spatial_scale - offset
        size_x = xp.maximum(r[:, 3] * spatial_scale - offset - start_x, 0.0)
        size_y = xp.maximum(r[:, 4] * spatial_scale - offset - start_y, 0.0)
        frac_y = (xp.arange(ph)[:, None] + (xp.arange(sh)[None, :] + 0.5) / sh).reshape(-1)
        frac_x = (xp.arange(pw)[:, None] + (xp.arange(sw)[None, :] + 0.5) / sw).reshape(-1)
        ys = start_y[:, None] + size_y[:, None] / ph * frac_y  # (K, ph*sh)
        xs = start_x[:, None] + size_x[:, None] / pw * frac_x  # (K, pw*sw)
        k = r.shape[0]
        grid = xp.stack([xp.broadcast_to(xs[:, None, :], (k, ph * sh, pw * sw)),
                         xp.broadcast_to(ys[:, :, None], (k, ph * sh, pw * sw))], axis=-1)
    samples = Sample()(x, _const(x, grid), batch, "constant", 0.0, False)
    samples = reshape(samples, (k, x.shape[1], ph, sh, pw, sw))
    reduce = _mean if mode.lower() == "average" else _max
    return reduce(samples, (3, 5))


def _deformable_rois(op: str, x: Tensor, rois, scale: float):
    """Deformable PSRoI pooling's box: corners rounded half away from zero, scaled, shifted by
    -0.5 pixel, the right/bottom edge one pixel further, and at least 0.1 wide and high."""
    r, batch = _rois(op, x, rois)
    xp = x.xp
    with x._device.context():
        c = xp.sign(r[:, 1:]) * xp.floor(xp.abs(r[:, 1:]) + 0.5)
        left, top = c[:, 0] * scale - 0.5, c[:, 1] * scale - 0.5
        width = xp.maximum((c[:, 2] + 1.0) * scale - 0.5 - left, 0.1)
        height = xp.maximum((c[:, 3] + 1.0) * scale - 0.5 - top, 0.1)
    return batch, left, top, width, height


def deformable_psroi_pooling(inp, rois, trans, no_trans: bool, part_size: int, pooled_h: int,
                             pooled_w: int, sample_per_part: int, spatial_scale: float,
                             trans_std: float = 0.1) -> Tensor:
    """Deformable RoI pooling (Deformable ConvNets): average pooling over ``pooled_h x pooled_w``
    bins of each roi, every bin shifted by a learned offset, with MegEngine's arguments.

    ``rois`` (R, 5) rows ``(batch_idx, x1, y1, x2, y2)`` in image coordinates; the box is rounded
    to whole pixels, scaled by ``spatial_scale`` and cut into bins. A bin averages
    ``sample_per_part`` x ``sample_per_part`` bilinear samples on a regular grid starting at its
    top-left corner, after moving the bin by ``trans[r, 0] * trans_std * roi_width`` in x and
    ``trans[r, 1] * trans_std * roi_height`` in y; ``trans`` is (R, 2, pooled_h, pooled_w) and bin
    ``(i, j)`` reads the offset of part ``(floor(i / pooled_h * part_size), floor(j / pooled_w *
    part_size))``. Samples further than half a pixel outside the image are left out of the
    average (a bin with none is 0); the others are clamped onto the image. ``no_trans=True`` pools
    without offsets (``trans`` is then ignored). Output (R, C, pooled_h, pooled_w), one output per
    input channel as in MegEngine's kernel. Differentiable in ``inp`` and ``trans``.
    """
    op = "deformable_psroi_pooling"
    x = _f(inp)
    _check_nchw(op, x)
    ph, pw, parts, spp = int(pooled_h), int(pooled_w), int(part_size), int(sample_per_part)
    if min(ph, pw, parts, spp) < 1:
        raise ValueError(f"{op}: pooled_h, pooled_w, part_size and sample_per_part must be >= 1, "
                         f"got {(ph, pw, parts, spp)}")
    if parts > min(ph, pw):
        raise ValueError(f"{op}: part_size {parts} must be <= pooled_h {ph} and pooled_w {pw}")
    xp, (_, _, h, w) = x.xp, x.shape
    batch, left, top, width, height = _deformable_rois(op, x, rois, float(spatial_scale))
    k = batch.shape[0]
    with x._device.context():
        sub = (xp.arange(spp) / spp)[None, :]
        fy = ((xp.arange(ph)[:, None] + sub).reshape(-1))[None, :]  # (1, ph*spp) in bins
        fx = ((xp.arange(pw)[:, None] + sub).reshape(-1))[None, :]
        base_y = (top[:, None] + height[:, None] / ph * fy).reshape(k, ph, spp, 1, 1)
        base_x = (left[:, None] + width[:, None] / pw * fx).reshape(k, 1, 1, pw, spp)
        base_y, base_x = [xp.broadcast_to(b, (k, ph, spp, pw, spp)) for b in (base_y, base_x)]
    cy, cx = _const(x, base_y), _const(x, base_x)
    if not no_trans:
        t = _f(trans)
        if t.ndim != 4 or t.shape[1:] != (2, ph, pw) or t.shape[0] < k:
            raise ValueError(f"{op}: trans must be ({k}, 2, {ph}, {pw}) (one (x, y) offset per "
                             f"bin of each roi), got shape {tuple(t.shape)}")
        part_y = np.floor(np.arange(ph) / ph * parts).astype(np.int64)
        part_x = np.floor(np.arange(pw) / pw * parts).astype(np.int64)
        offset = getitem(t, (slice(0, k), slice(None), part_y[:, None], part_x[None, :]))
        with x._device.context():
            scale_x = _const(x, (width * trans_std).reshape(k, 1, 1, 1, 1))
            scale_y = _const(x, (height * trans_std).reshape(k, 1, 1, 1, 1))
        cx = cx + reshape(getitem(offset, (slice(None), 0)), (k, ph, 1, pw, 1)) * scale_x
        cy = cy + reshape(getitem(offset, (slice(None), 1)), (k, ph, 1, pw, 1)) * scale_y
    vx, vy = cx._data, cy._data
    with x._device.context():  # raw-array work: on the GPU that holds the data
        valid = (vx >= -0.5) & (vx <= w - 0.5) & (vy >= -0.5) & (vy <= h - 0.5)
        count = valid.sum(axis=(2, 4))  # (R, ph, pw)
        weight = valid / xp.maximum(count, 1)[:, :, None, :, None]
    grid = stack([reshape(cx, (k, ph * spp, pw * spp)), reshape(cy, (k, ph * spp, pw * spp))], -1)
    samples = Sample()(x, grid, batch, "replicate", 0.0, False)  # (R, C, ph*spp, pw*spp)
    samples = reshape(samples, (k, x.shape[1], ph, spp, pw, spp))
    weighted = samples * _const(x, weight.reshape(k, 1, ph, spp, pw, spp))
    return _sum(weighted, (3, 5))


# --------------------------------------------------------------------------------------------------
# roi_pooling and nms


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _bins(start: int, length: int, pooled: int, limit: int):
    """Fast R-CNN's bin edges: ``[floor(i*b), ceil((i+1)*b))`` offset by ``start`` and clipped to
    the image, with ``b = length / pooled`` in float32 as MegEngine computes it."""
    b = np.float32(length) / np.float32(pooled)
    i = np.arange(pooled, dtype=np.float32)
    lo = np.floor(i * b).astype(np.int64) + start
    hi = np.ceil((i + 1) * b).astype(np.int64) + start
    return np.clip(lo, 0, limit), np.clip(hi, 0, limit)


class RoIPooling(Function):
    """Max or average over Fast R-CNN's variable-size bins of every roi. Loops over rois only:
    within a roi (cropped to the pixels its bins cover) the bins are masks, reduced over columns
    first and then rows; max remembers the winning pixel for backward."""

    def forward(self, x, boxes, batch, pooled, average, scale):
        xp, d = x.xp, x._data
        (ph, pw), (_, c, h, w) = pooled, d.shape
        out = xp.zeros((boxes.shape[0], c, ph, pw), d.dtype)
        self.shape, self.batch, self.average, self.saved = d.shape, batch, average, []
        for k in range(boxes.shape[0]):
            x1, y1, x2, y2 = (int(v) for v in _round_half_away(boxes[k, 1:] * scale))
            rows = _bins(y1, max(y2 - y1 + 1, 1), ph, h)
            cols = _bins(x1, max(x2 - x1 + 1, 1), pw, w)
            (r0, r1), (c0, c1) = (int(rows[0].min()), int(rows[1].max())), (
                int(cols[0].min()), int(cols[1].max()))
            if r1 <= r0 or c1 <= c0:  # the roi lies outside the image: every bin is empty
                self.saved.append(None)
                continue
            mr = _bin_mask(xp, rows, r0, r1)  # (ph, rows of the crop)
            mc = _bin_mask(xp, cols, c0, c1)  # (pw, columns of the crop)
            crop = d[int(batch[k]), :, r0:r1, c0:c1]
            if average:
                wr = (mr / xp.maximum(mr.sum(1, keepdims=True), 1)).astype(d.dtype)
                wc = (mc / xp.maximum(mc.sum(1, keepdims=True), 1)).astype(d.dtype)
                out[k] = wr @ crop @ wc.T  # an empty bin has an all-zero weight row
                self.saved.append((r0, c0, wr, wc))
                continue
            per_col = xp.where(mc[None, None], crop[:, :, None, :], -xp.inf)  # (C, h, pw, w)
            col_arg, col_max = per_col.argmax(-1), per_col.max(-1)  # (C, h, pw)
            per_row = xp.where(mr[None, :, :, None], col_max[:, None], -xp.inf)  # (C, ph, h, pw)
            row_arg, best = per_row.argmax(2), per_row.max(2)  # (C, ph, pw)
            empty = ~xp.isfinite(best)
            out[k] = xp.where(empty, 0, best)
            col = xp.take_along_axis(col_arg, row_arg, axis=1)
            self.saved.append((r0, c0, row_arg, col, empty))
        return out

    def backward(self, dy):
        xp, g = dy.xp, dy._data
        dx = xp.zeros(self.shape, g.dtype)
        for k, saved in enumerate(self.saved):
            if saved is None:
                continue
            image = dx[int(self.batch[k])]
            if self.average:
                r0, c0, wr, wc = saved
                image[:, r0 : r0 + wr.shape[1], c0 : c0 + wc.shape[1]] += wr.T @ g[k] @ wc
            else:
                r0, c0, row, col, empty = saved
                chan = xp.broadcast_to(xp.arange(g.shape[1])[:, None, None], row.shape)
                scatter_add(xp, image, (chan, row + r0, col + c0), g[k] * ~empty)
        return Tensor._wrap(dx, dy._device), None, None, None, None, None


def _bin_mask(xp, edges, start: int, stop: int):
    """(bins, stop - start) bool mask: pixel ``start + j`` lies in bin ``i``."""
    pos = xp.arange(start, stop)[None, :]
    return (pos >= xp.asarray(edges[0])[:, None]) & (pos < xp.asarray(edges[1])[:, None])


def roi_pooling(inp, rois, output_shape, mode: str = "max", scale: float = 1.0) -> Tensor:
    """RoI pooling (Fast R-CNN): each roi ``(batch_idx, x1, y1, x2, y2)`` (scaled by ``scale`` and
    rounded) is split into ``output_shape`` bins of whole pixels, each reduced by ``"max"`` or
    ``"average"``; an empty bin gives 0. Output (K, C, ph, pw), differentiable in ``inp``."""
    op = "roi_pooling"
    x = _f(inp)
    _check_nchw(op, x)
    if mode.lower() not in ("max", "average"):
        raise ValueError(f"{op}: mode must be 'max' or 'average', got {mode!r}")
    pooled = _pair(output_shape, "output_shape", op)
    if min(pooled) < 1:
        raise ValueError(f"{op}: output_shape must be positive, got {pooled}")
    r, batch = _rois(op, x, rois)
    return RoIPooling()(x, r, batch, pooled, mode.lower() == "average", float(scale))


def nms(boxes, scores, iou_thresh: float, max_output: int | None = None) -> Tensor:
    """Greedy non-maximum suppression: visit boxes (N, 4) as ``(x1, y1, x2, y2)`` by decreasing
    ``scores`` (N,), keep a box unless its IoU with an already kept one exceeds ``iou_thresh``.
    Returns the kept indices (int32), best first, at most ``max_output`` of them."""
    op = "nms"
    b = boxes._data if isinstance(boxes, Tensor) else np.asarray(boxes)
    s = scores._data if isinstance(scores, Tensor) else np.asarray(scores)
    device = boxes._device if isinstance(boxes, Tensor) else None
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"{op}: boxes must be (N, 4), got shape {b.shape}")
    if s.ndim != 1 or s.shape[0] != b.shape[0]:
        raise ValueError(f"{op}: scores must be ({b.shape[0]},), got shape {s.shape}")
    xp = boxes.xp if isinstance(boxes, Tensor) else np
    order = xp.argsort(-s, kind="stable")
    sb = b[order].astype(np.float64)
    area = (sb[:, 2] - sb[:, 0]) * (sb[:, 3] - sb[:, 1])
    limit = len(order) if max_output is None else int(max_output)
    alive = xp.ones(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if len(keep) >= limit:
            break
        if not bool(alive[i]):
            continue
        keep.append(i)
        lo = xp.maximum(sb[i, :2], sb[i + 1:, :2])
        hi = xp.minimum(sb[i, 2:], sb[i + 1:, 2:])
        inter = xp.prod(xp.clip(hi - lo, 0, None), axis=1)
        alive[i + 1:] &= ~(inter > (area[i] + area[i + 1:] - inter) * iou_thresh)
    kept = order[xp.asarray(keep, dtype=np.int64)].astype(np.int32)
    return Tensor._wrap(kept, device) if device is not None else Tensor(kept)


# --------------------------------------------------------------------------------------------------
# flip, rot90 and colour conversion (NHWC, as MegEngine's)


def flip(inp, vertical: bool = True, horizontal: bool = True) -> Tensor:
    """Mirror NHWC images top-to-bottom (``vertical``) and/or left-to-right (``horizontal``)."""
    x = inp if isinstance(inp, Tensor) else Tensor(inp)
    _check_nchw("flip", x, "(N, H, W, C)")
    rev = slice(None, None, -1)
    return getitem(x, (slice(None), rev if vertical else slice(None),
                       rev if horizontal else slice(None)))


def rot90(inp, clockwise: bool = True) -> Tensor:
    """Rotate NHWC images by 90 degrees (output (N, W, H, C))."""
    x = inp if isinstance(inp, Tensor) else Tensor(inp)
    _check_nchw("rot90", x, "(N, H, W, C)")
    t = transpose(x, (0, 2, 1, 3))
    return flip(t, vertical=not clockwise, horizontal=clockwise)


# float conversions as (out_channels x in_channels) matrices plus an offset; the YUV pair follows
# MegEngine's kernels, whose RGB2YUV weights channel 0 by 0.114 (the blue weight)
_GRAY_RGB = [[0.299, 0.587, 0.114]]
_GRAY_BGR = [[0.114, 0.587, 0.299]]
_RGB2YUV_Y = [0.114, 0.587, 0.299]
_FLOAT_MODES = {
    "RGB2GRAY": (_GRAY_RGB, [0.0]),
    "BGR2GRAY": (_GRAY_BGR, [0.0]),
    "RGBA2GRAY": ([_GRAY_RGB[0] + [0.0]], [0.0]),
    "GRAY2RGB": ([[1.0], [1.0], [1.0]], [0.0] * 3),
    "RGB2BGR": ([[0, 0, 1.0], [0, 1.0, 0], [1.0, 0, 0]], [0.0] * 3),
    "BGR2RGB": ([[0, 0, 1.0], [0, 1.0, 0], [1.0, 0, 0]], [0.0] * 3),
    "RGBA2RGB": ([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]], [0.0] * 3),
    "RGBA2BGR": ([[0, 0, 1.0, 0], [0, 1.0, 0, 0], [1.0, 0, 0, 0]], [0.0] * 3),
    "RGB2YUV": (
        [_RGB2YUV_Y,
         [0.492 * (1 - _RGB2YUV_Y[0]), -0.492 * _RGB2YUV_Y[1], -0.492 * _RGB2YUV_Y[2]],
         [-0.877 * _RGB2YUV_Y[0], -0.877 * _RGB2YUV_Y[1], 0.877 * (1 - _RGB2YUV_Y[2])]],
        [0.0, 0.5, 0.5],
    ),
    "YUV2RGB": (
        [[1.0, 2.032, 0.0], [1.0, -0.395, -0.581], [1.0, 0.0, 1.140]],
        [-0.5 * 2.032, 0.5 * (0.395 + 0.581), -0.5 * 1.140],
    ),
}


def _descale(v):
    """Round a 14-bit fixed-point value to an integer (MegEngine's uint8 colour arithmetic)."""
    return (v + (1 << 13)) >> 14


def _cvt_uint8(xp, d, mode: str):
    v = d.astype(np.int32)
    c = [v[..., i] for i in range(v.shape[-1])]
    if mode in ("RGB2GRAY", "RGBA2GRAY", "BGR2GRAY"):
        r, b = (c[2], c[0]) if mode == "BGR2GRAY" else (c[0], c[2])
        out = [_descale(r * 4899 + c[1] * 9617 + b * 1868)]
    elif mode == "RGB2YUV":
        y = _descale(c[0] * 1868 + c[1] * 9617 + c[2] * 4899)
        half = 128 << 14
        out = [y, _descale((c[0] - y) * 8061 + half), _descale((c[2] - y) * 14369 + half)]
    elif mode == "YUV2RGB":
        y, u, w = c[0], c[1] - 128, c[2] - 128
        out = [y + _descale(u * 33292), y + _descale(w * -9519 + u * -6472),
               y + _descale(w * 18678)]
    else:  # channel selections and GRAY2RGB
        mat = _FLOAT_MODES[mode][0]
        out = [c[int(np.argmax(row))] for row in mat]
    return xp.clip(xp.stack(out, axis=-1), 0, 255).astype(np.uint8)


def cvt_color(inp, mode: str = "") -> Tensor:
    """Convert NHWC images between colour spaces: ``RGB2GRAY``, ``BGR2GRAY``, ``RGBA2GRAY``,
    ``GRAY2RGB``, ``RGB2BGR``, ``BGR2RGB``, ``RGBA2RGB``, ``RGBA2BGR``, ``RGB2YUV``, ``YUV2RGB``.
    Float images use MegEngine's float formulas (gray = 0.299 R + 0.587 G + 0.114 B) and are
    differentiable; uint8 images use its 14-bit fixed-point arithmetic with rounding. The planar
    YUV420 formats (NV12, NV21, YV12, YU12) are not supported.

    Example::

        F.vision.cvt_color(x, mode="RGB2GRAY")  # (N, H, W, 3) -> (N, H, W, 1)
    """
    op = "cvt_color"
    key = mode.upper()
    if key not in _FLOAT_MODES:
        raise ValueError(f"{op}: unsupported mode {mode!r}, expected one of {sorted(_FLOAT_MODES)}")
    x = inp if isinstance(inp, Tensor) else Tensor(inp)
    mat, bias = _FLOAT_MODES[key]
    if x.ndim != 4 or x.shape[-1] != len(mat[0]):
        raise ValueError(
            f"{op}: mode {key} needs NHWC images with {len(mat[0])} channels, got shape {x.shape}"
        )
    if x.dtype == np.uint8:
        return Tensor._wrap(_cvt_uint8(x.xp, x._data, key), x._device)
    x = _f(x)
    return matmul(x, transpose(_const(x, mat), (1, 0))) + _const(x, bias)

