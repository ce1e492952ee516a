"""Neural-network ops (``F.nn``, also re-exported as ``F.<name>``), MegEngine names and signatures.

This module holds the layers' functional forms: ``linear``, activations, softmax, dropout, embedding
and one_hot. Activations are compositions of elementwise primitives and get gradients for free;
softmax and logsoftmax own a (Tensor-op, hence twice differentiable) backward because they sit on
every training step's hot path. The other families live in their own modules and are re-exported
at the bottom: convolution and pooling (``conv``), normalisation (``normalization``), losses and
metrics (``loss``) and attention (``attention``).
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.backend import kernels
from minigrad.functional._util import recording_backward
from minigrad.functional.elementwise import (
    _f,
    clip,
    erf,
    exp,
    log1p,
    relu,
    sigmoid,
    where,
)
from minigrad.functional.elementwise import abs as _abs
from minigrad.functional.linalg import matmul
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import getitem, reshape
from minigrad.tensor import Tensor


class Linear(Function):
    """``x @ w.T + b`` for a 2-D ``x``: the hottest op of most models, so it is one node with the
    bias added in place, and its backward skips the products nobody needs (e.g. the input gradient
    of the first layer). The backward uses Tensor ops, so it is itself differentiable."""

    def forward(self, x, w, b):
        self.x, self.w, self.has_bias = x, w, b is not None
        out = x.xp.matmul(x._data, w._data.T)
        if b is not None:
            out += b._data
        return out

    def backward(self, dy):
        need_x, need_w = self.needs_input_grad(0), self.needs_input_grad(1)
        need_b = self.has_bias and self.needs_input_grad(2)
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            dx = matmul(dy, self.w) if need_x else None
            dw = matmul(dy, self.x, transpose_a=True) if need_w else None
            return dx, dw, _sum(dy, 0) if need_b else None
        g = dy._data
        dx = g @ self.w._data if need_x else None
        dw = g.T @ self.x._data if need_w else None
        return dx, dw, g.sum(axis=0) if need_b else None


def linear(inp, weight, bias=None) -> Tensor:
    """``inp @ weight.T + bias`` with ``weight`` stored (out_features, in_features) as MegEngine;
    ``inp`` is (..., in_features), leading axes are flattened into one big matrix product."""
    inp, weight = _f(inp), _f(weight)
    if weight.ndim != 2 or inp.ndim == 0 or inp.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear: input has {inp.shape[-1] if inp.ndim else 0} features (shape {inp.shape}) "
            f"but weight {weight.shape} expects {weight.shape[-1]} (weight is (out, in))"
        )
    if bias is not None and not isinstance(bias, Tensor):
        bias = Tensor(bias, dtype=weight.dtype, device=weight._device)
    lead = inp.shape[:-1]
    if inp.ndim == 1:
        inp = reshape(inp, (1, -1))
    elif inp.ndim > 2:
        inp = reshape(inp, (-1, inp.shape[-1]))
    fused = bias is None or (
        bias.shape == (weight.shape[0],) and bias.dtype == weight.dtype == inp.dtype
    )
    out = Linear()(inp, weight, bias if fused else None)
    if not fused:
        out = out + bias
    return reshape(out, lead + (weight.shape[0],)) if len(lead) != 1 else out


# --------------------------------------------------------------------------------------------------
# activations (compositions)


def leaky_relu(inp, negative_slope: float = 0.01) -> Tensor:
    """``x`` for ``x > 0``, else ``negative_slope * x``."""
    inp = _f(inp)
    return where(inp > 0, inp, inp * negative_slope)


def relu6(inp) -> Tensor:
    """``min(max(x, 0), 6)``."""
    return clip(_f(inp), 0.0, 6.0)


_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class Gelu(Function):
    """``x * Phi(x)``; one fused kernel each way instead of a dozen composed ops (it sits in every
    Transformer MLP). Twice differentiable: backward uses Tensor ops when it is being recorded."""

    def forward(self, x):
        y, self.cdf = kernels.gelu(x._data)
        self.x = x
        return y

    def backward(self, dy):
        x = self.x
        if recording_backward():
            cdf = erf(x * _INV_SQRT2) * 0.5 + 0.5
            return dy * (cdf + x * exp(x * x * -0.5) * _INV_SQRT_2PI)
        return kernels.gelu_grad(x._data, self.cdf, dy._data)


def gelu(inp) -> Tensor:
    """Exact GELU, ``x * Phi(x)`` with the normal CDF of ``erf`` (not the tanh approximation)."""
    return Gelu()(_f(inp))


def silu(inp) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish)."""
    inp = _f(inp)
    return inp * sigmoid(inp)


def softplus(inp) -> Tensor:
    """``log(1 + exp(x))`` computed as ``relu(x) + log1p(exp(-|x|))`` so it never overflows."""
    inp = _f(inp)
    return relu(inp) + log1p(exp(-_abs(inp)))


def hsigmoid(inp) -> Tensor:
    """Hard sigmoid ``relu6(x + 3) / 6``."""
    return relu6(_f(inp) + 3.0) * (1.0 / 6.0)


def hswish(inp) -> Tensor:
    """Hard swish ``x * relu6(x + 3) / 6``."""
    inp = _f(inp)
    return inp * hsigmoid(inp)


# --------------------------------------------------------------------------------------------------
# softmax family (primitives: a fused kernel each way, Tensor ops when backward is recorded)


def _axis(inp: Tensor, axis, op: str) -> int:
    if inp.ndim == 0:
        raise ValueError(f"{op}: expected a tensor of rank >= 1, got a scalar")
    axis = inp.ndim - 1 if axis is None else int(axis)
    if not -inp.ndim <= axis < inp.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for shape {inp.shape}")
    return axis % inp.ndim


