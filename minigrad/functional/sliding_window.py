"""Sliding-window ops: ``sliding_window`` (unfold), ``sliding_window_transpose`` (fold), and the
convolutions MegEngine builds on them, ``local_conv2d`` (untied weights), ``conv3d`` and
``conv_transpose3d``.

Two primitives do all the work and are each other's adjoint:

* ``Unfold`` copies every window of a zero-padded ``(N, C, *spatial)`` input into a
  ``(N, C, *out, *kernel)`` array through one strided view (``as_strided``);
* ``Fold`` sums such windows back onto the image, one strided ``+=`` per kernel offset.

Unfold's backward is Fold and Fold's backward is Unfold, so gradients of any order come for free,
and the convolutions are an ``einsum`` of the windows with the weight. That is the readable
"im2col + GEMM" form: it keeps a ``prod(kernel)``-times larger copy of the input, so it suits small
volumes (conv2d, the hot path, has its own kernels in ``conv.py``).
"""

from __future__ import annotations

import itertools

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.functional._util import ntuple
from minigrad.functional.conv import _add_bias, _check_mode, _out_size
from minigrad.functional.elementwise import _f
from minigrad.functional.linalg import einsum
from minigrad.functional.shape import reshape

__all__ = ["conv3d", "conv_transpose3d", "local_conv2d", "region_restricted_conv",
           "sliding_window", "sliding_window_transpose"]


def _window_args(op, shape: tuple, kernel, stride, padding, dilation):
    """Check an unfold's arguments against the (N, C, *spatial) input ``shape``; return them with
    the output size per spatial axis."""
    n = len(shape) - 2
    if n < 1:
        raise ValueError(f"{op}: expected an input (N, C, *spatial), got shape {shape}")
    kernel, stride = ntuple(kernel, n, "kernel_size", op), ntuple(stride, n, "stride", op)
    padding, dilation = ntuple(padding, n, "padding", op), ntuple(dilation, n, "dilation", op)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(
            f"{op}: need kernel_size, stride, dilation >= 1 and padding >= 0; got kernel_size="
            f"{kernel}, stride={stride}, padding={padding}, dilation={dilation}"
        )
    out = tuple(_out_size(*a) for a in zip(shape[2:], kernel, stride, padding, dilation))
    if min(out) < 1:
        raise ValueError(
            f"{op}: input {shape} is too small for kernel {kernel} with padding {padding} and "
            f"dilation {dilation} (output would be {out})"
        )
    return kernel, stride, padding, dilation, out


def _offset_index(k: tuple, out: tuple, stride: tuple, dilation: tuple) -> tuple:
    """The slices of a padded image that kernel offset ``k`` sees over all output positions."""
    return (slice(None), slice(None)) + tuple(
        slice(ki * d, ki * d + s * (o - 1) + 1, s)
        for ki, o, s, d in zip(k, out, stride, dilation)
    )


class Unfold(Function):
    """(N, C, *spatial) -> (N, C, *out, *kernel): every window, through one strided view."""

    def forward(self, x, kernel, stride, padding, dilation, out):
        xp, d = x.xp, x._data
        self.args = (d.shape[2:], kernel, stride, padding, dilation)
        if any(padding):
            d = xp.pad(d, ((0, 0), (0, 0)) + tuple((p, p) for p in padding))
        strides = d.strides
        view = xp.lib.stride_tricks.as_strided(
            d,
            shape=d.shape[:2] + out + kernel,
            strides=strides[:2]
            + tuple(st * s for st, s in zip(strides[2:], stride))
            + tuple(st * dl for st, dl in zip(strides[2:], dilation)),
        )
        return xp.ascontiguousarray(view)

    def backward(self, dy):
        size, kernel, stride, padding, dilation = self.args
        return Fold()(dy, size, kernel, stride, padding, dilation), None, None, None, None, None


