"""Fused kernels for the hot ops: one API over raw arrays, for NumPy and CuPy alike.

A training step spends most of its non-GEMM time in a handful of ops (GELU, softmax, layer norm,
the attention core, max pooling, the layout copies around a convolution's matrix product). Written
with NumPy ufuncs each of them is 5 to 30 passes over memory; here each is one or two. The ops in
``minigrad.functional`` call these functions from their ``forward``/``backward`` and stay
responsible for autodiff; the functions below only compute.

Every function takes backend arrays and picks the implementation from their type:

* NumPy arrays go to :mod:`~minigrad.backend.kernels.cpu`, numba loops
  (:mod:`~minigrad.backend.kernels.loops`) compiled on first use and cached on disk;
* CuPy arrays go to :mod:`~minigrad.backend.kernels.gpu`, CuPy ``ElementwiseKernel``,
  ``ReductionKernel`` and ``RawKernel`` code.

Both implement the same small set of functions on canonical shapes (rows of a 2-D array, NCHW
images); this module brings any input to that form (contiguous, the reduced axis last) and back,
so that the two backends never repeat that bookkeeping. Neither backend is imported before its
first call, which keeps ``import minigrad`` free of numba (and of CUDA).

Results equal the unfused NumPy compositions up to rounding: float64 uses the C library's
``exp``/``erfc``; float32 uses vectorised approximations a few ulp from the rounded value (see
``loops``) and float64 accumulators for sums.

Example::

    y, slope = kernels.gelu(x)           # forward, saving the derivative
    dx = kernels.gelu_grad(slope, dy)    # backward
"""

from __future__ import annotations

import functools
import importlib
import math

import numpy as np

from minigrad.backend.dtypes import is_floating
from minigrad.backend.xp import get_array_module

__all__ = [
    "adam_step",
    "adam_steps",
    "attention_softmax",
    "attention_softmax_grad",
    "col2im",
    "cross_entropy_rows",
    "cross_entropy_rows_grad",
    "from_product_layout",
    "gelu",
    "gelu_grad",
    "im2col",
    "layer_norm",
    "layer_norm_grad",
    "log_softmax",
    "log_softmax_grad",
    "max_pool2d",
    "max_pool2d_grad",
    "min_max",
    "register_kernels",
    "relu",
    "relu_grad",
    "sgd_step",
    "sgd_steps",
    "softmax",
    "softmax_grad",
    "squared_error_grad",
    "squared_error_sum",
    "to_product_layout",
    "unregister_kernels",
    "unscale_grads",
]

_BACKENDS: dict = {}
_REGISTERED: dict[type, object] = {}  # array type -> the kernels registered for it


def register_kernels(array_type: type, implementation) -> None:
    """Run the kernels on arrays of ``array_type`` (or a subclass) with ``implementation``: an
    object holding the functions of :mod:`~minigrad.backend.kernels.cpu` under the same names and
    signatures (a module, or any object with those attributes). For array libraries other than
    NumPy and CuPy - a test double of CuPy, for one - which then need no patching of this module.
    Registering a type again replaces its kernels; :func:`unregister_kernels` removes them.

    Example::

        register_kernels(MyArray, my_kernels)   # kernels.gelu(my_array) -> my_kernels.gelu(...)
    """
    if not isinstance(array_type, type):
        raise TypeError(f"register_kernels: array_type must be a type, got "
                        f"{type(array_type).__name__}")
    _REGISTERED[array_type] = implementation


def unregister_kernels(array_type: type) -> None:
    """Forget the kernels :func:`register_kernels` registered for ``array_type`` (nothing if none
    were): its arrays go to the built-in CPU/GPU kernels again."""
    _REGISTERED.pop(array_type, None)


def backend_for(array):
    """The module implementing the kernels for ``array``'s device: the kernels registered for its
    type (:func:`register_kernels`) if any, else ``cpu`` for NumPy arrays and ``gpu`` otherwise
    (imported on first use)."""
    if _REGISTERED:
        for array_type, implementation in _REGISTERED.items():
            if isinstance(array, array_type):
                return implementation
    name = "cpu" if isinstance(array, np.ndarray) else "gpu"
    module = _BACKENDS.get(name)
    if module is None:
        module = _BACKENDS[name] = importlib.import_module(f"minigrad.backend.kernels.{name}")
    return module


