"""The CuPy implementation of :mod:`minigrad.backend.kernels`, for arrays on an NVIDIA GPU.

Each function is a few CuPy kernels where the unfused composition launches many: the element-wise
part of an op is one ``ElementwiseKernel`` (CUDA C over ``T`` = float or double), row statistics
are ``ReductionKernel`` s or CuPy reductions with ``keepdims``, and the gathers and scatters of
pooling and convolution are index arithmetic in an ``ElementwiseKernel`` over their outputs (so no
atomics, and results do not depend on scheduling). CuPy compiles each kernel for each dtype on first
use and caches the binary on disk.

Arguments arrive in the canonical shapes ``minigrad.backend.kernels`` prepares (C-contiguous rows,
NCHW images). This module imports CuPy, so it is only imported once a CuPy array shows up.
"""

from __future__ import annotations

import functools

import cupy as cp
import cupyx

from minigrad.backend.kernels import cpu as _cpu

# --------------------------------------------------------------------------------------------------
# ReLU: the output and its mask in one kernel (float32/float64; other dtypes composed)

_relu_forward = cp.ElementwiseKernel(
    "T x", "T y, bool mask", "mask = x > T(0); y = (mask || x != x) ? x : T(0)",
    "minigrad_relu_forward")
_relu_backward = cp.ElementwiseKernel(
    "T dy, bool mask", "T dx", "dx = mask ? dy : T(0)", "minigrad_relu_backward")


def relu(x):
    if x.dtype.kind != "f" or x.dtype.itemsize < 4:
        return _cpu.relu(x)
    return _relu_forward(x)


def relu_grad(dy, mask):
    if dy.dtype.kind != "f" or dy.dtype.itemsize < 4:
        return _cpu.relu_grad(dy, mask)
    return _relu_backward(dy, mask)


# --------------------------------------------------------------------------------------------------
# GELU

_gelu_forward = cp.ElementwiseKernel(
    "T x", "T y, T cdf", "cdf = T(0.5) * erfc(-x * T(0.70710678118654752)); y = x * cdf",
    "minigrad_gelu_forward")
_gelu_backward = cp.ElementwiseKernel(
    "T x, T cdf, T dy", "T dx",
    "dx = dy * (cdf + x * exp(T(-0.5) * x * x) * T(0.39894228040143268))", "minigrad_gelu_backward")


def gelu(x):
    return _gelu_forward(x)


def gelu_grad(x, cdf, dy):
    return _gelu_backward(x, cdf, dy)


# --------------------------------------------------------------------------------------------------
# softmax family over the rows of (R, C) arrays

_sum_exp = cp.ReductionKernel(
    "T x, T m", "T s", "exp(x - m)", "a + b", "s = a", "0", "minigrad_sum_exp",
)
_row_dot = cp.ReductionKernel(
    "T a, T b", "T s", "a * b", "a + b", "s = a", "0", "minigrad_row_dot",
)
_exp_over = cp.ElementwiseKernel(
    "T x, T m, T s", "T y", "y = exp(x - m) / s", "minigrad_exp_over",
)
_softmax_backward = cp.ElementwiseKernel(
    "T y, T dy, T s", "T dx", "dx = y * (dy - s)", "minigrad_softmax_backward",
)
_log_softmax_forward = cp.ElementwiseKernel(
    "T x, T m, T s", "T y", "y = x - m - log(s)", "minigrad_log_softmax_forward",
)
_log_softmax_backward = cp.ElementwiseKernel(
    "T y, T dy, T s", "T dx", "dx = dy - exp(y) * s", "minigrad_log_softmax_backward",
)


def softmax(x):
    m = x.max(axis=1, keepdims=True)
    return _exp_over(x, m, _sum_exp(x, m, axis=1, keepdims=True))


def softmax_grad(y, dy):
    return _softmax_backward(y, dy, _row_dot(dy, y, axis=1, keepdims=True))


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return _log_softmax_forward(x, m, _sum_exp(x, m, axis=1, keepdims=True))


def log_softmax_grad(y, dy):
    return _log_softmax_backward(y, dy, dy.sum(axis=1, keepdims=True))


