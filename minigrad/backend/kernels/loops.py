"""The numba loops of the CPU kernels: one pass over C-contiguous arrays where NumPy needs many.

Each kernel writes into arrays its caller allocated (see ``minigrad.backend.kernels``, which holds
the shapes, dtypes and the choice of device) and runs on the calling thread; the matrix products
around them are left to BLAS, which has the cores. (numba's parallel loops were tried: next to
OpenBLAS's pool, every switch between the two pools cost a thread wake-up of 40-150 us on the
reference VM when both wait passively, and they fought for the cores when either spins, so a
GEMM + GELU pair got no faster.)

float64 keeps the C library's ``exp``/``erfc``, so float64 results match NumPy to a few ulp (the
tests compare to 1e-10). float32 uses the vectorisable :func:`exp` and :func:`normal_cdf_pdf`
below, 16 lanes at a time where NumPy's float32 GELU took about 30 passes over memory: ``exp`` is
within 2 ulp of the rounded value; GELU within 1e-6 (relative) for ``|x| < 4`` and 1e-5 in the
far lower tail, where the float32 argument ``-x**2/2`` of the normal's exp is the limit (as it is
for NumPy's float32 version of the same formula). Sums run with the reassociation flags of
:func:`minigrad.backend.kernels.jit.reduction` and accumulate float32 in float64.

All of this module (and numba with it) is imported on the first kernel call, never by
``import minigrad``. The file is one unit for numba's on-disk cache: editing it recompiles every
kernel, so a helper can never be stale in the cached code of its callers.
"""

from __future__ import annotations

import math

import numpy as np

# first: jit sets numba's tuning (NUMBA_CPU_NAME) before numba loads
from minigrad.backend.kernels.jit import kernel, math_kernel, reduction, scalar  # isort: split

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

F32 = np.float32
I32 = np.int32
# Indices computed from several terms are cast to uint64 (``U``): numba supports negative indices,
# so a signed index costs a wrap-around select per access and stops loops from vectorising (about
# 10x slower im2col); an unsigned one is used as is. The callers guarantee they are in range.
U = np.uint64
INV_SQRT2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# --------------------------------------------------------------------------------------------------
# scalar math: exp and the normal CDF that vectorise for float32, the C library for float64


