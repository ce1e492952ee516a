"""Convolution and pooling: the NN primitives that own their backward.

Convolutions are matrix products around the fused layout kernels of ``minigrad.backend.kernels``:

* ``kernels.im2col`` copies every receptive field of an NCHW image into a ``(C*kh*kw, N*OH*OW)``
  matrix (zeros for the padding, no padded copy), so a convolution is one big matrix product
  (BLAS) with the ``(O, C*kh*kw)`` weights;
* ``kernels.from_product_layout`` turns the ``(O, N*OH*OW)`` product into NCHW and adds the bias
  in the same pass; ``kernels.to_product_layout`` is the way back for the output gradient and sums
  the bias gradient on the way;
* ``kernels.col2im`` is im2col's adjoint: it adds such a matrix back onto the image (the input
  gradient).

conv_transpose2d is conv2d's adjoint in its input and uses the same kernels the other way round.
Max pooling saves each window's winning index (``kernels.max_pool2d``), so its backward is one
scatter; average pooling loops over the ``kh*kw`` kernel offsets with strided slices.

The backward passes here work on raw arrays, so gradients through convolution and pooling are
first-order only (a second-order gradient treats them as constants).
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import blas, kernels
from minigrad.functional._util import autocast_low, compute_mode_inputs
from minigrad.functional.elementwise import _f
from minigrad.functional.linalg import matmul
from minigrad.functional.shape import reshape

__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "max_pool2d",
]


# --------------------------------------------------------------------------------------------------
# argument handling


def _pair(value, name: str, op: str) -> tuple[int, int]:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` stays; anything else is an error naming the op."""
    if isinstance(value, Tensor):
        value = value.numpy().tolist()
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{op}: {name} must be an int or a pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _pad(xp, x, ph: int, pw: int):
    if ph == 0 and pw == 0:
        return x
    return xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _offset(i: int, j: int, oh: int, ow: int, stride, dilation) -> tuple:
    """The (rows, cols) slices of a padded image that kernel offset ``(i, j)`` sees over all
    ``oh x ow`` outputs."""
    (sh, sw), (dh, dw) = stride, dilation
    return (
        slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
        slice(j * dw, j * dw + sw * (ow - 1) + 1, sw),
    )


# A long-reduction matrix product with a tiny result (LeNet's first weight gradient is
# (6, 36864) @ (36864, 25)) is slower in OpenBLAS than the same work as a batch of products over
# slabs of the reduction axis, which fit its small-matrix kernels. Measured on an AMD EPYC (Zen 5,
# two threads) with 1024-element slabs: 0.09 against 0.49 ms on OpenBLAS's AVX-512 kernels, 0.34
# against 0.40-0.50 ms on its AVX2 ones (4096-element slabs: 0.10 and 0.42 ms).
_SLAB = 1024
_SMALL_RESULT = 1024


