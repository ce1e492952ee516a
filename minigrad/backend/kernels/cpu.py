"""The CPU implementation of :mod:`minigrad.backend.kernels`: allocate the outputs, run the numba
loops of :mod:`~minigrad.backend.kernels.loops` on them.

Arguments arrive in the canonical shapes ``minigrad.backend.kernels`` prepares (C-contiguous rows,
NCHW images); importing this module imports numba.
"""

from __future__ import annotations

import numpy as np

from minigrad.backend.dtypes import float_sum
from minigrad.backend.kernels import loops
from minigrad.backend.xp import get_array_module


def relu(x):
    if x.dtype in (np.float32, np.float64):
        y, mask = np.empty_like(x), np.empty(x.shape, np.bool_)
        loops.relu_forward(x.reshape(-1), y.reshape(-1), mask.reshape(-1))
        return y, mask
    # array-module generic: other dtypes, and the GPU's path for those its kernel does not take
    xp = get_array_module(x)
    mask = x > 0
    return xp.where(mask | (x != x), x, x.dtype.type(0)), mask


def relu_grad(dy, mask):
    if dy.dtype in (np.float32, np.float64):
        dx = np.empty_like(dy)
        loops.relu_backward(dy.reshape(-1), mask.reshape(-1), dx.reshape(-1))
        return dx
    xp = get_array_module(dy)
    return xp.where(mask, dy, dy.dtype.type(0))


def gelu(x):
    y, slope = np.empty_like(x), np.empty_like(x)
    loops.gelu_forward(x.reshape(-1), y.reshape(-1), slope.reshape(-1))
    return y, slope


def gelu_grad(slope, dy):
    # array-module generic (one multiply, which NumPy and CuPy do at memory speed)
    return dy * slope


def _rows(loop, *arrays):
    """Run a row loop on flat views of (R, C) arrays into a new output; rows of 0 have no work."""
    out = np.empty_like(arrays[0])
    if out.shape[1]:
        loop(*(a.reshape(-1) for a in arrays), out.reshape(-1), out.shape[1])
    return out


def softmax(x):
    return _rows(loops.softmax_forward, x)


def softmax_grad(y, dy):
    return _rows(loops.softmax_backward, y, dy)


def log_softmax(x):
    return _rows(loops.log_softmax_forward, x)


def log_softmax_grad(y, dy):
    return _rows(loops.log_softmax_backward, y, dy)


def attention_softmax(scores, scale, bias, causal):
    if bias is None:
        bias = np.zeros((1,) + scores.shape[1:], scores.dtype)
    loops.attention_softmax(scores, scale, bias, causal)


def attention_softmax_grad(w, dw, scale):
    if w.shape[-1]:
        loops.attention_softmax_backward(w.reshape(-1), dw.reshape(-1), scale, w.shape[-1])


def _vector(p, n, dtype, fill):
    return np.full(n, fill, dtype) if p is None else np.ascontiguousarray(p.reshape(-1))


def layer_norm(x, weight, bias, eps):
    r, n = x.shape
    y, xhat, rstd = np.empty_like(x), np.empty_like(x), np.empty(r, np.float64)
    loops.layer_norm_forward(x.reshape(-1), _vector(weight, n, x.dtype, 1),
                             _vector(bias, n, x.dtype, 0), eps, y.reshape(-1), xhat.reshape(-1),
                             rstd)
    return y, xhat, rstd


def layer_norm_grad(dy, xhat, rstd, weight):
    n = dy.shape[1]
    dx = np.empty_like(dy)
    dw, db = np.zeros(n, np.float64), np.zeros(n, np.float64)
    loops.layer_norm_backward(dy.reshape(-1), xhat.reshape(-1), rstd,
                              _vector(weight, n, dy.dtype, 1), dx.reshape(-1), dw, db)
    return dx, dw.astype(dy.dtype, copy=False), db.astype(dy.dtype, copy=False)