# --------------------------------------------------------------------------------------------------
# attention weights over (G, L, S), in place

_attention_logits = cp.ElementwiseKernel(
    "raw T bias, T scale, T neg_inf, int64 bias_groups, int64 length, int64 src, bool causal",
    "T s",
    """
    const long long k = i, col = k % src, row = (k / src) % length, g = k / (src * length);
    T v = s * scale;
    if (bias_groups > 0) v += bias[(bias_groups > 1 ? g : 0) * length * src + row * src + col];
    s = (causal && col > row) ? neg_inf : v;
    """,
    "minigrad_attention_logits",
)
_scaled_softmax_backward = cp.ElementwiseKernel(
    "T w, T s, T scale", "T dw", "dw = scale * w * (dw - s)", "minigrad_scaled_softmax_backward",
)


def attention_softmax(scores, scale, bias, causal):
    _, length, src = scores.shape
    groups = 0 if bias is None else bias.shape[0]
    if bias is None:
        bias = cp.empty(1, scores.dtype)  # not read when groups == 0 (so not filled either)
    t = scores.dtype.type
    _attention_logits(bias, t(scale), t(-cp.inf), groups, length, src, causal, scores)
    m = scores.max(axis=2, keepdims=True)
    _exp_over(scores, m, _sum_exp(scores, m, axis=2, keepdims=True), scores)


def attention_softmax_grad(w, dw, scale):
    _scaled_softmax_backward(w, _row_dot(dw, w, axis=2, keepdims=True), w.dtype.type(scale), dw)


# --------------------------------------------------------------------------------------------------
# layer norm over the rows of (R, C) arrays

# One block of threads per row: the row's sums are block reductions (warp shuffles, then one value
# per warp through shared memory), so a layer norm is one kernel forward and one plus the two column
# sums of its parameter gradients backward, where the CuPy composition launched six and seven.
_LAYER_NORM_SOURCE = r"""
__device__ real block_sum(real v, real* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // shared[] may still be read from the previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? shared[lane] : real(0);
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    return shared[32];
}

extern "C" __global__ void layer_norm_forward(
        const real* x, const real* w, const real* b, int has_w, int has_b, real eps,
        long long n, real* y, real* xhat, real* rstd) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real s = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) s += x[base + j];
    const real mean = block_sum(s, shared) / real(n);
    real q = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real d = x[base + j] - mean;
        q += d * d;
    }
    const real r = real(1) / sqrt(block_sum(q, shared) / real(n) + eps);
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real h = (x[base + j] - mean) * r;
        xhat[base + j] = h;
        y[base + j] = h * (has_w ? w[j] : real(1)) + (has_b ? b[j] : real(0));
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

extern "C" __global__ void layer_norm_backward(
        const real* dy, const real* xhat, const real* rstd, const real* w, int has_w,
        long long n, real* dx) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real s1 = 0, s2 = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real gw = dy[base + j] * (has_w ? w[j] : real(1));
        s1 += gw;
        s2 += gw * xhat[base + j];
    }
    const real m1 = block_sum(s1, shared) / real(n);
    const real m2 = block_sum(s2, shared) / real(n);
    const real r = rstd[blockIdx.x];
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real gw = dy[base + j] * (has_w ? w[j] : real(1));
        dx[base + j] = r * (gw - m1 - xhat[base + j] * m2);
    }
}
"""
_LAYER_NORM_TYPES = {"float32": "float", "float64": "double"}


@functools.cache
def _layer_norm_kernels(dtype_name: str) -> tuple:
    module = cp.RawModule(code=f"typedef {_LAYER_NORM_TYPES[dtype_name]} real;\n"
                          + _LAYER_NORM_SOURCE)
    return module.get_function("layer_norm_forward"), module.get_function("layer_norm_backward")