def _is_half(a) -> bool:
    dtype = getattr(a, "dtype", None)
    return dtype is not None and dtype.itemsize == 2 and is_floating(dtype)


def _contiguous(a):
    return a if a.flags.c_contiguous else a.copy()


def _half_in_float32(fn):
    """Run ``fn`` on float32 copies of its 2-byte float (float16, bfloat16) array arguments (the
    kernels compute in float32 or float64) and hand float32 array results back in that dtype."""

    @functools.wraps(fn)
    def wrapper(*args):
        half = next((a.dtype for a in args if _is_half(a)), None)
        if half is None:
            return fn(*args)
        out = fn(*(a.astype("float32") if _is_half(a) else a for a in args))
        back = [r.astype(half) if getattr(r, "dtype", None) == "float32" else r
                for r in (out if isinstance(out, tuple) else (out,))]
        return tuple(back) if isinstance(out, tuple) else back[0]

    return wrapper


# --------------------------------------------------------------------------------------------------
# ReLU


def relu(x):
    """``(y, mask)``: ``mask = x > 0``, ``y = x`` there and where ``x`` is NaN, else ``+0.0``
    (``-inf`` gives 0). One pass where ``x * (x > 0)`` took two (and gave NaN for ``-inf``)."""
    return backend_for(x).relu(_contiguous(x))


def relu_grad(dy, mask):
    """``dy`` where ``mask`` (from :func:`relu`), else 0, also where ``dy`` is not finite (as
    PyTorch's ``threshold_backward``)."""
    return backend_for(dy).relu_grad(_contiguous(dy), mask)


# --------------------------------------------------------------------------------------------------
# GELU


@_half_in_float32
def gelu(x):
    """Exact GELU ``x * Phi(x)``; returns ``(y, slope)`` with its derivative
    ``slope = Phi(x) + x * pdf(x)`` for :func:`gelu_grad`. The forward evaluates ``Phi`` and
    ``pdf`` from one shared ``exp`` anyway, so saving the derivative makes the backward a
    multiply: it neither reads ``x`` again nor computes a second ``exp``."""
    return backend_for(x).gelu(_contiguous(x))


@_half_in_float32
def gelu_grad(slope, dy):
    """``dy * slope``, the gradient of :func:`gelu` (``slope`` from its forward)."""
    return backend_for(dy).gelu_grad(slope, _contiguous(dy))


# --------------------------------------------------------------------------------------------------
# softmax family along one axis


def _as_rows(a, axis: int):
    """``a`` with ``axis`` moved last, as a contiguous (rows, n) array."""
    moved = a if axis in (-1, a.ndim - 1) else a.swapaxes(axis, -1)
    return _contiguous(moved).reshape(math.prod(moved.shape[:-1]), a.shape[axis])


def _from_rows(rows, like, axis: int):
    moved_shape = list(like.shape)
    moved_shape[axis], moved_shape[-1] = moved_shape[-1], moved_shape[axis]
    out = rows.reshape(moved_shape)
    return out if axis in (-1, like.ndim - 1) else out.swapaxes(axis, -1)


def _row_op(name: str, axis: int, *arrays):
    if arrays[0].size == 0:  # no rows, or rows of length 0 (whose max CuPy refuses): nothing to do
        return get_array_module(arrays[0]).empty_like(arrays[0])
    rows = [_as_rows(a, axis) for a in arrays]
    return _from_rows(getattr(backend_for(arrays[0]), name)(*rows), arrays[0], axis)


@_half_in_float32
def softmax(x, axis: int):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""
    return _row_op("softmax", axis, x)


@_half_in_float32
def softmax_grad(y, dy, axis: int):
    """``y * (dy - sum(dy * y))`` along ``axis``: :func:`softmax`'s gradient, given its output."""
    return _row_op("softmax_grad", axis, y, dy)


@_half_in_float32
def log_softmax(x, axis: int):
    """``x - max - log(sum(exp(x - max)))`` along ``axis``."""
    return _row_op("log_softmax", axis, x)