@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret an int32 as the float32 with the same bits (a free register move)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _bits_from_f32(typingctx, value):
    """Reinterpret a float32 as the int32 with the same bits."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


_EXP_LO = F32(-87.33654)  # ln(smallest normal float32): below it the result is 0 (no denormals)
_EXP_HI = F32(88.72283)  # ln(largest float32): above it the result is inf
_ROUND = F32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 of magnitude < 2**22 to an int
_LN2_HI, _LN2_LO = F32(0.693145751953125), F32(1.428606765330187e-06)  # ln 2, split (Cody-Waite)


@scalar
def _exp_f32(x):
    """``e**x`` for float32 within 2 ulp: ``x = n ln2 + r`` with ``|r| <= ln2 / 2``, a degree-7
    Taylor polynomial for ``e**r``, and ``2**n`` built from its bits (as two factors, so that
    ``n = 128`` does not overflow the exponent field). Exactly 0 below ln(FLT_MIN) ~ -87.34, inf
    above ln(FLT_MAX), NaN for NaN."""
    xc = min(max(x, _EXP_LO), _EXP_HI)
    t = xc * F32(1.442695) + _ROUND  # round(x / ln2) sits in the low bits of t
    n = t - _ROUND
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = F32(1.0) + r * (F32(1.0) + r * (F32(0.5) + r * (F32(1.6666667e-1) + r * (
        F32(4.1666668e-2) + r * (F32(8.333334e-3) + r * (F32(1.3888889e-3) + r * F32(
            1.984127e-4)))))))
    k = _bits_from_f32(t) - _bits_from_f32(_ROUND)  # the integer n
    half = k >> I32(1)
    y = p * _f32_from_bits((half + I32(127)) << I32(23))
    y = y * _f32_from_bits((k - half + I32(127)) << I32(23))
    if x < _EXP_LO:
        y = F32(0.0)
    elif x > _EXP_HI:
        y = F32(np.inf)
    elif x != x:
        y = x
    return y


# erfc(z) = t * exp(-z^2) * Q(t) with t = 1 / (1 + z/2), z >= 0: Q(t) = erfcx(2/t - 2) / t is smooth
# on (0, 1] (from 1/sqrt(pi) at t -> 0 to 1 at t = 1), fitted here by a degree-10 polynomial (least
# squares on 6000 Chebyshev nodes, reweighted towards the largest relative errors; with the
# coefficients rounded to float32 the relative error of Q is below 5.2e-8, under float32's epsilon).
_Q = tuple(F32(c) for c in (
    0.282094806432724, 0.2820938527584076, 0.24688059091567993, 0.1753767877817154,
    0.09300088882446289, -0.05723382160067558, 0.12709295749664307, -0.4469830095767975,
    0.48618412017822266, -0.2308603823184967, 0.04235319420695305))


@scalar
def _normal_cdf_pdf_f32(x):
    """``(Phi(x), pdf(x))`` of the standard normal for float32, sharing one ``exp(-x**2/2)``:
    ``pdf = e / sqrt(2 pi)`` and ``Phi(-|x|) = erfc(|x|/sqrt2) / 2 = t e Q(t) / 2`` (the fit
    above), so that the lower tail keeps its relative accuracy (``1 - Phi(|x|)`` would cancel)."""
    e = _exp_f32(x * x * F32(-0.5))
    t = F32(1.0) / (F32(1.0) + abs(x) * F32(0.5 * INV_SQRT2))
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10 = _Q
    q = c0 + t * (c1 + t * (c2 + t * (c3 + t * (c4 + t * (c5 + t * (c6 + t * (c7 + t * (
        c8 + t * (c9 + t * c10)))))))))
    lower = t * e * q * F32(0.5)
    return (lower if x < F32(0.0) else F32(1.0) - lower), e * F32(INV_SQRT_2PI)


def exp(x):
    """``e**x``, typed by numba: :func:`_exp_f32` for float32, the C library otherwise."""
    return math.exp(x)


def normal_cdf_pdf(x):
    """``(Phi(x), pdf(x))`` of the standard normal, typed by numba: :func:`_normal_cdf_pdf_f32`
    for float32, the C library's ``erfc`` and ``exp`` otherwise."""
    return math.erfc(-x * INV_SQRT2) * 0.5, math.exp(x * x * -0.5) * INV_SQRT_2PI


@overload(exp, inline="always")
def _exp_typed(x):
    if x == types.float32:
        return lambda x: _exp_f32(x)
    return lambda x: math.exp(x)


@overload(normal_cdf_pdf, inline="always")
def _normal_cdf_pdf_typed(x):
    if x == types.float32:
        return lambda x: _normal_cdf_pdf_f32(x)
    return lambda x: (math.erfc(-x * INV_SQRT2) * 0.5, math.exp(x * x * -0.5) * INV_SQRT_2PI)


# --------------------------------------------------------------------------------------------------
# reductions over the run a[lo:hi] of a flat array (float32 accumulates in float64)
#
# Row kernels take flat arrays and offsets rather than a view per row: creating a view in numba
# touches its reference count (an atomic operation), which cost more than a 64-element row.


@reduction
def run_sum(a, lo, hi):
    s = 0.0
    for i in range(lo, hi):
        s += a[U(i)]
    return s


@reduction
def run_dot(a, b, lo, hi):
    s = 0.0
    for i in range(lo, hi):
        s += np.float64(a[U(i)]) * b[U(i)]
    return s


@reduction
def run_centered_sumsq(a, lo, hi, mean):
    s = 0.0
    for i in range(lo, hi):
        d = a[U(i)] - mean
        s += d * d
    return s


@reduction
def run_affine_sums(g, w, xhat, lo, n):
    """``sum(g * w)`` and ``sum(g * w * xhat)`` over ``g[lo:lo+n]`` (``w`` has ``n`` entries)."""
    s1 = 0.0
    s2 = 0.0
    for c in range(n):
        gw = np.float64(g[U(lo + c)]) * w[U(c)]
        s1 += gw
        s2 += gw * xhat[U(lo + c)]
    return s1, s2


