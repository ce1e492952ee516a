"""Neural-network ops (``F.nn``, also re-exported as ``F.<name>``), MegEngine names and signatures.

This module holds the activations and ``embedding``, and gathers the other families under the
``F.nn`` name MegEngine code uses: ``linear`` (``linalg``), the softmax family
(``softmax_family``), ``dropout`` (``stochastic``), ``one_hot`` (``shape``), convolution and
pooling (``conv``), normalisation (``normalization``), losses and metrics (``loss``) and attention
(``attention``). Those modules never import this one, so the imports only go one way.
Activations are compositions of elementwise primitives and get gradients for free, except GELU,
one fused node because it sits in every Transformer MLP.
"""

from __future__ import annotations

import math

from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import kernels
from minigrad.backend.device_checks import check_range
from minigrad.functional._util import recording_backward
from minigrad.functional.attention import (
    attention_bias,
    multi_head_attention,
    scaled_dot_product_attention,
)
from minigrad.functional.conv import (
    adaptive_avg_pool2d,
    avg_pool2d,
    conv1d,
    conv2d,
    conv_transpose2d,
    max_pool2d,
)
from minigrad.functional.elementwise import (
    _f,
    clip,
    erf,
    exp,
    log1p,
    logsigmoid,
    relu,
    sigmoid,
    where,
)
from minigrad.functional.elementwise import abs as _abs
from minigrad.functional.linalg import linear
from minigrad.functional.loss import (
    binary_cross_entropy,
    cross_entropy,
    ctc_loss,
    hinge_loss,
    l1_loss,
    mse_loss,
    square_loss,
    topk_accuracy,
)
from minigrad.functional.normalization import batch_norm, group_norm, instance_norm, layer_norm
from minigrad.functional.shape import _int_index, getitem, one_hot, pad, pixel_shuffle
from minigrad.functional.sliding_window import (
    conv3d,
    conv_transpose3d,
    local_conv2d,
    region_restricted_conv,
    sliding_window,
    sliding_window_transpose,
)
from minigrad.functional.softmax_family import log_softmax, logsoftmax, softmax
from minigrad.functional.stochastic import dropout
from minigrad.functional.vision import (
    deformable_psroi_pooling,
    remap,
    warp_affine,
    warp_perspective,
)

# --------------------------------------------------------------------------------------------------
# activations (compositions)


def leaky_relu(inp, negative_slope: float = 0.01) -> Tensor:
    """``x`` for ``x > 0``, else ``negative_slope * x`` (a small gradient where relu has none)."""
    inp = _f(inp)
    return where(inp > 0, inp, inp * negative_slope)


def prelu(inp, weight) -> Tensor:
    """``x`` for ``x > 0``, else ``weight * x``: leaky_relu with a learned slope. ``weight`` is one
    slope of shape ``(1,)`` or one per channel, ``(1, C, 1, 1)`` for NCHW input (MegEngine's
    layout); it broadcasts against ``inp`` and gets the summed gradient."""
    inp = _f(inp)
    return where(inp > 0, inp, inp * weight)


def relu6(x) -> Tensor:
    """``min(max(x, 0), 6)`` (MobileNet's bounded relu)."""
    return clip(_f(x), 0.0, 6.0)


_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class Gelu(Function):
    """``x * Phi(x)``; one fused kernel each way instead of a dozen composed ops (it sits in every
    Transformer MLP). Twice differentiable: backward uses Tensor ops when it is being recorded."""

    def forward(self, x):
        y, self.slope = kernels.gelu(x._data)
        self.x = x
        return y

    def backward(self, dy):
        x = self.x
        if recording_backward():
            cdf = erf(x * _INV_SQRT2) * 0.5 + 0.5
            return dy * (cdf + x * exp(x * x * -0.5) * _INV_SQRT_2PI)
        return kernels.gelu_grad(self.slope, dy._data)


def gelu(x) -> Tensor:
    """Exact GELU, ``x * Phi(x)`` with the normal CDF of ``erf`` (not the tanh approximation).

    Example::

        h = F.gelu(F.linear(x, w1, b1))   # a Transformer MLP's activation
    """
    return Gelu()(_f(x))


def silu(x) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish)."""
    x = _f(x)
    return x * sigmoid(x)


def softplus(inp) -> Tensor:
    """``log(1 + exp(x))`` computed as ``relu(x) + log1p(exp(-|x|))`` so it never overflows."""
    inp = _f(inp)
    return relu(inp) + log1p(exp(-_abs(inp)))


def hsigmoid(x) -> Tensor:
    """Hard sigmoid ``relu6(x + 3) / 6`` (a piecewise-linear sigmoid)."""
    return relu6(_f(x) + 3.0) * (1.0 / 6.0)


def hswish(x) -> Tensor:
    """Hard swish ``x * relu6(x + 3) / 6``."""
    x = _f(x)
    return x * hsigmoid(x)


# --------------------------------------------------------------------------------------------------
# embedding


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
    check_range(idx._data, 0, n, lambda lo, hi: IndexError(
        f"embedding: indices must be in [0, {n}), got min {lo} max {hi}"))
    out = getitem(weight, idx)
    if padding_idx is not None:
        pad_row = Tensor._wrap(weight._data[padding_idx], weight._device)
        with idx._device.context():
            mask = Tensor._wrap((idx._data == padding_idx)[..., None], weight._device)
        out = where(mask, pad_row, out)
    return out


__all__ = [
    "adaptive_avg_pool2d",
    "attention_bias",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose2d",
    "conv_transpose3d",
    "cross_entropy",
    "ctc_loss",
    "deformable_psroi_pooling",
    "dropout",
    "embedding",
    "gelu",
    "group_norm",
    "hinge_loss",
    "hsigmoid",
    "hswish",
    "instance_norm",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "local_conv2d",
    "log_softmax",
    "logsigmoid",
    "logsoftmax",
    "max_pool2d",
    "mse_loss",
    "multi_head_attention",
    "one_hot",
    "pad",
    "pixel_shuffle",
    "region_restricted_conv",
    "relu",
    "prelu",
    "relu6",
    "remap",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "sliding_window",
    "sliding_window_transpose",
    "softmax",
    "softplus",
    "square_loss",
    "topk_accuracy",
    "warp_affine",
    "warp_perspective",
]