def max_pool2d(x, kernel, stride, padding, out_hw):
    n, c, h, w = x.shape
    out = np.empty((n * c,) + tuple(out_hw), x.dtype)
    argmax = np.empty(out.shape, np.int32)
    planes = x.reshape(n * c, h, w)
    if kernel == stride == (2, 2) and padding == (0, 0):
        loops.max_pool2x2_forward(planes, out, argmax)
    else:
        loops.max_pool2d_forward(planes, *kernel, *stride, *padding, out, argmax)
    shape = (n, c) + tuple(out_hw)
    return out.reshape(shape), argmax.reshape(shape)


def max_pool2d_grad(dy, argmax, x_shape, kernel, stride, padding):
    n, c, h, w = x_shape
    dx = np.zeros(x_shape, dy.dtype)
    outputs = dy.shape[2] * dy.shape[3]
    loops.max_pool2d_backward(dy.reshape(n * c, outputs), argmax.reshape(n * c, outputs),
                              dx.reshape(n * c, h * w))
    return dx


def im2col(x, kernel, stride, padding, dilation, out_hw):
    n, c = x.shape[:2]
    (kh, kw), (oh, ow) = kernel, out_hw
    cols = np.empty((c * kh * kw, n * oh * ow), x.dtype)
    loops.patches(x, cols, kh, kw, *stride, *padding, *dilation, oh, ow, False)
    return cols


def col2im(cols, x_shape, kernel, stride, padding, dilation, out_hw):
    x = np.zeros(x_shape, cols.dtype)
    loops.patches(x, cols, *kernel, *stride, *padding, *dilation, *out_hw, True)
    return x


def from_product_layout(mat, bias):
    o, n, p = mat.shape
    b = np.zeros(o, mat.dtype) if bias is None else np.ascontiguousarray(bias, dtype=mat.dtype)
    out = np.empty((n, o, p), mat.dtype)
    loops.channels_to_batch_first(mat, b, out)
    return out


def to_product_layout(dy):
    n, o, p = dy.shape
    mat, dbias = np.empty((o, n, p), dy.dtype), np.empty(o, dy.dtype)
    loops.batch_to_channels_first(dy, mat, dbias)
    return mat, dbias


def column_sums(a):
    if _flat_of_one_dtype(a) and a.ndim == 2:
        # a vector-matrix product: BLAS reads the rows once, on all its threads, 2.5-4x faster
        # than NumPy's row-by-row sum (1024 x 128 float32: 19 -> 5 us)
        return np.ones(a.shape[0], a.dtype) @ a
    # array-module generic (the GPU's path for what its kernel does not take)
    return a.sum(axis=0)


def min_max(a):
    # array-module generic
    return a.min().astype(np.int64), a.max().astype(np.int64)


def _label_index(xp, label, n: int):
    """``(rows, label)`` for indexing: labels out of [0, n) (which the caller reports; on a GPU
    only later) are clipped, so that they index nothing outside the row here either."""
    return xp.arange(label.shape[0]), label.clip(0, max(n - 1, 0))


def cross_entropy_rows(x, label):
    if x.shape[1] and _flat_of_one_dtype(x):
        nll, prob = np.empty(x.shape[0], x.dtype), np.empty_like(x)
        loops.cross_entropy_forward(x.reshape(-1), label, nll, prob.reshape(-1), x.shape[1])
        return nll, prob
    # array-module generic: other dtypes, and the GPU's path for the dtypes its kernel does not
    # take (NumPy's exp, so not the numba loops' bits)
    xp = get_array_module(x)
    z = x - x.max(axis=1, keepdims=True)
    e = xp.exp(z)
    s = e.sum(axis=1, keepdims=True)
    nll = xp.log(s[:, 0]) - z[_label_index(xp, label, x.shape[1])]  # == -logsoftmax[label]
    e /= s
    return nll, e


def cross_entropy_rows_grad(prob, label, dy, divisor):
    if prob.shape[1] and _flat_of_one_dtype(prob, dy):
        scale = dy if dy.ndim else (dy / divisor).reshape(1)
        loops.cross_entropy_backward(prob.reshape(-1), label, scale, prob.shape[1])
        return prob
    xp = get_array_module(prob)
    prob[_label_index(xp, label, prob.shape[1])] -= 1
    prob *= dy[:, None] if dy.ndim else dy / divisor
    return prob