@intrinsic
def _ordered_int(typingctx, value):
    """The bits of a float as an int whose signed order is the float order (flip the magnitude of
    negatives): integer max loops vectorise where float max loops do not, in numba. A NaN with the
    sign bit clear sorts above +inf, one with it set below -inf."""
    width = value.bitwidth

    def codegen(context, builder, signature, args):
        it = ir.IntType(width)
        bits = builder.bitcast(args[0], it)
        sign = builder.ashr(bits, ir.Constant(it, width - 1))
        return builder.xor(bits, builder.and_(sign, ir.Constant(it, (1 << (width - 1)) - 1)))

    return (types.int32 if width == 32 else types.int64)(value), codegen


@intrinsic
def _ordered_float(typingctx, key):
    """The inverse of :func:`_ordered_int` (the same flip, then back to a float)."""
    width = key.bitwidth

    def codegen(context, builder, signature, args):
        it = ir.IntType(width)
        sign = builder.ashr(args[0], ir.Constant(it, width - 1))
        bits = builder.xor(args[0], builder.and_(sign, ir.Constant(it, (1 << (width - 1)) - 1)))
        return builder.bitcast(bits, ir.FloatType() if width == 32 else ir.DoubleType())

    return (types.float32 if width == 32 else types.float64)(key), codegen


@kernel
def run_max(a, lo, hi):
    """The largest of ``a[lo:hi]`` (-inf when empty; NaN if a NaN with a clear sign bit is in it,
    and any NaN still reaches a softmax through its own exponential)."""
    m = _ordered_int(a.dtype.type(-np.inf))
    for i in range(lo, hi):
        m = max(m, _ordered_int(a[U(i)]))
    return _ordered_float(m)


# --------------------------------------------------------------------------------------------------
# ReLU on flat arrays


@kernel
def relu_forward(x, y, mask):
    """``mask = x > 0``; ``y = x`` there (and where ``x`` is NaN, which propagates), else ``+0.0``
    (``-inf`` gives 0, where ``x * (x > 0)`` gave NaN)."""
    zero = x.dtype.type(0)
    for i in range(x.size):
        v = x[i]
        m = v > zero
        mask[i] = m
        y[i] = v if m or v != v else zero


@kernel
def relu_backward(dy, mask, dx):
    """``dx = dy`` where ``mask``, else 0 (also where ``dy`` is inf or NaN, as PyTorch)."""
    zero = dy.dtype.type(0)
    for i in range(dy.size):
        dx[i] = dy[i] if mask[i] else zero


# --------------------------------------------------------------------------------------------------
# squared error: the element-wise passes (the sum stays NumPy's, so the loss keeps its bits)


@kernel
def squared_difference(pred, label, diff, sq):
    """``diff = pred - label`` and ``sq = diff * diff`` in one pass."""
    for i in range(pred.size):
        d = pred[i] - label[i]
        diff[i] = d
        sq[i] = d * d


@kernel
def doubled_product(g, diff, out):
    """``out = u + u`` with ``u = g * diff`` (the squared error's gradient: the square's two
    equal halves, added as the composition adds them)."""
    for i in range(diff.size):
        u = g * diff[i]
        out[i] = u + u


# --------------------------------------------------------------------------------------------------
# GELU (exact erf form) on flat arrays


@math_kernel
def gelu_forward(x, y, slope):
    """``y = x * Phi(x)`` and its derivative ``slope = Phi(x) + x * pdf(x)``, saved for backward
    (which is then one multiply: no ``x``, no second ``exp``)."""
    for i in range(x.size):
        v = x[i]
        cdf, pdf = normal_cdf_pdf(v)
        y[i] = v * cdf
        slope[i] = cdf + v * pdf


# --------------------------------------------------------------------------------------------------
# softmax family over rows of n elements of flat arrays (the caller ensures n > 0)


@math_kernel
def _exp_shifted(x, y, lo, hi, m):
    """``y[lo:hi] = exp(x[lo:hi] - m)``; returns their sum."""
    for i in range(lo, hi):
        y[U(i)] = exp(x[U(i)] - m)
    return run_sum(y, lo, hi)


@kernel
def softmax_forward(x, y, n):
    for lo in range(0, x.size, n):
        total = y.dtype.type(_exp_shifted(x, y, lo, lo + n, run_max(x, lo, lo + n)))
        for i in range(lo, lo + n):
            y[U(i)] = y[U(i)] / total