@_half_in_float32
def log_softmax_grad(y, dy, axis: int):
    """``dy - exp(y) * sum(dy)`` along ``axis``: the gradient of :func:`log_softmax` given its
    output."""
    return _row_op("log_softmax_grad", axis, y, dy)


# --------------------------------------------------------------------------------------------------
# attention weights


def _groups(shape) -> int:
    """The number of (L, S) matrices in an array of shape (..., L, S)."""
    return math.prod(shape[:-2])


@_half_in_float32
def attention_softmax(scores, scale: float, bias=None, causal: bool = False):
    """``softmax(scale * scores + bias)`` over the last axis of the contiguous ``scores``
    (..., L, S), computed in place and returned (use the result: float16 works on a copy).
    ``bias`` is an additive mask that broadcasts to ``scores`` (``-inf`` drops a key); ``causal``
    lets query ``i`` see keys ``j <= i`` only (top-left aligned) without materialising a mask:
    the others get weight 0."""
    length, src = scores.shape[-2:]
    if bias is not None:
        xp = get_array_module(bias)
        if _groups(bias.shape) == 1:  # one mask for every batch and head
            bias = bias.reshape(bias.shape[-2:]) if bias.ndim > 2 else bias
            shape = (length, src)
        else:
            shape = scores.shape
        bias = xp.ascontiguousarray(xp.broadcast_to(bias.astype(scores.dtype, copy=False), shape))
        bias = bias.reshape(_groups(shape), length, src)
    s3 = scores.reshape(_groups(scores.shape), length, src)
    backend_for(scores).attention_softmax(s3, float(scale), bias, bool(causal))
    return scores


@_half_in_float32
def attention_softmax_grad(w, dw, scale: float):
    """``scale * w * (dw - rowsum(dw * w))`` in place on ``dw`` (returned): the gradient of the raw
    scores of :func:`attention_softmax` given its output ``w`` and the gradient ``dw`` of ``w``."""
    length, src = w.shape[-2:]
    g = _groups(w.shape)
    backend_for(w).attention_softmax_grad(w.reshape(g, length, src), dw.reshape(g, length, src),
                                          float(scale))
    return dw


# --------------------------------------------------------------------------------------------------
# layer norm


