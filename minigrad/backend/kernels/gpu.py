"""The CuPy implementation of :mod:`minigrad.backend.kernels`, for arrays on an NVIDIA GPU.

Each function is one or two CuPy kernels where the unfused composition launches many (every launch
costs the host microseconds, which is what small models' steps are made of): an element-wise op
is one ``ElementwiseKernel`` (CUDA C over ``T`` = float or double), an op over the rows of a
matrix (the softmax family, attention weights, layer norm) is one block of threads per row in one
``RawModule`` (:data:`_ROW_SOURCE`), and the gathers and scatters of pooling and convolution are
index arithmetic in an ``ElementwiseKernel`` over their outputs (so no atomics, and results do not
depend on scheduling). CuPy compiles each kernel for each dtype on first use and caches the binary
on disk. ``tests/backend/test_gpu_kernels_on_cpu.py`` runs this CUDA C on the CPU against the CPU
kernels; ``tests/backend/test_gpu_kernel_sources.py`` compiles it with NVRTC.

Arguments arrive in the canonical shapes ``minigrad.backend.kernels`` prepares (C-contiguous rows,
NCHW images). This module imports CuPy, so it is only imported once a CuPy array shows up.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np

from minigrad.backend.kernels import cpu as _cpu


def _fusable(*arrays) -> bool:
    """Whether the fused kernels take these arrays: float32 or float64, all of one dtype (the
    others take the composed path of ``kernels.cpu``, in the arrays' module)."""
    dtype = arrays[0].dtype
    return dtype.kind == "f" and dtype.itemsize >= 4 and all(a.dtype == dtype for a in arrays)


# --------------------------------------------------------------------------------------------------
# ReLU: the output and its mask in one kernel (float32/float64; other dtypes composed)

_relu_forward = cp.ElementwiseKernel(
    "T x", "T y, bool mask", "mask = x > T(0); y = (mask || x != x) ? x : T(0)",
    "minigrad_relu_forward")
_relu_backward = cp.ElementwiseKernel(
    "T dy, bool mask", "T dx", "dx = mask ? dy : T(0)", "minigrad_relu_backward")


def relu(x):
    if not _fusable(x):
        return _cpu.relu(x)
    return _relu_forward(x)


def relu_grad(dy, mask):
    if not _fusable(dy):
        return _cpu.relu_grad(dy, mask)
    return _relu_backward(dy, mask)


# --------------------------------------------------------------------------------------------------
# GELU

_gelu_forward = cp.ElementwiseKernel(
    "T x", "T y, T slope",
    "T cdf = T(0.5) * erfc(-x * T(0.70710678118654752)); y = x * cdf; "
    "slope = cdf + x * exp(T(-0.5) * x * x) * T(0.39894228040143268)", "minigrad_gelu_forward")


def gelu(x):
    return _gelu_forward(x)


gelu_grad = _cpu.gelu_grad  # dy * slope


# --------------------------------------------------------------------------------------------------
# row kernels: the softmax family, attention weights and layer norm over the rows of (R, C) arrays

# One block of threads per row: a row's max and sums are block reductions (warp shuffles, then one
# value per warp through shared memory), so each op is one kernel where a CuPy composition launched
# two to six (a max, a sum, the element-wise parts). Layer norm's parameter gradients are column
# sums: one more kernel, blocks of 32 columns x 8 row strides combined in shared memory.
_ROW_SOURCE = r"""
template <bool MAX>
__device__ real block_reduce(real v, real* shared) {
    for (int o = 16; o > 0; o >>= 1) {
        const real u = __shfl_down_sync(0xffffffffu, v, o);
        v = MAX ? (u > v ? u : v) : v + u;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // shared[] may still be read from the previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? shared[lane] : (MAX ? -real(1) / real(0) : real(0));
        for (int o = 16; o > 0; o >>= 1) {
            const real u = __shfl_down_sync(0xffffffffu, v, o);
            v = MAX ? (u > v ? u : v) : v + u;
        }
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    return shared[32];
}

__device__ real block_sum(real v, real* shared) { return block_reduce<false>(v, shared); }
__device__ real block_max(real v, real* shared) { return block_reduce<true>(v, shared); }

// the sum of exp(x - m) over a row of n, m its max (written to *max); the exponentials go to e
// unless it is null
__device__ real exp_sum(const real* x, long long n, real* e, real* shared, real* max) {
    real m = -real(1) / real(0);
    for (long long j = threadIdx.x; j < n; j += blockDim.x) m = x[j] > m ? x[j] : m;
    m = block_max(m, shared);
    real s = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real v = exp(x[j] - m);
        if (e) e[j] = v;
        s += v;
    }
    *max = m;
    return block_sum(s, shared);
}

// y = exp(x - max) / sum, or (take_log) y = x - max - log(sum), per row of n
extern "C" __global__ void softmax_forward(const real* x, long long n, int take_log, real* y) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real m;
    const real s = exp_sum(x + base, n, take_log ? nullptr : y + base, shared, &m);
    const real shift = m + log(s);
    for (long long j = threadIdx.x; j < n; j += blockDim.x)
        y[base + j] = take_log ? x[base + j] - shift : y[base + j] / s;
}

// dx = y * (dy - sum(dy * y)), or (take_log) dx = dy - exp(y) * sum(dy), per row of n
extern "C" __global__ void softmax_backward(const real* y, const real* dy, long long n,
                                            int take_log, real* dx) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real s = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x)
        s += take_log ? dy[base + j] : dy[base + j] * y[base + j];
    s = block_sum(s, shared);
    for (long long j = threadIdx.x; j < n; j += blockDim.x)
        dx[base + j] = take_log ? dy[base + j] - exp(y[base + j]) * s
                                : y[base + j] * (dy[base + j] - s);
}

// s <- softmax(scale * s + bias) in place over row (g, i) of (G, L, S); bias is (1 or G, L, S)
// when bias_groups > 0; causal: keys j > i get weight 0
extern "C" __global__ void attention_softmax(real* s, const real* bias, real scale,
                                             long long bias_groups, long long length,
                                             long long src, int causal) {
    __shared__ real shared[33];
    const long long row = blockIdx.x, i = row % length, g = row / length;
    const long long base = row * src;
    const long long hi = causal ? (i + 1 < src ? i + 1 : src) : src;
    const real* b = bias + ((bias_groups > 1 ? g : 0) * length + i) * src;
    real m = -real(1) / real(0);
    for (long long j = threadIdx.x; j < hi; j += blockDim.x) {
        const real v = s[base + j] * scale + (bias_groups > 0 ? b[j] : real(0));
        s[base + j] = v;
        m = v > m ? v : m;
    }
    m = block_max(m, shared);
    real total = 0;
    for (long long j = threadIdx.x; j < hi; j += blockDim.x) {
        const real e = exp(s[base + j] - m);
        s[base + j] = e;
        total += e;
    }
    total = block_sum(total, shared);
    for (long long j = threadIdx.x; j < src; j += blockDim.x)
        s[base + j] = j < hi ? s[base + j] / total : real(0);
}

// prob = softmax of row x, nll = log(sum(exp(x - max))) - (x[label] - max); NaN for a label out
// of [0, n) (the caller raises for it)
template <class L>
__device__ void cross_entropy_row(const real* x, const L* label, long long n, real* prob,
                                  real* nll) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real m;
    const real s = exp_sum(x + base, n, prob + base, shared, &m);
    for (long long j = threadIdx.x; j < n; j += blockDim.x) prob[base + j] /= s;
    if (threadIdx.x == 0) {
        const long long k = label[blockIdx.x];
        nll[blockIdx.x] = log(s) - (0 <= k && k < n ? x[base + k] - m : real(0) / real(0));
    }
}

extern "C" __global__ void cross_entropy_forward_i32(const real* x, const int* label,
                                                     long long n, real* prob, real* nll) {
    cross_entropy_row(x, label, n, prob, nll);
}

extern "C" __global__ void cross_entropy_forward_i64(const real* x, const long long* label,
                                                     long long n, real* prob, real* nll) {
    cross_entropy_row(x, label, n, prob, nll);
}

// dw <- scale * w * (dw - sum(dw * w)) in place, per row of n
extern "C" __global__ void attention_softmax_backward(const real* w, real* dw, real scale,
                                                      long long n) {
    __shared__ real shared[33];
    const long long base = blockIdx.x * n;
    real s = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) s += dw[base + j] * w[base + j];
    s = block_sum(s, shared);  // ends with a barrier: every read of dw is done
    for (long long j = threadIdx.x; j < n; j += blockDim.x)
        dw[base + j] = scale * w[base + j] * (dw[base + j] - s);
}

// out = scale * sum((p - l)^2) over n elements, in one block
extern "C" __global__ void squared_error_sum(const real* p, const real* l, long long n,
                                             real scale, real* out) {
    __shared__ real shared[33];
    real s = 0;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const real d = p[j] - l[j];
        s += d * d;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) out[0] = s * scale;
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

// dw[c] = sum over the rows of dy * xhat, db[c] = sum of dy; a block of (32, 8) threads per 32
// columns: thread (x, y) sums the rows y, y + 8, ... of column x, then row 0 adds the 8 sums
extern "C" __global__ void layer_norm_param_grads(
        const real* dy, const real* xhat, long long rows, long long n, real* dw, real* db) {
    __shared__ real sw[8][32], sb[8][32];
    const long long c = blockIdx.x * 32 + threadIdx.x;
    real a = 0, b = 0;
    for (long long r = threadIdx.y; c < n && r < rows; r += 8) {
        a += dy[r * n + c] * xhat[r * n + c];
        b += dy[r * n + c];
    }
    sw[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        for (int k = 1; k < 8; ++k) {
            a += sw[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        dw[c] = a;
        db[c] = b;
    }
}

// the sums of the columns of a (rows, n) matrix: the same blocks as layer_norm_param_grads
extern "C" __global__ void column_sums(const real* a, long long rows, long long n, real* out) {
    __shared__ real partial[8][32];
    const long long c = blockIdx.x * 32 + threadIdx.x;
    real sum = 0;
    for (long long r = threadIdx.y; c < n && r < rows; r += 8) sum += a[r * n + c];
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        for (int k = 1; k < 8; ++k) sum += partial[k][threadIdx.x];
        out[c] = sum;
    }
}
"""
_ROW_TYPES = {"float32": "float", "float64": "double"}


@functools.cache
def _row_kernels(dtype_name: str) -> dict:
    module = cp.RawModule(code=f"typedef {_ROW_TYPES[dtype_name]} real;\n" + _ROW_SOURCE)
    return {
        "softmax_forward": module.get_function("softmax_forward"),
        "softmax_backward": module.get_function("softmax_backward"),
        "cross_entropy_forward_i32": module.get_function("cross_entropy_forward_i32"),
        "cross_entropy_forward_i64": module.get_function("cross_entropy_forward_i64"),
        "attention_softmax": module.get_function("attention_softmax"),
        "attention_softmax_backward": module.get_function("attention_softmax_backward"),
        "squared_error_sum": module.get_function("squared_error_sum"),
        "layer_norm_forward": module.get_function("layer_norm_forward"),
        "layer_norm_backward": module.get_function("layer_norm_backward"),
        "layer_norm_param_grads": module.get_function("layer_norm_param_grads"),
        "column_sums": module.get_function("column_sums"),
    }


def _row_threads(n: int) -> int:
    """Threads per row: a multiple of 32, about one per 4 elements, at most 1024."""
    return min(1024, 32 * max(1, -(-n // 128)))


def _run_rows(name: str, rows: int, n: int, dtype, args) -> None:
    """Launch row kernel ``name`` with one block of ``_row_threads(n)`` threads per row."""
    if rows and n:
        _row_kernels(dtype.name)[name]((rows,), (_row_threads(n),), args)


def _softmax(x, take_log: int):
    y = cp.empty_like(x)
    _run_rows("softmax_forward", *x.shape, x.dtype,
              (x, cp.int64(x.shape[1]), cp.int32(take_log), y))
    return y


def _softmax_grad(y, dy, take_log: int):
    dx = cp.empty_like(dy)
    _run_rows("softmax_backward", *y.shape, y.dtype,
              (y, dy, cp.int64(y.shape[1]), cp.int32(take_log), dx))
    return dx


def softmax(x):
    return _softmax(x, 0)


def softmax_grad(y, dy):
    return _softmax_grad(y, dy, 0)


def log_softmax(x):
    return _softmax(x, 1)


def log_softmax_grad(y, dy):
    return _softmax_grad(y, dy, 1)


_cross_entropy_backward = cp.ElementwiseKernel(
    "raw L label, raw T dy, int64 dy_step, T divisor, int64 n", "T g",
    """
    const long long r = i / n;
    g = (g - (i % n == label[r] ? T(1) : T(0))) * (dy[r * dy_step] / divisor);
    """,
    "minigrad_cross_entropy_backward")


def cross_entropy_rows(x, label):
    if not _fusable(x):
        return _cpu.cross_entropy_rows(x, label)
    rows, n = x.shape
    prob, nll = cp.empty_like(x), cp.empty(rows, x.dtype)
    if label.dtype != cp.int32:
        label = label.astype(cp.int64, copy=False)
    name = "cross_entropy_forward_i32" if label.dtype == cp.int32 else "cross_entropy_forward_i64"
    _run_rows(name, rows, n, x.dtype, (x, label, cp.int64(n), prob, nll))
    return nll, prob


def cross_entropy_rows_grad(prob, label, dy, divisor):
    if not _fusable(prob):
        return _cpu.cross_entropy_rows_grad(prob, label, dy, divisor)
    if prob.size:
        _cross_entropy_backward(label, cp.ascontiguousarray(dy, prob.dtype), 1 if dy.ndim else 0,
                                prob.dtype.type(divisor), prob.shape[1], prob)
    return prob


def attention_softmax(scores, scale, bias, causal):
    groups, length, src = scores.shape
    bias_groups = 0 if bias is None else bias.shape[0]
    t = scores.dtype.type
    _run_rows("attention_softmax", groups * length, src, scores.dtype,
              (scores, scores if bias is None else bias,  # not read without a bias
               t(scale), cp.int64(bias_groups), cp.int64(length), cp.int64(src),
               cp.int32(causal)))


def attention_softmax_grad(w, dw, scale):
    groups, length, src = w.shape
    _run_rows("attention_softmax_backward", groups * length, src, w.dtype,
              (w, dw, w.dtype.type(scale), cp.int64(src)))


def _affine_args(p, like):
    return (like, 0) if p is None else (cp.ascontiguousarray(p.reshape(-1), like.dtype), 1)


def layer_norm(x, weight, bias, eps):
    rows, n = x.shape
    y, xhat, rstd = cp.empty_like(x), cp.empty_like(x), cp.empty(rows, x.dtype)
    w, has_w = _affine_args(weight, x)
    b, has_b = _affine_args(bias, x)
    _run_rows("layer_norm_forward", rows, n, x.dtype,
              (x, w, b, cp.int32(has_w), cp.int32(has_b), x.dtype.type(eps), cp.int64(n),
               y, xhat, rstd))
    return y, xhat, rstd


def layer_norm_grad(dy, xhat, rstd, weight):
    rows, n = dy.shape
    dx = cp.empty_like(dy)
    w, has_w = _affine_args(weight, dy)
    _run_rows("layer_norm_backward", rows, n, dy.dtype,
              (dy, xhat, rstd, w, cp.int32(has_w), cp.int64(n), dx))
    if not rows:  # the sums of no rows
        return dx, cp.zeros(n, dy.dtype), cp.zeros(n, dy.dtype)
    dw, db = cp.empty(n, dy.dtype), cp.empty(n, dy.dtype)
    if n:
        _row_kernels(dy.dtype.name)["layer_norm_param_grads"](
            (-(-n // 32),), (32, 8), (dy, xhat, cp.int64(rows), cp.int64(n), dw, db))
    return dx, dw, db


COLUMN_SUM_MAX_ROWS = 1 << 16  # beyond, CuPy's reduction, whose blocks also split the rows


def column_sums(a):
    if (not _fusable(a) or a.ndim != 2 or not a.flags.c_contiguous
            or a.shape[0] > COLUMN_SUM_MAX_ROWS):
        return _cpu.column_sums(a)
    rows, n = a.shape
    out = cp.empty(n, a.dtype)
    if n:
        _row_kernels(a.dtype.name)["column_sums"](
            (-(-n // 32),), (32, 8), (a, cp.int64(rows), cp.int64(n), out))
    return out


# --------------------------------------------------------------------------------------------------
# the range of an index array (device_checks): min and max in one single-block kernel, where CuPy
# took a reduction and a cast for each

_MIN_MAX_SOURCE = r"""
template <class I>
__device__ void min_max(const I* a, long long n, long long* out) {
    __shared__ long long shared_lo[32], shared_hi[32];
    long long lo = 0x7fffffffffffffffLL, hi = -lo - 1;
    for (long long j = threadIdx.x; j < n; j += blockDim.x) {
        const long long v = a[j];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const long long l = __shfl_down_sync(0xffffffffu, lo, o);
        const long long h = __shfl_down_sync(0xffffffffu, hi, o);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        shared_lo[warp] = lo;
        shared_hi[warp] = hi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            lo = shared_lo[w] < lo ? shared_lo[w] : lo;
            hi = shared_hi[w] > hi ? shared_hi[w] : hi;
        }
        out[0] = lo;
        out[1] = hi;
    }
}

extern "C" __global__ void min_max_i32(const int* a, long long n, long long* out) {
    min_max(a, n, out);
}

extern "C" __global__ void min_max_i64(const long long* a, long long n, long long* out) {
    min_max(a, n, out);
}
"""


@functools.cache
def _min_max_kernels() -> dict:
    module = cp.RawModule(code=_MIN_MAX_SOURCE)
    return {"min_max_i32": module.get_function("min_max_i32"),
            "min_max_i64": module.get_function("min_max_i64")}


def min_max(a):
    if a.dtype != cp.int32:
        a = a.astype(cp.int64, copy=False)
    a = cp.ascontiguousarray(a)
    out = cp.empty(2, cp.int64)
    name = "min_max_i32" if a.dtype == cp.int32 else "min_max_i64"
    _min_max_kernels()[name]((1,), (256,), (a, cp.int64(a.size), out))
    return out[0], out[1]


# --------------------------------------------------------------------------------------------------
# squared error: the sum of squares in one block (``_ROW_SOURCE``), its gradient in one pass
# (recomputing the difference instead of keeping it)

_squared_error_backward = cp.ElementwiseKernel(
    "T p, T l, raw T dy, T scale", "T dp", "const T u = (dy[0] * scale) * (p - l); dp = u + u",
    "minigrad_squared_error_backward")


def squared_error_sum(pred, label, scale):
    if not _fusable(pred):
        return _cpu.squared_error_sum(pred, label, scale)
    total = cp.empty((), pred.dtype)
    one = 1.0 if scale is None else scale
    _row_kernels(pred.dtype.name)["squared_error_sum"](
        (1,), (1024,), (cp.ascontiguousarray(pred), cp.ascontiguousarray(label),
                        cp.int64(pred.size), pred.dtype.type(one), total))
    return total, None


def squared_error_grad(pred, label, diff, dy, scale):
    if not _fusable(pred):
        return _cpu.squared_error_grad(pred, label, diff, dy, scale)
    one = 1.0 if scale is None else scale
    return _squared_error_backward(pred, label, cp.ascontiguousarray(dy, pred.dtype),
                                   pred.dtype.type(one))


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


# the backward gathers: each input pixel adds the gradients of the outputs whose window holds it
# and chose it, in the order of the outputs (the CPU's scatter order), so no atomics
_max_pool_backward = cp.ElementwiseKernel(
    "raw T dy, raw int32 argmax, int64 h, int64 w, int64 oh, int64 ow, int64 kh, int64 kw, "
    "int64 sh, int64 sw, int64 ph, int64 pw",
    "T dx",
    """
    const long long k = i, xx = k % w, y = (k / w) % h, plane = k / (w * h);
    const long long r_lo = y + ph - kh + 1, c_lo = xx + pw - kw + 1;
    const long long r0 = r_lo > 0 ? (r_lo + sh - 1) / sh : 0;
    const long long c0 = c_lo > 0 ? (c_lo + sw - 1) / sw : 0;
    const long long r1 = (y + ph) / sh < oh - 1 ? (y + ph) / sh : oh - 1;
    const long long c1 = (xx + pw) / sw < ow - 1 ? (xx + pw) / sw : ow - 1;
    const int me = (int)(y * w + xx);
    T acc = 0;
    for (long long r = r0; r <= r1; ++r) {
        for (long long c = c0; c <= c1; ++c) {
            const long long o = (plane * oh + r) * ow + c;
            if (argmax[o] == me) acc += dy[o];
        }
    }
    dx = acc;
    """,
    "minigrad_max_pool2d_backward",
)


def max_pool2d_grad(dy, argmax, x_shape, kernel, stride, padding):
    dx = cp.empty(x_shape, dy.dtype)
    if dx.size:
        _max_pool_backward(dy, argmax, *x_shape[2:], *dy.shape[2:], *kernel, *stride, *padding,
                           dx)
    return dx


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
_adam_step = cp.ElementwiseKernel(  # c1 = 1 - b1, c2 = 1 - b2 rounded once, as on the CPU
    "T g, T lr, T b1, T c1, T b2, T c2, T eps, T wd, T bc1, T bc2, bool decoupled",
    "T p, T m, T v",
    """
    const T d = (wd != T(0) && !decoupled) ? g + wd * p : g;
    m = b1 * m + c1 * d;
    v = b2 * v + c2 * (d * d);
    T delta = (m / bc1) / (sqrt(v / bc2) + eps);
    if (wd != T(0) && decoupled) delta = delta + wd * p;
    p = p - lr * delta;
    """,
    "minigrad_adam_step")


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
    _adam_step(g, lr, b1, 1 - b1, b2, 1 - b2, eps, weight_decay, 1 - b1**step, 1 - b2**step,
               decoupled, p, m, v)


# many parameters per launch: their pointers and sizes travel by value in one struct argument
# (CuPy passes the bytes of a one-item host NumPy array by value: a structured array here),
# blockIdx.y picks the parameter

LIST_SLOTS = 16  # parameters per launch: the struct is 768 (float) or 896 (double) bytes

_LIST_SOURCE = r"""
struct TensorList {  // parameter k: p, its gradient g, its state a and b, n elements, 2 scalars
    unsigned long long p[16], g[16], a[16], b[16];
    long long n[16];
    real c1[16], c2[16];
};

extern "C" __global__ void sgd_steps(TensorList t, int count, real lr, real momentum, real wd,
                                     int nesterov, int has_buf) {
    const int k = blockIdx.y;
    if (k >= count) return;
    real* p = (real*)t.p[k];
    const real* g = (const real*)t.g[k];
    real* buf = (real*)t.a[k];
    const long long n = t.n[k];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const real d = wd != real(0) ? g[i] + wd * p[i] : g[i];
        if (has_buf) {
            const real b = momentum * buf[i] + d;
            buf[i] = b;
            p[i] = p[i] - lr * (nesterov ? d + momentum * b : b);
        } else {
            p[i] = p[i] - lr * d;
        }
    }
}

// t.p: gradients, t.a: their unscaled copies, t.b: one int per gradient, set to 1 when it holds
// an inf or NaN (never reset here: the caller zeroes the flags)
extern "C" __global__ void unscale_grads(TensorList t, int count, real factor) {
    const int k = blockIdx.y;
    if (k >= count) return;
    const real* g = (const real*)t.p[k];
    real* out = (real*)t.a[k];
    const long long n = t.n[k];
    bool finite = true;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const real x = g[i];
        finite = finite && isfinite(x);
        out[i] = x * factor;
    }
    if (!finite) *(int*)t.b[k] = 1;
}

// t.c1, t.c2: the bias corrections 1 - b1^t and 1 - b2^t of each parameter's step t;
// c1 = 1 - b1, c2 = 1 - b2 rounded once, as on the CPU
extern "C" __global__ void adam_steps(TensorList t, int count, real lr, real b1, real c1,
                                      real b2, real c2, real eps, real wd, int decoupled) {
    const int k = blockIdx.y;
    if (k >= count) return;
    real* p = (real*)t.p[k];
    const real* g = (const real*)t.g[k];
    real* m = (real*)t.a[k];
    real* v = (real*)t.b[k];
    const long long n = t.n[k];
    const real bc1 = t.c1[k], bc2 = t.c2[k];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const real d = (wd != real(0) && !decoupled) ? g[i] + wd * p[i] : g[i];
        const real mi = b1 * m[i] + c1 * d;
        const real vi = b2 * v[i] + c2 * (d * d);
        m[i] = mi;
        v[i] = vi;
        real delta = (mi / bc1) / (sqrt(vi / bc2) + eps);
        if (wd != real(0) && decoupled) delta = delta + wd * p[i];
        p[i] = p[i] - lr * delta;
    }
}
"""


@functools.cache
def _list_kernels(dtype_name: str) -> dict:
    module = cp.RawModule(code=f"typedef {_ROW_TYPES[dtype_name]} real;\n" + _LIST_SOURCE)
    return {"sgd_steps": module.get_function("sgd_steps"),
            "adam_steps": module.get_function("adam_steps"),
            "unscale_grads": module.get_function("unscale_grads")}


@functools.cache
def _list_dtype(dtype_name: str) -> np.dtype:
    """The NumPy layout of ``TensorList`` (every field 8-byte aligned, so no padding)."""
    slots = (LIST_SLOTS,)
    return np.dtype([("p", "u8", slots), ("g", "u8", slots), ("a", "u8", slots),
                     ("b", "u8", slots), ("n", "i8", slots), ("c1", dtype_name, slots),
                     ("c2", dtype_name, slots)], align=True)


def _listable(*arrays) -> bool:
    return _fusable(*arrays) and all(a.flags.c_contiguous for a in arrays)


def _launch_lists(name: str, columns: dict, scalars: dict, args: tuple) -> None:
    """Launch list kernel ``name`` over parameters of one dtype, LIST_SLOTS at a time:
    ``columns`` maps fields of ``TensorList`` (``p``, ``g``, ``a``, ``b``) to lists of arrays,
    ``scalars`` the fields ``c1``, ``c2`` to lists of numbers; ``args`` follow the count."""
    params = columns["p"]
    dtype = params[0].dtype
    for lo in range(0, len(params), LIST_SLOTS):
        hi = min(len(params), lo + LIST_SLOTS)
        record = np.zeros((), _list_dtype(dtype.name))
        for field, arrays in columns.items():
            record[field][: hi - lo] = [a.data.ptr for a in arrays[lo:hi]]
        for field, values in scalars.items():
            record[field][: hi - lo] = values[lo:hi]
        record["n"][: hi - lo] = [a.size for a in params[lo:hi]]
        blocks = min(1024, max(1, -(-max(a.size for a in params[lo:hi]) // 256)))
        _list_kernels(dtype.name)[name]((blocks, hi - lo), (256,),
                                        (record, np.int32(hi - lo), *args))


def sgd_steps(params, grads, bufs, lr, momentum, weight_decay, nesterov):
    listed, dtype = [], params[0].dtype
    for k, (p, g, buf) in enumerate(zip(params, grads, bufs)):
        if p.dtype == dtype and _listable(p, g, *(() if buf is None else (buf,))):
            listed.append(k)
        else:  # another dtype or layout: its own kernel
            sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov)
    if not listed:
        return
    columns = {"p": [params[k] for k in listed], "g": [grads[k] for k in listed]}
    has_buf = bufs[listed[0]] is not None
    if has_buf:
        columns["a"] = [bufs[k] for k in listed]
    t = dtype.type
    _launch_lists("sgd_steps", columns, {},
                  (t(lr), t(momentum), t(weight_decay), np.int32(nesterov), np.int32(has_buf)))


def adam_steps(params, grads, ms, vs, lr, b1, b2, eps, weight_decay, decoupled, steps):
    listed, dtype = [], params[0].dtype
    for k, (p, g, m, v) in enumerate(zip(params, grads, ms, vs)):
        if p.dtype == dtype and _listable(p, g, m, v):
            listed.append(k)
        else:
            adam_step(p, g, m, v, lr, b1, b2, eps, weight_decay, decoupled, steps[k])
    if not listed:
        return
    columns = {"p": [params[k] for k in listed], "g": [grads[k] for k in listed],
               "a": [ms[k] for k in listed], "b": [vs[k] for k in listed]}
    corrections = {"c1": [1 - b1**steps[k] for k in listed],
                   "c2": [1 - b2**steps[k] for k in listed]}
    t = dtype.type
    _launch_lists("adam_steps", columns, corrections,
                  (t(lr), t(b1), t(1 - b1), t(b2), t(1 - b2), t(eps), t(weight_decay),
                   np.int32(decoupled)))


def unscale_grads(grads, factor):
    dtype = next((g.dtype for g in grads if _listable(g)), None)  # one dtype goes in lists
    listed = [k for k, g in enumerate(grads) if g.dtype == dtype and _listable(g)]
    outs = [None] * len(grads)
    for k in listed:
        outs[k] = cp.empty_like(grads[k])
    bad = cp.zeros(len(grads), np.int32)
    for k, g in enumerate(grads):
        if outs[k] is None:  # another dtype or layout: composed
            outs[k] = _cpu.unscale_grad(g, factor)
            bad[k] = ~cp.isfinite(g).all()
    if listed:
        _launch_lists("unscale_grads",
                      {"p": [grads[k] for k in listed], "a": [outs[k] for k in listed],
                       "b": [bad[k:k + 1] for k in listed]},
                      {}, (dtype.type(factor),))
    return outs, bad