@kernel
def softmax_backward(y, dy, dx, n):
    """``dx = y * (dy - sum(dy * y))`` per row."""
    for lo in range(0, y.size, n):
        s = y.dtype.type(run_dot(dy, y, lo, lo + n))
        for i in range(lo, lo + n):
            dx[U(i)] = y[U(i)] * (dy[U(i)] - s)


@kernel
def log_softmax_forward(x, y, n):
    """``y = x - max - log(sum(exp(x - max)))`` per row (``y`` holds the exps in between)."""
    for lo in range(0, x.size, n):
        m = run_max(x, lo, lo + n)
        shift = m + y.dtype.type(math.log(_exp_shifted(x, y, lo, lo + n, m)))
        for i in range(lo, lo + n):
            y[U(i)] = x[U(i)] - shift


@math_kernel
def log_softmax_backward(y, dy, dx, n):
    """``dx = dy - exp(y) * sum(dy)`` per row."""
    for lo in range(0, y.size, n):
        s = y.dtype.type(run_sum(dy, lo, lo + n))
        for i in range(lo, lo + n):
            dx[U(i)] = dy[U(i)] - exp(y[U(i)]) * s


@kernel
def cross_entropy_forward(x, label, nll, prob, n):
    """Per row of ``n`` logits: ``prob`` = the row's softmax and ``nll = shift - x[label]`` with
    ``shift = max + log(sum(exp(x - max)))``: the operations of :func:`log_softmax_forward` and
    :func:`softmax_forward`, so the bits of ``-log_softmax(x)[label]`` and ``softmax(x)``.
    Labels out of [0, n) (which the caller reports) are clipped: nothing outside a row is read."""
    one_less = n - 1
    for r in range(nll.size):
        lo = r * n
        m = run_max(x, lo, lo + n)
        total = _exp_shifted(x, prob, lo, lo + n, m)
        shift = m + prob.dtype.type(math.log(total))
        k = min(max(label[U(r)], 0), one_less)
        nll[U(r)] = -(x[U(lo + k)] - shift)
        t = prob.dtype.type(total)
        for i in range(lo, lo + n):
            prob[U(i)] = prob[U(i)] / t


@kernel
def cross_entropy_backward(prob, label, scale, n):
    """``prob = (prob - one_hot(label)) * s`` in place per row of ``n``, ``s`` the row's entry of
    ``scale`` (one per row) or its only one: NumPy's ``prob[rows, label] -= 1; prob *= s``, bit
    for bit. Labels clipped as in :func:`cross_entropy_forward`."""
    one = prob.dtype.type(1)
    one_less = n - 1
    per_row = scale.size == label.size
    for r in range(label.size):
        lo = r * n
        k = U(lo + min(max(label[U(r)], 0), one_less))
        prob[k] = prob[k] - one
        s = scale[U(r)] if per_row else scale[0]
        for i in range(lo, lo + n):
            prob[U(i)] = prob[U(i)] * s


# --------------------------------------------------------------------------------------------------
# attention weights: softmax(scale * scores + bias) in place over (G, L, S), causal masking


@math_kernel
def _exp_in_place(a, lo, hi):
    """``a[lo:hi] = exp(a[lo:hi])`` in one long loop."""
    for i in range(lo, hi):
        a[U(i)] = exp(a[U(i)])