class Fold(Function):
    """(N, C, *out, *kernel) -> (N, C, *spatial): sum every window back onto the image (Unfold's
    adjoint: overlapping windows add up)."""

    def forward(self, y, size, kernel, stride, padding, dilation):
        xp, d = y.xp, y._data
        n = len(kernel)
        out = d.shape[2 : 2 + n]
        self.args = (kernel, stride, padding, dilation, out)
        padded = xp.zeros(d.shape[:2] + tuple(s + 2 * p for s, p in zip(size, padding)), d.dtype)
        for k in itertools.product(*(range(kk) for kk in kernel)):
            padded[_offset_index(k, out, stride, dilation)] += d[(Ellipsis,) + k]
        crop = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, size))
        return xp.ascontiguousarray(padded[crop])

    def backward(self, dx):
        kernel, stride, padding, dilation, out = self.args
        return Unfold()(dx, kernel, stride, padding, dilation, out), None, None, None, None, None


def sliding_window(inp, kernel_size, padding=0, stride=1, dilation=1) -> Tensor:
    """Every ``kernel_size`` window of a zero-padded (N, C, H, W) input: output
    ``(N, C, OH, OW, kh, kw)`` with ``OH = (H + 2p - d*(kh-1) - 1) // s + 1``. Differentiable (the
    gradient sums overlapping windows). Works for any number of spatial axes.

    Example::

        F.sliding_window(x, 3, padding=1).shape  # x (2, 4, 8, 8) -> (2, 4, 8, 8, 3, 3)
    """
    x = _f(inp)
    kernel, stride, padding, dilation, out = _window_args(
        "sliding_window", x.shape, kernel_size, stride, padding, dilation
    )
    return Unfold()(x, kernel, stride, padding, dilation, out)


def sliding_window_transpose(inp, output_size, kernel_size, padding=0, stride=1,
                             dilation=1) -> Tensor:
    """The adjoint of ``sliding_window``: sum (N, C, OH, OW, kh, kw) windows into an
    ``output_size`` image, overlaps adding up."""
    op = "sliding_window_transpose"
    y = _f(inp)
    n = (y.ndim - 2) // 2
    if n < 1 or y.ndim != 2 + 2 * n:
        raise ValueError(f"{op}: expected (N, C, *out, *kernel) windows, got shape {y.shape}")
    size = ntuple(output_size, n, "output_size", op)
    kernel, stride, padding, dilation, out = _window_args(
        op, (1, 1) + size, kernel_size, stride, padding, dilation
    )
    if y.shape[2:] != out + kernel:
        raise ValueError(
            f"{op}: windows of shape {y.shape[2:]} do not match output_size {size} with kernel "
            f"{kernel} (expected {out + kernel})"
        )
    return Fold()(y, size, kernel, stride, padding, dilation)


def _conv_inputs(op: str, inp, weight, conv_mode: str, layout: str):
    """Float input and weight of a convolution; the input must have ``layout``'s rank."""
    _check_mode(op, conv_mode)
    x, w = _f(inp), _f(weight)
    ndim = layout.count(",") + 1
    if x.ndim != ndim:
        raise ValueError(f"{op}: expected a {ndim}-D input {layout}, got shape {x.shape}")
    return x, w


def _grouped_windows(op, x: Tensor, weight, groups: int, per_group: int, kernel, stride, padding,
                     dilation, expect_out=None):
    """The windows of ``x`` as (N, groups, in/groups, *out, *kernel) for a convolution whose
    ``weight`` reads ``per_group`` input channels per group, and the output size; every mismatch
    is an error naming ``op``."""
    if per_group * groups != x.shape[1]:
        raise ValueError(
            f"{op}: input has {x.shape[1]} channels (shape {x.shape}) but weight "
            f"{tuple(weight.shape)} expects {per_group * groups} (= {per_group} per group x "
            f"{groups} groups)"
        )
    kernel, stride, padding, dilation, out = _window_args(
        op, x.shape, kernel, stride, padding, dilation)
    if expect_out is not None and out != expect_out:
        raise ValueError(
            f"{op}: weight is for a {expect_out} output but input {x.shape} with kernel {kernel}, "
            f"stride {stride}, padding {padding} gives {out}"
        )
    windows = Unfold()(x, kernel, stride, padding, dilation, out)
    return reshape(windows, (x.shape[0], groups, per_group) + out + kernel), out