def _row_threads(n: int) -> int:
    """Threads per row: a multiple of 32, about one per 4 elements, at most 1024."""
    return min(1024, 32 * max(1, -(-n // 128)))


def _affine_args(p, like):
    return (like, 0) if p is None else (cp.ascontiguousarray(p.reshape(-1), like.dtype), 1)


def layer_norm(x, weight, bias, eps):
    rows, n = x.shape
    y, xhat, rstd = cp.empty_like(x), cp.empty_like(x), cp.empty(rows, x.dtype)
    if rows and n:
        forward, _ = _layer_norm_kernels(x.dtype.name)
        w, has_w = _affine_args(weight, x)
        b, has_b = _affine_args(bias, x)
        forward((rows,), (_row_threads(n),),
                (x, w, b, cp.int32(has_w), cp.int32(has_b), x.dtype.type(eps), cp.int64(n),
                 y, xhat, rstd))
    return y, xhat, rstd


def layer_norm_grad(dy, xhat, rstd, weight):
    rows, n = dy.shape
    dx = cp.empty_like(dy)
    if rows and n:
        _, backward = _layer_norm_kernels(dy.dtype.name)
        w, has_w = _affine_args(weight, dy)
        backward((rows,), (_row_threads(n),),
                 (dy, xhat, rstd, w, cp.int32(has_w), cp.int64(n), dx))
    return dx, _row_dot(dy, xhat, axis=0), dy.sum(axis=0)


# --------------------------------------------------------------------------------------------------
# max pooling

_max_pool_forward = cp.ElementwiseKernel(
    "raw T x, int64 h, int64 w, int64 oh, int64 ow, int64 kh, int64 kw, int64 sh, int64 sw, "
    "int64 ph, int64 pw",
    "T out, int32 argmax",
    """
    const long long idx = i, j = idx % ow, r = (idx / ow) % oh, plane = idx / (ow * oh);
    const long long ys = r * sh - ph, xs = j * sw - pw;
    const long long y0 = ys > 0 ? ys : 0, y1 = ys + kh < h ? ys + kh : h;
    const long long x0 = xs > 0 ? xs : 0, x1 = xs + kw < w ? xs + kw : w;
    const long long base = plane * h * w;
    T m = x[base + y0 * w + x0];
    long long k = y0 * w + x0;
    for (long long a = y0; a < y1; ++a) {
        for (long long b = x0; b < x1; ++b) {
            const T v = x[base + a * w + b];
            if (v > m || (v != v && m == m)) { m = v; k = a * w + b; }
        }
    }
    out = m;
    argmax = (int)k;
    """,
    "minigrad_max_pool2d_forward",
)


def max_pool2d(x, kernel, stride, padding, out_hw):
    n, c, h, w = x.shape
    out = cp.empty((n, c) + tuple(out_hw), x.dtype)
    argmax = cp.empty(out.shape, cp.int32)
    _max_pool_forward(x, h, w, *out_hw, *kernel, *stride, *padding, out, argmax)
    return out, argmax


def max_pool2d_grad(dy, argmax, x_shape):
    planes, hw = x_shape[0] * x_shape[1], x_shape[2] * x_shape[3]
    dx = cp.zeros(planes * hw, dy.dtype)
    index = argmax.reshape(planes, argmax.size // planes if planes else 0)
    index = index + cp.arange(planes, dtype=cp.int64)[:, None] * hw
    cupyx.scatter_add(dx, index.reshape(-1), dy.reshape(-1))
    return dx.reshape(x_shape)


# --------------------------------------------------------------------------------------------------
# convolution layout

# (``n`` and ``i`` are reserved names in CuPy kernels, hence ``batch``)
_GEOMETRY = ("int64 c, int64 h, int64 w, int64 kh, int64 kw, int64 sh, int64 sw, int64 ph, "
             "int64 pw, int64 dh, int64 dw, int64 oh, int64 ow, int64 batch")

_im2col = cp.ElementwiseKernel(
    "raw T x, " + _GEOMETRY, "T col",
    """
    const long long k = i, p = oh * ow, q = k % (batch * p), row = k / (batch * p);
    const long long jj = row % kw, ii = (row / kw) % kh, cc = row / (kw * kh);
    const long long xo = q % ow, yo = (q / ow) % oh, nn = q / p;
    const long long y = yo * sh - ph + ii * dh, xx = xo * sw - pw + jj * dw;
    col = (y >= 0 && y < h && xx >= 0 && xx < w) ? x[((nn * c + cc) * h + y) * w + xx] : T(0);
    """,
    "minigrad_im2col",
)
_col2im = cp.ElementwiseKernel(
    "raw T cols, " + _GEOMETRY, "T x",
    """
    const long long k = i, xx = k % w, y = (k / w) % h, cc = (k / (w * h)) % c;
    const long long nn = k / (w * h * c);
    T acc = 0;
    for (long long ii = 0; ii < kh; ++ii) {
        const long long ty = y + ph - ii * dh;  // = yo * sh for the output row that read y
        if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
        for (long long jj = 0; jj < kw; ++jj) {
            const long long tx = xx + pw - jj * dw;
            if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
            acc += cols[((cc * kh + ii) * kw + jj) * batch * oh * ow + (nn * oh + ty / sh) * ow
                        + tx / sw];
        }
    }
    x = acc;
    """,
    "minigrad_col2im",
)


def im2col(x, kernel, stride, padding, dilation, out_hw):
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = kernel, out_hw
    cols = cp.empty((c * kh * kw, n * oh * ow), x.dtype)
    _im2col(x, c, h, w, kh, kw, *stride, *padding, *dilation, oh, ow, n, cols)
    return cols


def col2im(cols, x_shape, kernel, stride, padding, dilation, out_hw):
    n, c, h, w = x_shape
    x = cp.empty(x_shape, cols.dtype)
    _col2im(cols, c, h, w, *kernel, *stride, *padding, *dilation, *out_hw, n, x)
    return x


def from_product_layout(mat, bias):
    o, n, p = mat.shape
    out = cp.empty((n, o, p), mat.dtype)
    if bias is None:
        cp.copyto(out, mat.transpose(1, 0, 2))
    else:
        cp.add(mat.transpose(1, 0, 2), bias.reshape(1, o, 1).astype(mat.dtype, copy=False), out=out)
    return out


def to_product_layout(dy):
    return cp.ascontiguousarray(dy.transpose(1, 0, 2)), dy.sum(axis=(0, 2))


# --------------------------------------------------------------------------------------------------
# optimizer steps: one kernel per parameter (float32/float64 of one dtype; others composed)

_sgd_step = cp.ElementwiseKernel(
    "T g, T lr, T momentum, T wd, bool nesterov", "T p, T buf",
    """
    T d = wd != T(0) ? g + wd * p : g;
    buf = momentum * buf + d;
    p = p - lr * (nesterov ? d + momentum * buf : buf);
    """,
    "minigrad_sgd_step")
_sgd_step_plain = cp.ElementwiseKernel(
    "T g, T lr, T wd", "T p", "p = p - lr * (wd != T(0) ? g + wd * p : g)",
    "minigrad_sgd_step_plain")
_adam_step = cp.ElementwiseKernel(
    "T g, T lr, T b1, T b2, T eps, T wd, T bc1, T bc2, bool decoupled", "T p, T m, T v",
    """
    const T d = (wd != T(0) && !decoupled) ? g + wd * p : g;
    m = b1 * m + (T(1) - b1) * d;
    v = b2 * v + (T(1) - b2) * (d * d);
    T delta = (m / bc1) / (sqrt(v / bc2) + eps);
    if (wd != T(0) && decoupled) delta = delta + wd * p;
    p = p - lr * delta;
    """,
    "minigrad_adam_step")


def _fusable(*arrays) -> bool:
    dtype = arrays[0].dtype
    return dtype.kind == "f" and dtype.itemsize >= 4 and all(a.dtype == dtype for a in arrays)


def sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov):
    if not _fusable(p, g, *(() if buf is None else (buf,))):
        return _cpu.sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov)
    if buf is None:
        _sgd_step_plain(g, lr, weight_decay, p)
    else:
        _sgd_step(g, lr, momentum, weight_decay, nesterov, p, buf)


def adam_step(p, g, m, v, lr, b1, b2, eps, weight_decay, decoupled, step):
    if not _fusable(p, g, m, v):
        return _cpu.adam_step(p, g, m, v, lr, b1, b2, eps, weight_decay, decoupled, step)
    _adam_step(g, lr, b1, b2, eps, weight_decay, 1 - b1**step, 1 - b2**step, decoupled, p, m, v)