@math_kernel
def attention_softmax(s, scale, bias, causal):
    """``s[g] <- softmax(scale * s[g] + bias[g or 0])`` over the last axis of (G, L, S); with
    ``causal`` query ``i`` sees keys ``j <= i`` only (top-left aligned; the others get weight 0,
    as ``-inf`` would).

    The exponentials run as one long loop over each (L, S) matrix, not row by row: a row is too
    short for the vectorised loop (a causal row has ``i + 1`` keys), which left most of its
    exponentials to the loop's scalar remainder (64 x 64, causal: 185 -> 121 us, bit for bit the
    same). Keys a row does not see enter that loop as ``-inf`` (weight 0). Where most keys are
    hidden (causal with S > 2L) each row exponentiates only its own keys, as the long loop would
    spend its time on zeros."""
    groups, length, src = s.shape
    flat, bflat = s.reshape(-1), bias.reshape(-1)
    sc = s.dtype.type(scale)
    whole = not causal or 2 * length >= src
    for g in range(groups):
        boff = 0 if bias.shape[0] == 1 else g * length * src
        glo = g * length * src
        for i in range(length):
            lo, blo = glo + i * src, boff + i * src
            seen = min(i + 1, src) if causal else src
            for j in range(seen):
                flat[U(lo + j)] = flat[U(lo + j)] * sc + bflat[U(blo + j)]
            m = run_max(flat, lo, lo + seen)
            if whole:
                for j in range(seen):
                    flat[U(lo + j)] = flat[U(lo + j)] - m
                for j in range(seen, src):
                    flat[U(lo + j)] = -np.inf
            else:
                for j in range(lo, lo + seen):  # in place, not _exp_shifted(flat, flat): an
                    flat[U(j)] = exp(flat[U(j)] - m)  # aliased call fails LLVM's overlap check
                for j in range(lo + seen, lo + src):
                    flat[U(j)] = 0.0
        if whole:
            _exp_in_place(flat, glo, glo + length * src)
        for i in range(length):
            lo = glo + i * src
            seen = min(i + 1, src) if causal else src
            total = s.dtype.type(run_sum(flat, lo, lo + seen))
            for j in range(lo, lo + seen):
                flat[U(j)] = flat[U(j)] / total


@kernel
def attention_softmax_backward(w, dw, scale, n):
    """``dw <- scale * w * (dw - rowsum(dw * w))`` in place over rows of ``n``: the gradient of
    the scaled scores."""
    sc = w.dtype.type(scale)
    for lo in range(0, w.size, n):
        s = w.dtype.type(run_dot(dw, w, lo, lo + n))
        for i in range(lo, lo + n):
            dw[U(i)] = sc * w[U(i)] * (dw[U(i)] - s)


# --------------------------------------------------------------------------------------------------
# layer norm with its affine part over rows of n elements of flat arrays


@kernel
def layer_norm_forward(x, w, b, eps, y, xhat, rstd):
    """``xhat = (x - mean) / sqrt(var + eps)``, ``y = xhat * w + b``; the biased variance.

    The statistics are float64 sums; the element-wise part runs in ``x``'s dtype (in float64 it
    ran at half the SIMD width: float32 rows 2x slower) with the mean split into the float32
    ``mean_hi + mean_lo``, so that data far from zero keeps its centred values (``x - mean_hi``
    is exact near the mean): about as accurate as in float64 (1e-6 at an offset of 1e4, where a
    float32 mean alone would give 1e-3)."""
    n, t = w.size, x.dtype.type
    for r in range(rstd.size):
        lo = r * n
        mean = run_sum(x, lo, lo + n) / n
        rs = 1.0 / math.sqrt(run_centered_sumsq(x, lo, lo + n, mean) / n + eps)
        rstd[r] = rs
        mean_hi = t(mean)
        mean_lo, rs_t = t(mean - mean_hi), t(rs)
        for c in range(n):
            h = ((x[U(lo + c)] - mean_hi) - mean_lo) * rs_t
            xhat[U(lo + c)] = h
            y[U(lo + c)] = h * w[U(c)] + b[U(c)]


@kernel
def layer_norm_backward(g, xhat, rstd, w, dx, dw, db):
    """``dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat))`` (the row's means from float64
    sums, then the element-wise part in ``g``'s dtype); ``dw += sum(g * xhat)`` and
    ``db += sum(g)`` over rows (``dw``, ``db`` are float64 accumulators)."""
    n, t = w.size, g.dtype.type
    for r in range(rstd.size):
        lo = r * n
        s1, s2 = run_affine_sums(g, w, xhat, lo, n)
        m1, m2, rs = t(s1 / n), t(s2 / n), t(rstd[r])
        for c in range(n):
            gc, hc = g[U(lo + c)], xhat[U(lo + c)]
            dx[U(lo + c)] = rs * (gc * w[U(c)] - m1 - hc * m2)
            dw[U(c)] += gc * np.float64(hc)
            db[U(c)] += gc


# --------------------------------------------------------------------------------------------------
# max pooling with the winner's index saved for backward