def local_conv2d(inp, weight, bias=None, stride=1, padding=0, dilation=1,
                 conv_mode: str = "cross_correlation") -> Tensor:
    """Locally connected layer: a 2-D convolution whose kernel differs at every output position.

    ``weight`` is MegEngine's ``(OH, OW, IC, kh, kw, OC)``, or with groups
    ``(G, OH, OW, IC/G, kh, kw, OC/G)``; ``bias`` is (OC,) or (1, OC, 1, 1).
    ``out[n, o, y, x] = sum_{i, h, w} window[n, i, y, x, h, w] * weight[y, x, i, h, w, o]``.
    """
    op = "local_conv2d"
    x, w = _conv_inputs(op, inp, weight, conv_mode, "(N, C, H, W)")
    if w.ndim == 6:
        w = reshape(w, (1,) + w.shape)
    if w.ndim != 7:
        raise ValueError(
            f"{op}: weight must be (OH, OW, IC, kh, kw, OC) or grouped "
            f"(G, OH, OW, IC/G, kh, kw, OC/G), got shape {tuple(weight.shape)}"
        )
    g, oh, ow, icg, kh, kw, ocg = w.shape
    windows, out = _grouped_windows(op, x, weight, g, icg, (kh, kw), stride, padding, dilation,
                                    expect_out=(oh, ow))
    y = einsum("ngiyxhw,gyxihwo->ngoyx", windows, w)
    return _add_bias(op, reshape(y, (x.shape[0], g * ocg) + out), bias)


def _region_ids(op: str, name: str, ids, shape: tuple) -> Tensor:
    """``ids`` as an integer Tensor of ``shape``; region ids are labels, so floats are refused."""
    ids = ids if isinstance(ids, Tensor) else Tensor(np.asarray(ids))
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must hold integer region ids (int32 or uint8), got "
                        f"{ids.dtype.name}")
    if tuple(ids.shape) != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(ids.shape)}")
    return ids


def region_restricted_conv(inp, weight, rin, rout, bias=None, stride=1, padding=0, dilation=1,
                           groups: int = 1, conv_mode: str = "cross_correlation",
                           compute_mode: str = "default") -> Tensor:
    """A grouped 2-D convolution in which an input pixel only feeds output pixels of its own region.

    ``rin`` (N, H, W) labels every input pixel with an integer region id and ``rout``
    (N, OH, OW) every output pixel; a kernel tap contributes only where the two ids are equal:
    ``out[n, g*OCPG + o, y, x] = sum_{i, h, w} weight[g, o, i, h, w] * window[n, g, i, y, x, h, w]
    * (rin_window[n, y, x, h, w] == rout[n, y, x])`` (zero padding contributes nothing). With
    every id equal it is ``conv2d``. This lets a segmentation network convolve each object
    without mixing in its neighbours. ``weight`` is always grouped, ``(groups, OC/groups,
    IC/groups, kh, kw)``, as MegEngine's; ``bias`` is (1, OC, 1, 1) or (OC,). Differentiable in
    ``inp``, ``weight`` and ``bias`` (the ids are labels). ``compute_mode`` is accepted for
    MegEngine's signature; accumulation is in the input's dtype.
    """
    op = "region_restricted_conv"
    x, w = _conv_inputs(op, inp, weight, conv_mode, "(N, C, H, W)")
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}")
    if w.ndim != 5 or w.shape[0] != groups:
        raise ValueError(
            f"{op}: weight must be grouped (groups, OC/groups, IC/groups, kh, kw) with groups="
            f"{groups}, got shape {tuple(weight.shape)}"
        )
    g, ocg, icg, kh, kw = w.shape
    windows, out = _grouped_windows(op, x, weight, g, icg, (kh, kw), stride, padding, dilation)
    n, (h, wd) = x.shape[0], x.shape[2:]
    rin = reshape(_region_ids(op, "rin", rin, (n, h, wd)), (n, 1, h, wd))
    rout = _region_ids(op, "rout", rout, (n,) + out)
    kernel, stride, padding, dilation, _ = _window_args(
        op, x.shape, (kh, kw), stride, padding, dilation)
    rin_windows = Unfold()(rin, kernel, stride, padding, dilation, out)  # (N, 1, OH, OW, kh, kw)
    same = rin_windows == reshape(rout, (n, 1) + out + (1, 1))
    mask = reshape(same.astype(x.dtype), (n, 1, 1) + out + kernel)
    y = einsum("ngiyxhw,goihw->ngoyx", windows * mask, w)
    return _add_bias(op, reshape(y, (n, g * ocg) + out), bias)