@_half_in_float32
def layer_norm(x, weight, bias, eps: float, n: int):
    """Normalise ``x`` over groups of its ``n`` trailing elements, then ``* weight + bias`` (both of
    size ``n``, or None). Returns ``(y, xhat, rstd)``: the output, the normalised input and
    ``1 / sqrt(var + eps)`` per group (biased variance); the last two are for
    :func:`layer_norm_grad`."""
    rows = _contiguous(x).reshape(x.size // n if n else 0, n)
    y, xhat, rstd = backend_for(x).layer_norm(rows, weight, bias, float(eps))
    return y.reshape(x.shape), xhat, rstd


@_half_in_float32
def layer_norm_grad(dy, xhat, rstd, weight):
    """Gradients ``(dx, dweight, dbias)`` of :func:`layer_norm` (``dweight``/``dbias`` flat, of
    size ``n``; computed whether or not the op had them)."""
    rows = _contiguous(dy).reshape(xhat.shape)
    dx, dw, db = backend_for(dy).layer_norm_grad(rows, xhat, rstd, weight)
    return dx.reshape(dy.shape), dw, db


def column_sums(a):
    """The sums of the columns of the 2-D array ``a`` (a linear layer's bias gradient): on the CPU
    the product ``ones @ a`` for float32 and float64 (BLAS, on its threads), else NumPy's
    ``a.sum(axis=0)``; on a GPU one small kernel, whose cost on the host is a fraction of a CuPy
    reduction's (43 us a call on an H200's host, for a step of a few ms)."""
    return backend_for(a).column_sums(a)


# --------------------------------------------------------------------------------------------------
# pooling and convolution layout


@_half_in_float32
def max_pool2d(x, kernel: tuple, stride: tuple, padding: tuple, out_hw: tuple):
    """Max pooling of an NCHW array (padding never wins). Returns ``(out, argmax)``; ``argmax``
    holds the flat ``h * W + w`` index of each window's first maximum, for
    :func:`max_pool2d_grad`."""
    return backend_for(x).max_pool2d(_contiguous(x), kernel, stride, padding, out_hw)


@_half_in_float32
def max_pool2d_grad(dy, argmax, x_shape: tuple, kernel: tuple, stride: tuple, padding: tuple):
    """Scatter ``dy`` onto the input pixels that won their windows (adding where windows overlap,
    in the order of the outputs); the geometry is :func:`max_pool2d`'s."""
    return backend_for(dy).max_pool2d_grad(_contiguous(dy), argmax, tuple(x_shape), kernel,
                                           stride, padding)


@_half_in_float32
def im2col(x, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, out_hw: tuple):
    """Receptive fields of an NCHW array as a ``(C*kh*kw, N*OH*OW)`` matrix: row ``(c, i, j)``,
    column ``(n, y, x)`` holds ``x[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw]`` (0 in the
    padding)."""
    return backend_for(x).im2col(_contiguous(x), kernel, stride, padding, dilation, out_hw)


@_half_in_float32
def col2im(cols, x_shape: tuple, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple,
           out_hw: tuple):
    """The adjoint of :func:`im2col`: add every entry of ``cols`` onto the NCHW pixel it came from
    (entries in the padding are dropped)."""
    return backend_for(cols).col2im(_contiguous(cols), tuple(x_shape), kernel, stride, padding,
                                    dilation, out_hw)


@_half_in_float32
def from_product_layout(mat, n: int, bias=None):
    """A convolution's product ``(O, N*P)`` as the contiguous batch-first ``(N, O, P)`` array, plus
    ``bias[o]`` when given: the channels-first copy and the bias add in one pass."""
    o = mat.shape[0]
    return backend_for(mat).from_product_layout(_contiguous(mat).reshape(o, n, -1), bias)


@_half_in_float32
def to_product_layout(dy):
    """``dy`` (N, O, ...) as the ``(O, N*P)`` matrix a convolution's backward multiplies, and the
    bias gradient ``dy.sum over every axis but 1`` computed on the way. Returns ``(mat, dbias)``."""
    n, o = dy.shape[:2]
    mat, dbias = backend_for(dy).to_product_layout(_contiguous(dy).reshape(n, o, -1))
    return mat.reshape(o, -1), dbias


# --------------------------------------------------------------------------------------------------
# the range of an index array


def min_max(a):
    """The smallest and largest value of the non-empty integer array ``a``, as two 0-d int64
    arrays where ``a`` lives: computed without reading them back (on a GPU in one kernel), for
    :mod:`minigrad.backend.device_checks`."""
    return backend_for(a).min_max(a)


# --------------------------------------------------------------------------------------------------
# cross entropy of rows of logits


def cross_entropy_rows(x, label):
    """Cross entropy of each row of the logits ``x`` (N, C) against its integer ``label`` (N,),
    labels in [0, C) (the caller checks them). Returns ``(nll, prob)``: ``nll = log(sum(exp(x -
    max))) - (x[label] - max)`` per row and ``prob`` the rows' softmax, which is what the gradient
    needs. On a GPU both come from one kernel where the composition launches about ten."""
    return backend_for(x).cross_entropy_rows(_contiguous(x), _contiguous(label))


def cross_entropy_rows_grad(prob, label, dy, divisor):
    """``(prob - one_hot(label)) * dy / divisor`` in place on ``prob`` (returned): the gradient of
    :func:`cross_entropy_rows`'s ``nll`` (``prob`` is its output) for an upstream gradient ``dy``
    of shape (N,) (per-row losses; ``divisor`` 1) or 0-d (their sum: 1, or mean: N)."""
    return backend_for(prob).cross_entropy_rows_grad(prob, _contiguous(label), dy, divisor)


# --------------------------------------------------------------------------------------------------
# squared error


def squared_error_sum(pred, label, scale):
    """``(total, diff)``: ``sum((pred - label)**2)`` over every element (times ``scale`` unless
    it is None) and what :func:`squared_error_grad` needs of the forward: the difference, or None
    where the backward recomputes it (on a GPU, where the sum is one kernel instead of four)."""
    return backend_for(pred).squared_error_sum(pred, label, scale)


def squared_error_grad(pred, label, diff, dy, scale):
    """``u + u`` with ``u = (dy * scale) * (pred - label)`` (``diff`` from
    :func:`squared_error_sum` if not None; ``scale`` None is 1; ``dy`` a 0-d array): the gradient
    of the total for ``pred`` (the label's is its negation)."""
    return backend_for(pred).squared_error_grad(pred, label, diff, dy, scale)


# --------------------------------------------------------------------------------------------------
# optimizer steps: one pass over a parameter, in place


def sgd_step(p, g, buf, lr: float, momentum: float, weight_decay: float, nesterov: bool) -> None:
    """SGD's update of ``p`` in place (the rule is :class:`minigrad.optimizer.SGD`'s)::

        d = g + weight_decay * p ;  buf = momentum * buf + d   (buf None: no momentum)
        p -= lr * (d + momentum * buf if nesterov else buf)

    Written as NumPy ufuncs this is four to six passes, and on a GPU four to six kernel launches
    per parameter, which dominate a small model's step; here it is one. A new momentum buffer
    starts at zeros, which makes its first step ``buf = d`` exactly."""
    backend_for(p).sgd_step(p, g, buf, float(lr), float(momentum), float(weight_decay),
                            bool(nesterov))


def adam_step(p, g, m, v, lr: float, betas: tuple, eps: float, weight_decay: float,
              decoupled: bool, step: int) -> None:
    """Adam's update of ``p`` and its moments ``m``, ``v`` in place, at step ``step`` (from 1)::

        d = g + weight_decay * p   (not decoupled)
        m = b1 m + (1 - b1) d ;  v = b2 v + (1 - b2) d^2
        p -= lr * ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) [+ weight_decay * p decoupled])

    One pass (one kernel on a GPU) instead of about twelve."""
    b1, b2 = betas
    backend_for(p).adam_step(p, g, m, v, float(lr), float(b1), float(b2), float(eps),
                             float(weight_decay), bool(decoupled), int(step))


def sgd_steps(params: list, grads: list, bufs: list, lr: float, momentum: float,
              weight_decay: float, nesterov: bool) -> None:
    """:func:`sgd_step` of every parameter of a list, with the same results: ``bufs`` holds each
    parameter's momentum buffer (all None without momentum). On a GPU the parameters of one float
    dtype are updated by one kernel launch per :data:`~minigrad.backend.kernels.gpu.LIST_SLOTS`
    parameters, where one launch each made a small model's optimizer step a dozen launches."""
    if params:
        backend_for(params[0]).sgd_steps(params, grads, bufs, float(lr), float(momentum),
                                         float(weight_decay), bool(nesterov))


def adam_steps(params: list, grads: list, ms: list, vs: list, lr: float, betas: tuple,
               eps: float, weight_decay: float, decoupled: bool, steps: list) -> None:
    """:func:`adam_step` of every parameter of a list (``steps``: each one's step count), with
    the same results; on a GPU in one launch per
    :data:`~minigrad.backend.kernels.gpu.LIST_SLOTS` parameters of one float dtype."""
    if params:
        b1, b2 = betas
        backend_for(params[0]).adam_steps(params, grads, ms, vs, float(lr), float(b1), float(b2),
                                          float(eps), float(weight_decay), bool(decoupled),
                                          [int(t) for t in steps])


def unscale_grads(grads: list, factor: float) -> tuple[list, object]:
    """A loss scaler's unscale and overflow check of gradients on one device: new arrays
    ``g * factor`` (2-byte floats computed in float32) and an int32 array on that device, 1 where
    a gradient held an inf or NaN, not read here. The caller reads it once for all gradients
    (one wait for the GPU per step, where a check per gradient waited once per gradient); on a
    GPU one launch per :data:`~minigrad.backend.kernels.gpu.LIST_SLOTS` float32/float64
    gradients does both, where the composition is four launches per gradient."""
    if not grads:
        return [], np.zeros(0, np.int32)
    return backend_for(grads[0]).unscale_grads(list(grads), float(factor))