@scalar
def _window_max(plane, y0, y1, x0, x1, m, k):
    """Fold the window ``plane[y0:y1, x0:x1]`` into the running max ``m`` at flat index ``k``: the
    first maximum in row-major order wins, a NaN beats any number (as NumPy's maximum). Selects,
    not branches: on random data a branch would be mispredicted half the time."""
    wd = plane.shape[1]
    for a in range(y0, y1):
        src = plane[a]
        for b in range(x0, x1):
            v = src[b]
            win = (v > m) | ((v != v) & (m == m))
            m = v if win else m
            k = a * wd + b if win else k
    return m, k


@kernel
def max_pool2d_forward(x, kh, kw, sh, sw, ph, pw, out, argmax):
    """``out[p, i, j]`` = max over its window of plane ``p`` (padding never wins); ``argmax`` holds
    the flat ``h * W + w`` index of the window's first maximum. Planes are (N*C, H, W), outputs
    (N*C, OH, OW)."""
    h, wd = x.shape[1], x.shape[2]
    for p in range(x.shape[0]):
        plane, best, at = x[p], out[p], argmax[p]
        for i in range(out.shape[1]):
            y0, y1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h)
            for j in range(out.shape[2]):
                x0, x1 = max(j * sw - pw, 0), min(j * sw - pw + kw, wd)
                best[i, j], at[i, j] = _window_max(plane, y0, y1, x0, x1, plane[y0, x0],
                                                   y0 * wd + x0)


@kernel
def max_pool2x2_forward(x, out, argmax):
    """:func:`max_pool2d_forward` for the common 2x2 window, stride 2, no padding: with the window
    size known to the compiler the window loops unroll (about 10x faster than the general loop)."""
    wd = x.shape[2]
    for p in range(x.shape[0]):
        plane, best, at = x[p], out[p], argmax[p]
        for i in range(out.shape[1]):
            for j in range(out.shape[2]):
                best[i, j], at[i, j] = _window_max(plane, 2 * i, 2 * i + 2, 2 * j, 2 * j + 2,
                                                   plane[2 * i, 2 * j], 2 * i * wd + 2 * j)


@kernel
def max_pool2d_backward(dy, argmax, dx):
    """``dx[p, argmax[p, k]] += dy[p, k]`` for every plane ``p`` (``dy``, ``argmax`` are
    (planes, OH*OW), ``dx`` is (planes, H*W), zeroed by the caller)."""
    for p in range(dy.shape[0]):
        g, a, d = dy[p], argmax[p], dx[p]
        for k in range(g.size):
            d[U(a[k])] += g[k]


# --------------------------------------------------------------------------------------------------
# convolution layout: im2col / col2im on NCHW, channel-major <-> batch-first copies with bias


@kernel
def _valid_range(k, size, stride, pad, dil, count):
    """The outputs ``o`` in ``[lo, hi)`` read input ``o * stride - pad + k * dil`` inside
    ``[0, size)``."""
    off = k * dil - pad
    lo = 0 if off >= 0 else (-off + stride - 1) // stride
    hi = 0 if size - 1 - off < 0 else (size - 1 - off) // stride + 1
    return min(lo, count), max(min(hi, count), min(lo, count))


@kernel
def patches(x, cols, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, adjoint):
    """im2col, or its adjoint col2im (``adjoint``), between an NCHW image ``x`` and the
    ``(C*kh*kw, N*OH*OW)`` matrix ``cols`` whose product with the weights is the convolution:
    ``cols[(c, i, j), (n, y, x)] = x[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw]``, 0 where that
    pixel is padding; the adjoint adds every entry of ``cols`` onto its pixel (``x`` zeroed by the
    caller) and drops those in the padding. One loop nest for both, so they cannot disagree."""
    nb, ch, h, wd = x.shape
    p = oh * ow
    flat = x.reshape(-1)
    for c in range(ch):
        for i in range(kh):
            ylo, yhi = _valid_range(i, h, sh, ph, dh, oh)
            for j in range(kw):
                xlo, xhi = _valid_range(j, wd, sw, pw, dw, ow)
                row = cols[(c * kh + i) * kw + j]
                if not adjoint:
                    _zero_padding_reads(row, nb, oh, ow, ylo, yhi, xlo, xhi)
                for n in range(nb):
                    for y in range(ylo, yhi):
                        o = U(n * p + y * ow)
                        at = U(((n * ch + c) * h + y * sh - ph + i * dh) * wd - pw + j * dw)
                        if adjoint:
                            for t in range(xlo, xhi):
                                flat[at + U(t) * U(sw)] += row[o + U(t)]
                        else:
                            for t in range(xlo, xhi):
                                row[o + U(t)] = flat[at + U(t) * U(sw)]