def _weight_grad(xp, dmat, cols, out=None):
    """``dmat (g, O, P) @ cols (g, K, P)^T`` (into ``out`` when given), summed over slabs of P
    when that is faster."""
    g, o, p = dmat.shape
    k = cols.shape[1]
    if xp is np and o * k <= _SMALL_RESULT and p > _SLAB:
        slabs = next((s for s in range(-(-p // _SLAB), 4 * -(-p // _SLAB)) if p % s == 0), 1)
        d = dmat.reshape(g, o, slabs, p // slabs).swapaxes(1, 2)
        c = cols.reshape(g, k, slabs, p // slabs).transpose(0, 2, 3, 1)
        return blas.matmul(d, c).sum(axis=1, out=out)
    return blas.matmul(dmat, cols.swapaxes(-1, -2), out=out)


def _crop(x, ph: int, pw: int, h: int, w: int):
    if ph == 0 and pw == 0 and x.shape[2] == h and x.shape[3] == w:
        return x
    return x[:, :, ph : ph + h, pw : pw + w]


# --------------------------------------------------------------------------------------------------
# convolution


def _operands(x: Tensor, w: Tensor) -> tuple:
    """What a 2-d convolution kernel reads: the array module, the input's and the weight's
    arrays, and their shapes ``(N, C, H, W)`` and ``(A, B, kh, kw)``."""
    xd, wd = x._data, w._data
    return x.xp, xd, wd, xd.shape, wd.shape


class Conv2d(Function):
    """Per group: ``out (O/g, N*OH*OW) = W (O/g, K) @ im2col(x) (K, N*OH*OW)``, plus the bias."""

    def forward(self, x, w, b, stride, padding, dilation, groups):
        xp, xd, wd, (n, c, h, wid), (o, cg, kh, kw) = _operands(x, w)
        oh = _out_size(h, kh, stride[0], padding[0], dilation[0])
        ow = _out_size(wid, kw, stride[1], padding[1], dilation[1])
        geometry = ((kh, kw), stride, padding, dilation, (oh, ow))
        cols = kernels.im2col(xd, *geometry).reshape(groups, cg * kh * kw, -1)
        out = blas.matmul(wd.reshape(groups, o // groups, cg * kh * kw), cols)
        self.cols, self.wd, self.has_bias = cols, wd, b is not None
        self.args = (xd.shape, geometry, groups)
        out = kernels.from_product_layout(out.reshape(o, -1), n, None if b is None else b._data)
        return out.reshape(n, o, oh, ow)

    def backward(self, dy):
        xshape, geometry, g = self.args
        wd, cols, xp = self.wd, self.cols, dy.xp
        o, cg, kh, kw = wd.shape
        dmat, db = kernels.to_product_layout(dy._data)
        dmat = dmat.reshape(g, o // g, -1)
        dx = dw = None
        if self.needs_input_grad(1):  # into data parallelism's gradient bucket when offered
            dtype = dmat.dtype
            buf = self.grad_buffer(1, wd.shape, dtype) if dtype == cols.dtype else None
            if buf is None:
                dw = _weight_grad(xp, dmat, cols).reshape(wd.shape)
            else:  # the buffer itself is the gradient (the bucket recognises it)
                dw = buf
                _weight_grad(xp, dmat, cols, out=buf.reshape(g, o // g, -1))
        if self.needs_input_grad(0):
            dcols = blas.matmul(wd.reshape(g, o // g, cg * kh * kw).swapaxes(-1, -2), dmat)
            dx = kernels.col2im(dcols.reshape(-1, dcols.shape[-1]), xshape, *geometry)
        return dx, dw, db if self.has_bias else None, None, None, None, None


class ConvTranspose2d(Function):
    """conv2d's adjoint in its input: ``out = col2im(W^T @ x)``, weight (Cin, Cout/g, kh, kw)."""

    def forward(self, x, w, stride, padding, dilation, groups, out_hw):
        xp, xd, wd, (n, cin, h, wid), (_, og, kh, kw) = _operands(x, w)
        xmat = xp.ascontiguousarray(xd.transpose(1, 0, 2, 3)).reshape(groups, cin // groups, -1)
        wmat = wd.reshape(groups, cin // groups, og * kh * kw)
        cols = blas.matmul(wmat.swapaxes(-1, -2), xmat)  # (g, Cout/g*kh*kw, N*H*W)
        geometry = ((kh, kw), stride, padding, dilation, (h, wid))
        self.xmat, self.wd, self.args = xmat, wd, (xd.shape, geometry, groups)
        return kernels.col2im(cols.reshape(-1, cols.shape[-1]), (n, og * groups) + out_hw,
                              *geometry)

    def backward(self, dy):
        xshape, geometry, g = self.args
        xp, xmat, wd = dy.xp, self.xmat, self.wd
        n, cin, h, wid = xshape
        _, og, kh, kw = wd.shape
        # the output of forward is exactly dy's shape (output_padding included)
        cols = kernels.im2col(dy._data, *geometry).reshape(g, og * kh * kw, -1)
        dx = dw = None
        if self.needs_input_grad(0):
            dxm = blas.matmul(wd.reshape(g, cin // g, og * kh * kw), cols)
            dx = kernels.from_product_layout(dxm.reshape(cin, -1), n).reshape(xshape)
        if self.needs_input_grad(1):
            dw = _weight_grad(xp, xmat, cols).reshape(wd.shape)
        return dx, dw, None, None, None, None, None


def _check_input(op: str, inp: Tensor, ndim: int = 4) -> None:
    if inp.ndim != ndim:
        layout = "(N, C, H, W)" if ndim == 4 else "(N, C, L)"
        raise ValueError(f"{op}: expected a {ndim}-D input {layout}, got shape {inp.shape}")


def _group_weight(op: str, weight: Tensor, groups: int) -> Tensor:
    """Accept MegEngine's grouped 5-D weight (g, a, b, kh, kw) besides the 4-D (g*a, b, kh, kw)."""
    if weight.ndim == 5:
        if weight.shape[0] != groups:
            raise ValueError(
                f"{op}: grouped weight {weight.shape} has {weight.shape[0]} groups, "
                f"expected {groups}"
            )
        return reshape(weight, (weight.shape[0] * weight.shape[1],) + weight.shape[2:])
    if weight.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D weight (or 5-D grouped), got shape {weight.shape}")
    return weight


def _bias_vector(op: str, bias, c: int):
    """A per-channel bias given as (C,) or MegEngine's (1, C, 1, 1) / (1, C, 1), as a (C,) Tensor
    (None stays None)."""
    if bias is None:
        return None
    bias = _f(bias)
    if bias.size != c or (bias.ndim > 1 and bias.shape[1] != c):
        raise ValueError(f"{op}: bias shape {bias.shape} does not match {c} output channels")
    return reshape(bias, (c,))


def _add_bias(op: str, out: Tensor, bias) -> Tensor:
    """``out + bias`` over the channel axis 1 (a plain add: dtypes promote as usual)."""
    bias = _bias_vector(op, bias, out.shape[1])
    if bias is None:
        return out
    if AUTOCAST.enabled and bias.dtype != out.dtype:  # the product's dtype, not a promotion
        bias = bias.astype(out.dtype)
    return out + reshape(bias, (1, out.shape[1]) + (1,) * (out.ndim - 2))


def _check_mode(op: str, conv_mode: str) -> None:
    """Only cross-correlation (what every deep-learning "convolution" computes) is implemented."""
    if str(conv_mode).lower() != "cross_correlation":
        raise NotImplementedError(
            f"{op}: conv_mode {conv_mode!r} is not supported (only 'cross_correlation')"
        )


def _conv_args(op, inp, weight, stride, padding, dilation, groups, conv_mode, compute_mode):
    """Checked and normalised arguments shared by conv2d and conv_transpose2d: float input and
    (un-grouped) 4-D weight after ``compute_mode`` (see ``compute_mode_inputs``), the three pairs,
    and the dtype to cast the result back to (None: keep it)."""
    _check_mode(op, conv_mode)
    (inp, weight), result_dtype = compute_mode_inputs(op, compute_mode, _f(inp), _f(weight))
    if AUTOCAST.enabled:  # low-precision inputs (see minigrad.autodiff.autocast)
        (inp, weight), result_dtype = autocast_low(op, inp, weight)
    weight = _group_weight(op, weight, groups)
    _check_input(op, inp)
    stride, padding = _pair(stride, "stride", op), _pair(padding, "padding", op)
    dilation = _pair(dilation, "dilation", op)
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(
            f"{op}: need stride >= 1, dilation >= 1, padding >= 0; got stride={stride}, "
            f"dilation={dilation}, padding={padding}"
        )
    return inp, weight, stride, padding, dilation, result_dtype


def _finish(op: str, out: Tensor, bias, result_dtype) -> Tensor:
    out = _add_bias(op, out, bias)
    return out if result_dtype is None else out.astype(result_dtype)


def conv2d(inp, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
           conv_mode: str = "cross_correlation", compute_mode: str = "default") -> Tensor:
    """2-D cross-correlation over an NCHW input.

    ``weight`` is (out, in/groups, kh, kw) (or MegEngine's grouped (groups, out/g, in/g, kh, kw)),
    ``bias`` (1, out, 1, 1) or (out,). Output size per axis: ``(H + 2p - d*(k-1) - 1) // s + 1``.
    ``conv_mode`` must be ``"cross_correlation"``; ``compute_mode="float32"`` computes float16
    inputs in float32 and returns float16 (MegEngine's two modes).

    Example::

        y = F.conv2d(x, w, b, stride=2, padding=1)  # x (8, 3, 32, 32), w (16, 3, 3, 3)
    """
    op = "conv2d"
    inp, weight, stride, padding, dilation, result_dtype = _conv_args(
        op, inp, weight, stride, padding, dilation, groups, conv_mode, compute_mode)
    n, c, h, w = inp.shape
    o, cg, kh, kw = weight.shape
    if groups < 1 or c % groups or o % groups:
        raise ValueError(
            f"{op}: groups={groups} must divide input channels {c} and output channels {o}"
        )
    if cg * groups != c:
        raise ValueError(
            f"{op}: input has {c} channels (shape {inp.shape}) but weight {weight.shape} expects "
            f"{cg * groups} (= {cg} per group x {groups} groups)"
        )
    oh = _out_size(h, kh, stride[0], padding[0], dilation[0])
    ow = _out_size(w, kw, stride[1], padding[1], dilation[1])
    if oh < 1 or ow < 1:
        raise ValueError(
            f"{op}: input {inp.shape} is too small for kernel {(kh, kw)} with padding {padding} "
            f"and dilation {dilation} (output would be {(oh, ow)})"
        )
    bias = _bias_vector(op, bias, o)
    if bias is None or bias.dtype == inp.dtype:  # added by Conv2d in its layout pass
        out = Conv2d()(inp, weight, bias, stride, padding, dilation, groups)
    else:
        out = _add_bias(op, Conv2d()(inp, weight, None, stride, padding, dilation, groups), bias)
    return out if result_dtype is None else out.astype(result_dtype)


def conv1d(inp, weight, bias=None, stride: int = 1, padding: int = 0, dilation: int = 1,
           groups: int = 1, conv_mode: str = "cross_correlation",
           compute_mode: str = "default") -> Tensor:
    """1-D cross-correlation over (N, C, L): ``weight`` (out, in/groups, k) (or MegEngine's grouped
    (groups, out/groups, in/groups, k)), ``bias`` (1, out, 1) or (out,). Runs as conv2d on a
    height-1 image (``conv_mode``/``compute_mode`` as there)."""
    op = "conv1d"
    inp, weight = _f(inp), _f(weight)
    _check_input(op, inp, 3)
    if weight.ndim == 4:  # MegEngine's grouped (groups, out/groups, in/groups, k)
        weight = _group_weight(op, reshape(weight, weight.shape + (1,)), groups)
        weight = reshape(weight, weight.shape[:3])
    if weight.ndim != 3:
        raise ValueError(
            f"{op}: expected a 3-D weight (out, in/groups, k), got shape {weight.shape}"
        )
    if weight.shape[1] * groups != inp.shape[1]:
        raise ValueError(
            f"{op}: input has {inp.shape[1]} channels (shape {inp.shape}) but weight "
            f"{weight.shape} expects {weight.shape[1] * groups}"
        )
    x4 = reshape(inp, (inp.shape[0], inp.shape[1], 1, inp.shape[2]))
    w4 = reshape(weight, (weight.shape[0], weight.shape[1], 1, weight.shape[2]))
    out = conv2d(x4, w4, None, (1, int(stride)), (0, int(padding)), (1, int(dilation)), groups,
                 conv_mode, compute_mode)
    out = reshape(out, (out.shape[0], out.shape[1], out.shape[3]))
    return _add_bias(op, out, bias)


def conv_transpose2d(inp, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                     groups: int = 1, conv_mode: str = "cross_correlation",
                     compute_mode: str = "default") -> Tensor:
    """Transposed 2-D convolution (the gradient of conv2d with respect to its input).

    ``weight`` is (in, out/groups, kh, kw) (or grouped (groups, in/g, out/g, kh, kw)); output size
    per axis: ``(H - 1)*s - 2p + d*(k-1) + output_padding + 1``. ``conv_mode`` and
    ``compute_mode`` as in :func:`conv2d`.

    Example::

        y = F.conv_transpose2d(x, w, stride=2)  # x (8, 16, 7, 7), w (16, 3, 2, 2): (8, 3, 14, 14)
    """
    op = "conv_transpose2d"
    inp, weight, stride, padding, dilation, result_dtype = _conv_args(
        op, inp, weight, stride, padding, dilation, groups, conv_mode, compute_mode)
    out_pad = _pair(output_padding, "output_padding", op)
    n, c, h, w = inp.shape
    cin, og, kh, kw = weight.shape
    if groups < 1 or c % groups:
        raise ValueError(f"{op}: groups={groups} must divide input channels {c}")
    if cin != c:
        raise ValueError(
            f"{op}: input has {c} channels (shape {inp.shape}) but weight {weight.shape} "
            f"expects {cin}"
        )
    for a in range(2):
        if not 0 <= out_pad[a] < max(stride[a], dilation[a]):
            raise ValueError(
                f"{op}: output_padding {out_pad} must be smaller than stride {stride} or "
                f"dilation {dilation}"
            )
    out_hw = tuple(
        (size - 1) * stride[a] - 2 * padding[a] + dilation[a] * (k - 1) + out_pad[a] + 1
        for a, (size, k) in enumerate(((h, kh), (w, kw)))
    )
    if min(out_hw) < 1:
        raise ValueError(f"{op}: output size {out_hw} is not positive for input {inp.shape}")
    out = ConvTranspose2d()(inp, weight, stride, padding, dilation, groups, out_hw)
    return _finish(op, out, bias, result_dtype)


# --------------------------------------------------------------------------------------------------
# pooling


class MaxPool2d(Function):
    """Max over each window, saving the winner's index (``kernels.max_pool2d``), so backward is one
    scatter of ``dy`` onto the winners. The first maximum of a window wins, so ties never
    double-count."""

    def forward(self, x, kernel, stride, padding, out_hw):
        out, self.argmax = kernels.max_pool2d(x._data, kernel, stride, padding, out_hw)
        self.xshape, self.geometry = x._data.shape, (kernel, stride, padding)
        return out

    def backward(self, dy):
        dx = kernels.max_pool2d_grad(dy._data, self.argmax, self.xshape, *self.geometry)
        return dx, None, None, None, None


class AvgPool2d(Function):
    """Sum over the ``kh*kw`` offsets times 1/window size (a scalar or a per-output array)."""

    def forward(self, x, kernel, stride, padding, out_hw, count):
        xp = x.xp
        kh, kw = kernel
        xpad = _pad(xp, x._data, *padding)
        out = None
        for k in range(kh * kw):
            s = xpad[(Ellipsis, *_offset(k // kw, k % kw, *out_hw, stride, (1, 1)))]
            out = xp.array(s) if out is None else xp.add(out, s, out=out)
        out *= count
        self.args = (x._data.shape, xpad.shape, kernel, stride, padding, out_hw, count)
        return out

    def backward(self, dy):
        xshape, pshape, (kh, kw), stride, (ph, pw), out_hw, count = self.args
        xp = dy.xp
        g = dy._data * count
        dxp = xp.zeros(pshape, g.dtype)
        for k in range(kh * kw):
            dxp[(Ellipsis, *_offset(k // kw, k % kw, *out_hw, stride, (1, 1)))] += g
        out = Tensor._wrap(_crop(dxp, ph, pw, *xshape[2:]), dy._device)
        return out, None, None, None, None, None


def _pool_args(op, inp, kernel_size, stride, padding):
    _check_input(op, inp)
    kernel = _pair(kernel_size, "kernel_size", op)
    stride = kernel if stride is None else _pair(stride, "stride", op)
    padding = _pair(padding, "padding", op)
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise ValueError(
            f"{op}: need kernel_size >= 1, stride >= 1, padding >= 0; got kernel_size={kernel}, "
            f"stride={stride}, padding={padding}"
        )
    if padding[0] * 2 > kernel[0] or padding[1] * 2 > kernel[1]:
        raise ValueError(f"{op}: padding {padding} must be at most half the kernel size {kernel}")
    out_hw = tuple(
        _out_size(inp.shape[2 + a], kernel[a], stride[a], padding[a], 1) for a in range(2)
    )
    if min(out_hw) < 1:
        raise ValueError(
            f"{op}: input {inp.shape} is too small for kernel {kernel} with padding {padding}"
        )
    return kernel, stride, padding, out_hw


def max_pool2d(inp, kernel_size, stride=None, padding=0) -> Tensor:
    """Max over ``kernel_size`` windows of an NCHW input; ``stride`` defaults to ``kernel_size`` and
    padding counts as ``-inf``. The gradient goes to the first maximum of each window."""
    inp = _f(inp)
    kernel, stride, padding, out_hw = _pool_args("max_pool2d", inp, kernel_size, stride, padding)
    return MaxPool2d()(inp, kernel, stride, padding, out_hw)


def avg_pool2d(inp, kernel_size, stride=None, padding=0,
               mode: str = "average_count_exclude_padding") -> Tensor:
    """Mean over ``kernel_size`` windows of an NCHW input (``stride`` defaults to ``kernel_size``).

    ``mode`` is MegEngine's: ``"average_count_exclude_padding"`` (the default) divides each window
    by the number of real input pixels it covers; ``"average"`` divides by ``kh*kw``, counting
    padded zeros (PyTorch's default, ``count_include_pad=True``).
    """
    op = "avg_pool2d"
    inp = _f(inp)
    kernel, stride, padding, out_hw = _pool_args(op, inp, kernel_size, stride, padding)
    if mode in ("average", "AVERAGE"):
        count = 1.0 / (kernel[0] * kernel[1])
    elif mode in ("average_count_exclude_padding", "AVERAGE_COUNT_EXCLUDE_PADDING"):
        counts = []
        for a in range(2):
            start = [i * stride[a] - padding[a] for i in range(out_hw[a])]
            counts.append(
                [min(s + kernel[a], inp.shape[2 + a]) - max(s, 0) for s in start]
            )
        per = [[1.0 / (ch * cw) for cw in counts[1]] for ch in counts[0]]
        count = inp._device.put(per, inp.dtype)
    else:
        raise ValueError(
            f"{op}: mode must be 'average' or 'average_count_exclude_padding', got {mode!r}"
        )
    return AvgPool2d()(inp, kernel, stride, padding, out_hw, count)


def _adaptive_matrix(xp, size: int, out: int, dtype):
    """(out, size) averaging matrix: row i averages [floor(i*size/out), ceil((i+1)*size/out))."""
    rows = []
    for i in range(out):
        lo, hi = (i * size) // out, -((-(i + 1) * size) // out)
        rows.append([1.0 / (hi - lo) if lo <= j < hi else 0.0 for j in range(size)])
    return xp.asarray(rows, dtype=dtype)


def adaptive_avg_pool2d(inp, oshp) -> Tensor:
    """Average-pool an NCHW input to the spatial size ``oshp`` (int or pair), PyTorch's windows:
    output i covers input ``[floor(i*H/OH), ceil((i+1)*H/OH))``. Written as ``P_h @ x @ P_w^T`` with
    constant averaging matrices, so the gradient (of any order) comes for free."""
    op = "adaptive_avg_pool2d"
    inp = _f(inp)
    _check_input(op, inp)
    oh, ow = _pair(oshp, "oshp", op)
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: output size must be positive, got {(oh, ow)}")
    h, w = inp.shape[2:]
    with inp._device.context():
        ph = Tensor._wrap(_adaptive_matrix(inp.xp, h, oh, inp.dtype), inp._device)
        pwt = Tensor._wrap(_adaptive_matrix(inp.xp, w, ow, inp.dtype).T, inp._device)
    return matmul(matmul(ph, inp), pwt)