def conv3d(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
           conv_mode: str = "cross_correlation") -> Tensor:
    """3-D cross-correlation over an (N, C, D, H, W) input.

    ``weight`` is (out, in/groups, kd, kh, kw) or MegEngine's grouped
    (groups, out/groups, in/groups, kd, kh, kw); ``bias`` (out,) or (1, out, 1, 1, 1).

    Example::

        y = F.conv3d(x, w, padding=1)  # x (2, 3, 8, 8, 8), w (4, 3, 3, 3, 3) -> (2, 4, 8, 8, 8)
    """
    op = "conv3d"
    x, w = _conv_inputs(op, inp, weight, conv_mode, "(N, C, D, H, W)")
    if w.ndim == 5:
        if groups < 1 or w.shape[0] % groups:
            raise ValueError(f"{op}: groups={groups} must divide the {w.shape[0]} output channels")
        w = reshape(w, (groups, w.shape[0] // groups) + w.shape[1:])
    if w.ndim != 6 or w.shape[0] != groups:
        raise ValueError(
            f"{op}: weight must be (out, in/groups, kd, kh, kw) or grouped (groups={groups}, "
            f"out/groups, in/groups, kd, kh, kw), got shape {tuple(weight.shape)}"
        )
    g, ocg, icg = w.shape[:3]
    windows, out = _grouped_windows(op, x, weight, g, icg, w.shape[3:], stride, padding, dilation)
    y = einsum("ngidhwxyz,goixyz->ngodhw", windows, w)
    return _add_bias(op, reshape(y, (x.shape[0], g * ocg) + out), bias)



class ScatterConv(Function):
    """The transposed convolution's core, ``(N, G, I, *in) x (G, I, O, *kernel) -> (N, G*O,
    *size)``: for each kernel offset, one ``einsum`` of the input with that offset's weights is
    added onto the strided positions it reaches in a zero-padded output (the padding is cropped
    at the end). Working offset by offset keeps memory at the output's size, where
    materialising every window (``Fold`` of an einsum) would take ``prod(kernel)`` times more.
    The backward reads the same strided views of ``dy``; it is first order only, like the
    other convolution kernels."""

    def forward(self, x, w, size, stride, padding, dilation):
        xp, xd, wd = x.xp, x._data, w._data
        n, g, _, *spatial = xd.shape
        kernel, o = wd.shape[3:], wd.shape[2]
        self.x, self.w = x, w
        self.args = (kernel, tuple(spatial), stride, padding, dilation, size)
        padded = xp.zeros((n, g * o) + tuple(s + 2 * p for s, p in zip(size, padding)), xd.dtype)
        for k in itertools.product(*(range(kk) for kk in kernel)):
            part = xp.einsum("ngidhw,gio->ngodhw", xd, wd[(Ellipsis,) + k])
            padded[_offset_index(k, spatial, stride, dilation)] += part.reshape(
                (n, g * o) + tuple(spatial))
        crop = (slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(padding, size))
        return xp.ascontiguousarray(padded[crop])

    def backward(self, dy):
        kernel, spatial, stride, padding, dilation, _ = self.args
        xp, xd, wd = dy.xp, self.x._data, self.w._data
        n, g, i = xd.shape[:3]
        o = wd.shape[2]
        pad = ((0, 0), (0, 0)) + tuple((p, p) for p in padding)
        dyp = xp.pad(dy._data, pad)
        dx = xp.zeros_like(xd) if self.needs_input_grad(0) else None
        dw = xp.zeros_like(wd) if self.needs_input_grad(1) else None
        for k in itertools.product(*(range(kk) for kk in kernel)):
            view = dyp[_offset_index(k, spatial, stride, dilation)]
            view = view.reshape((n, g, o) + tuple(spatial))
            if dx is not None:
                dx += xp.einsum("ngodhw,gio->ngidhw", view, wd[(Ellipsis,) + k])
            if dw is not None:
                dw[(Ellipsis,) + k] = xp.einsum("ngidhw,ngodhw->gio", xd, view)
        return dx, dw, None, None, None, None


def conv_transpose3d(inp, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                     groups: int = 1) -> Tensor:
    """Transposed 3-D convolution over (N, C, D, H, W) (the adjoint of :func:`conv3d`).

    ``weight`` is MegEngine's ``(in, out, kd, kh, kw)``, or with groups ``(groups, in/groups,
    out/groups, kd, kh, kw)``; ``bias`` (out,) or (1, out, 1, 1, 1). Each output size is
    ``(size - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1``. Every input
    position scatters a ``weight``-scaled window onto the output (see :class:`ScatterConv`).

    Example::

        # x (1, 4, 3, 3, 3), w (4, 2, 2, 2, 2) -> (1, 2, 6, 6, 6)
        y = F.conv_transpose3d(x, w, stride=2)
    """
    op = "conv_transpose3d"
    x, w = _conv_inputs(op, inp, weight, "cross_correlation", "(N, C, D, H, W)")
    if w.ndim == 5:
        if groups != 1:
            raise ValueError(f"{op}: groups={groups} needs a grouped weight (groups, in/groups, "
                             f"out/groups, kd, kh, kw), got shape {tuple(w.shape)}")
        w = reshape(w, (1,) + w.shape)
    if w.ndim != 6 or w.shape[0] != groups or w.shape[0] * w.shape[1] != x.shape[1]:
        raise ValueError(
            f"{op}: input has {x.shape[1]} channels (shape {x.shape}) but weight "
            f"{tuple(weight.shape)} is not (in, out, kd, kh, kw) or (groups={groups}, in/groups, "
            "out/groups, kd, kh, kw) for it"
        )
    g, icg, ocg = w.shape[:3]
    kernel = w.shape[3:]
    common = np.result_type(x.dtype, w.dtype)  # float16 input, float32 weight: float32
    x, w = (t if t.dtype == common else t.astype(common) for t in (x, w))
    stride, padding, dilation = (ntuple(v, 3, name, op) for v, name in
                                 ((stride, "stride"), (padding, "padding"),
                                  (dilation, "dilation")))
    out_pad = ntuple(output_padding, 3, "output_padding", op)
    for a in range(3):
        if not 0 <= out_pad[a] < max(stride[a], dilation[a]):
            raise ValueError(f"{op}: output_padding {out_pad} must be smaller than stride "
                             f"{stride} or dilation {dilation}")
    size = tuple((x.shape[2 + a] - 1) * stride[a] - 2 * padding[a]
                 + dilation[a] * (kernel[a] - 1) + out_pad[a] + 1 for a in range(3))
    if min(size) < 1:
        raise ValueError(f"{op}: output size {size} is not positive for input {x.shape}")
    xg = reshape(x, (x.shape[0], g, icg) + x.shape[2:])
    y = ScatterConv()(xg, w, size, stride, padding, dilation)
    return _add_bias(op, y, bias)