@kernel
def _zero_padding_reads(row, nb, oh, ow, ylo, yhi, xlo, xhi):
    """Zero the entries of an im2col row whose pixel is padding: output rows outside
    ``[ylo, yhi)`` and columns outside ``[xlo, xhi)`` (nothing to do without padding)."""
    if ylo == 0 and yhi == oh and xlo == 0 and xhi == ow:
        return
    for n in range(nb):
        for y in range(oh):
            o = U((n * oh + y) * ow)
            if y < ylo or y >= yhi:
                for t in range(ow):
                    row[o + U(t)] = 0.0
            else:
                for t in range(xlo):
                    row[o + U(t)] = 0.0
                for t in range(xhi, ow):
                    row[o + U(t)] = 0.0


@kernel
def channels_to_batch_first(mat, bias, out):
    """``out[n, o, :] = mat[o, n, :] + bias[o]``: the (O, N, P) product back to (N, O, P)."""
    for o in range(mat.shape[0]):
        b = bias[o]
        for n in range(mat.shape[1]):
            src, dst = mat[o, n], out[n, o]
            for k in range(src.size):
                dst[k] = src[k] + b


@kernel
def batch_to_channels_first(dy, out, dbias):
    """``out[o, n, :] = dy[n, o, :]`` and ``dbias[o] = sum(dy[:, o, :])``: an output gradient in
    the product's (O, N, P) layout, with the bias gradient summed on the way."""
    for o in range(dy.shape[1]):
        total = 0.0
        for n in range(dy.shape[0]):
            src, dst = dy[n, o], out[o, n]
            for k in range(src.size):
                dst[k] = src[k]
            total += run_sum(src, 0, src.size)
        dbias[o] = total


# --------------------------------------------------------------------------------------------------
# optimizer steps on flat arrays of one float dtype, in place. Each performs NumPy's operations of
# ``kernels.cpu`` in the same order and the same dtype (the scalars rounded to it first, as NumPy
# does with a Python float), so the results are the same to the bit, in one pass over memory
# instead of four to twelve.


@kernel
def sgd_step(p, g, buf, lr, momentum, wd, nesterov, has_wd):
    """``d = g + wd p``; ``buf = buf momentum + d``; ``p -= lr (d + momentum buf | buf)``."""
    t = p.dtype.type
    lr_, m_, wd_ = t(lr), t(momentum), t(wd)
    for i in range(p.size):
        d = g[i] + wd_ * p[i] if has_wd else g[i]
        b = buf[i] * m_ + d
        buf[i] = b
        p[i] -= lr_ * (d + m_ * b if nesterov else b)


@kernel
def sgd_plain_step(p, g, lr, wd, has_wd):
    """``p -= lr (g + wd p)``."""
    t = p.dtype.type
    lr_, wd_ = t(lr), t(wd)
    for i in range(p.size):
        d = g[i] + wd_ * p[i] if has_wd else g[i]
        p[i] -= lr_ * d


@kernel
def adam_step(p, g, m, v, lr, b1, c1, b2, c2, bc1, bc2, eps, wd, l2, decoupled):
    """Adam's moments and update; ``c1 = 1 - b1``, ``bc1 = 1 - b1**t`` (likewise for b2) come
    from the caller, computed in Python as NumPy's caller computes them."""
    t = p.dtype.type
    lr_, b1_, c1_, b2_, c2_ = t(lr), t(b1), t(c1), t(b2), t(c2)
    bc1_, bc2_, eps_, wd_ = t(bc1), t(bc2), t(eps), t(wd)
    for i in range(p.size):
        d = g[i] + wd_ * p[i] if l2 else g[i]
        mi = m[i] * b1_ + c1_ * d
        vi = v[i] * b2_ + c2_ * (d * d)
        m[i] = mi
        v[i] = vi
        delta = (mi / bc1_) / (math.sqrt(vi / bc2_) + eps_)
        if decoupled:
            delta = delta + wd_ * p[i]
        p[i] -= lr_ * delta