class Softmax(Function):
    def forward(self, x, axis):
        self.x, self.axis = x, axis
        self.y = kernels.softmax(x._data, axis)
        return self.y

    def backward(self, dy):
        if recording_backward():  # recompute the output as a recorded function of x
            y = softmax(self.x, self.axis)
            return y * (dy - _sum(dy * y, self.axis, keepdims=True)), None
        return kernels.softmax_grad(self.y, dy._data, self.axis), None


class LogSoftmax(Function):
    def forward(self, x, axis):
        self.x, self.axis = x, axis
        self.y = kernels.log_softmax(x._data, axis)
        return self.y

    def backward(self, dy):
        if recording_backward():
            y = logsoftmax(self.x, self.axis)
            return dy - exp(y) * _sum(dy, self.axis, keepdims=True), None
        return kernels.log_softmax_grad(self.y, dy._data, self.axis), None


def softmax(inp, axis: int | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: the last), shifted by the max for
    stability."""
    inp = _f(inp)
    return Softmax()(inp, _axis(inp, axis, "softmax"))


def logsoftmax(inp, axis: int | None = None) -> Tensor:
    """``x - logsumexp(x)`` along ``axis`` (default: the last); stable for large logits."""
    inp = _f(inp)
    return LogSoftmax()(inp, _axis(inp, axis, "logsoftmax"))


log_softmax = logsoftmax


# --------------------------------------------------------------------------------------------------
# dropout, embedding, one_hot


def dropout(inp, drop_prob: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability ``drop_prob`` and scale the survivors
    by ``1 / (1 - drop_prob)``, so evaluation (``training=False``) is the identity. Draws from
    ``mg.random.get_rng`` and is therefore reproducible under ``mg.random.seed``."""
    from minigrad.random import get_rng  # noqa: PLC0415  (minigrad.random imports tensor)

    inp = _f(inp)
    if not 0.0 <= drop_prob <= 1.0:
        raise ValueError(f"dropout: drop_prob must be in [0, 1], got {drop_prob}")
    if not training or drop_prob == 0.0:
        return inp
    xp = inp.xp
    if drop_prob == 1.0:
        return inp * 0.0
    keep = get_rng(inp._device).random(inp.shape, dtype=np.float32) >= drop_prob
    mask = xp.asarray(keep, dtype=inp.dtype) * inp.dtype.type(1.0 / (1.0 - drop_prob))
    return inp * Tensor._wrap(mask, inp._device)


def _int_index(op: str, idx, device) -> Tensor:
    idx = idx if isinstance(idx, Tensor) else Tensor(np.asarray(idx), device=device)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be an integer tensor, got dtype {idx.dtype}")
    return idx


def embedding(inp, weight, padding_idx: int | None = None, max_norm=None,
              norm_type=None) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer tensor ``inp``: output shape
    ``inp.shape + (dim,)``. Entries equal to ``padding_idx`` get ``weight[padding_idx]`` but send no
    gradient to it. ``max_norm`` renormalisation is not supported."""
    if max_norm is not None:
        raise NotImplementedError("embedding: max_norm is not supported")
    weight = _f(weight)
    idx = _int_index("embedding", inp, weight._device)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num, dim), got shape {weight.shape}")
    n = weight.shape[0]
    if idx.size and (int(idx._data.min()) < 0 or int(idx._data.max()) >= n):
        raise IndexError(
            f"embedding: indices must be in [0, {n}), got min {int(idx._data.min())} "
            f"max {int(idx._data.max())}"
        )
    out = getitem(weight, idx)
    if padding_idx is not None:
        pad_row = Tensor._wrap(weight._data[padding_idx], weight._device)
        mask = Tensor._wrap((idx._data == padding_idx)[..., None], weight._device)
        out = where(mask, pad_row, out)
    return out


def one_hot(inp, num_classes: int) -> Tensor:
    """``int32`` one-hot encoding of an integer tensor: shape ``inp.shape + (num_classes,)``."""
    idx = _int_index("one_hot", inp, None)
    if idx.size and (int(idx._data.min()) < 0 or int(idx._data.max()) >= num_classes):
        raise ValueError(
            f"one_hot: values must be in [0, {num_classes}), got min {int(idx._data.min())} "
            f"max {int(idx._data.max())}"
        )
    xp = idx.xp
    out = (idx._data[..., None] == xp.arange(num_classes)).astype(np.int32)
    return Tensor._wrap(out, idx._device)


# the other families, re-exported so that F.nn.<name> and F.<name> both work
from minigrad.functional.attention import (  # noqa: E402
    multi_head_attention,
    scaled_dot_product_attention,
)
from minigrad.functional.conv import (  # noqa: E402
    adaptive_avg_pool2d,
    avg_pool2d,
    conv1d,
    conv2d,
    conv_transpose2d,
    max_pool2d,
)
from minigrad.functional.loss import (  # noqa: E402
    binary_cross_entropy,
    cross_entropy,
    l1_loss,
    mse_loss,
    square_loss,
    topk_accuracy,
)
from minigrad.functional.normalization import batch_norm, group_norm, layer_norm  # noqa: E402

__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "cross_entropy",
    "dropout",
    "embedding",
    "gelu",
    "group_norm",
    "hsigmoid",
    "hswish",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log_softmax",
    "logsoftmax",
    "max_pool2d",
    "mse_loss",
    "multi_head_attention",
    "one_hot",
    "relu",
    "relu6",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
    "square_loss",
    "topk_accuracy",
]