def squared_error_sum(pred, label, scale):
    xp = get_array_module(pred)
    if pred.shape == label.shape and _flat_of_one_dtype(pred, label):
        diff, sq = np.empty_like(pred), np.empty_like(pred)
        loops.squared_difference(pred.reshape(-1), label.reshape(-1), diff.reshape(-1),
                                 sq.reshape(-1))
    else:  # array-module generic (float16 and bfloat16 squares summed in float32)
        diff = pred - label
        sq = diff * diff
    total = float_sum(xp, sq, tuple(range(diff.ndim)), False)  # NumPy's sum: the composition's
    return (total if scale is None else total * scale), diff


def squared_error_grad(pred, label, diff, dy, scale):
    xp = get_array_module(pred)
    if diff is None:
        diff = pred - label
    g = dy if scale is None else dy * scale
    if _flat_of_one_dtype(diff) and g.dtype == diff.dtype:
        out = np.empty_like(diff)
        loops.doubled_product(diff.dtype.type(g), diff.reshape(-1), out.reshape(-1))
        return out
    u = xp.broadcast_to(g.reshape((1,) * diff.ndim), diff.shape) * diff
    return u + u


def _flat_of_one_dtype(*arrays) -> bool:
    """Whether the numba loops take these arrays: NumPy, C-contiguous, one float32/float64 dtype."""
    dtype = arrays[0].dtype
    return dtype in (np.float32, np.float64) and all(
        isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov):
    if _flat_of_one_dtype(p, g, *(() if buf is None else (buf,))):
        if buf is None:
            loops.sgd_plain_step(p.reshape(-1), g.reshape(-1), lr, weight_decay,
                                 bool(weight_decay))
        else:
            loops.sgd_step(p.reshape(-1), g.reshape(-1), buf.reshape(-1), lr, momentum,
                           weight_decay, nesterov, bool(weight_decay))
        return
    # array-module generic: other dtypes and layouts, and the GPU's path for what its fused
    # kernel does not take
    if weight_decay:
        g = g + weight_decay * p
    if buf is not None:
        buf *= momentum
        buf += g
        g = g + momentum * buf if nesterov else buf
    p -= lr * g


def adam_step(p, g, m, v, lr, b1, b2, eps, weight_decay, decoupled, step):
    if _flat_of_one_dtype(p, g, m, v):
        loops.adam_step(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), lr, b1,
                        1 - b1, b2, 1 - b2, 1 - b1**step, 1 - b2**step, eps, weight_decay,
                        bool(weight_decay) and not decoupled, bool(weight_decay) and decoupled)
        return
    xp = get_array_module(p)
    if weight_decay and not decoupled:
        g = g + weight_decay * p
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * (g * g)
    delta = (m / (1 - b1**step)) / (xp.sqrt(v / (1 - b2**step)) + eps)
    if weight_decay and decoupled:
        delta = delta + weight_decay * p
    p -= lr * delta


def sgd_steps(params, grads, bufs, lr, momentum, weight_decay, nesterov):
    for p, g, buf in zip(params, grads, bufs):
        sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov)


def adam_steps(params, grads, ms, vs, lr, b1, b2, eps, weight_decay, decoupled, steps):
    for p, g, m, v, step in zip(params, grads, ms, vs, steps):
        adam_step(p, g, m, v, lr, b1, b2, eps, weight_decay, decoupled, step)


def unscale_grads(grads, factor):
    xp = get_array_module(grads[0])
    bad = xp.zeros(len(grads), np.int32)
    outs = []
    for k, g in enumerate(grads):
        bad[k] = ~xp.isfinite(g).all()  # a device scalar into a device array: no read
        outs.append(unscale_grad(g, factor))
    return outs, bad


def unscale_grad(g, factor):
    """``g * factor`` in ``g``'s dtype, computed in float32 for 2-byte floats."""
    if g.dtype.itemsize < 4:
        return (g.astype(np.float32) * factor).astype(g.dtype)
    return g * factor
