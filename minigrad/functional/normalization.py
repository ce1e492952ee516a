"""Normalisation layers' functional forms: batch_norm, layer_norm and group_norm.

All three are ``Normalize(x) * weight + bias`` over different axes, where ``Normalize`` (the
standardisation ``(x - mean) / sqrt(var + eps)``) is one primitive with a closed-form backward
because it sits on every step of most models; the affine part is a composition, except in
layer_norm, whose ``LayerNorm`` primitive fuses both (one kernel each way). The variance used to
normalise is the biased (population) one, as in MegEngine and PyTorch.
"""

from __future__ import annotations

import numbers

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import kernels
from minigrad.backend.xp import get_array_module, on_device_of
from minigrad.functional._util import autocast_high, data, recording_backward
from minigrad.functional.elementwise import _f, sqrt
from minigrad.functional.reduction import mean
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import reshape

__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm", "running_stats_update"]


class Normalize(Function):
    """``xhat = (x - mean) / sqrt(var + eps)`` over ``axes``: one fused pass forward and the
    closed-form backward ``rstd * (g - mean(g) - xhat * mean(g * xhat))``, instead of ~25 composed
    ops. The backward is written with Tensor ops, so it is itself differentiable."""

    def forward(self, x, axes, eps):
        xp, d = x.xp, x._data
        mu = d.mean(axis=axes, keepdims=True)
        xc = d - mu
        var = xp.mean(xc * xc, axis=axes, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + eps)
        xc *= rstd
        self.x, self.axes, self.eps = x, axes, eps
        self.xhat, self.rstd, self.mu, self.var = xc, rstd, mu, var
        return xc

    def backward(self, g):
        if recording_backward():
            xhat, rstd = _recorded_standardize(self.x, self.axes, self.eps)
        else:
            xhat = Tensor._wrap(self.xhat, g._device)
            rstd = Tensor._wrap(self.rstd, g._device)
        return _standardize_grad(g, xhat, rstd, self.axes), None, None


class LayerNorm(Function):
    """``Normalize(x) * weight + bias`` over the trailing ``axes``: one fused kernel forward (the
    statistics, the normalisation and the affine part in a pass per row) and one backward giving
    all three gradients, where the composition costs about ten ops each way. ``weight`` and
    ``bias`` are Tensors of the input's dtype, or None. Backward uses Tensor ops when recorded."""

    def forward(self, x, weight, bias, axes, eps):
        size = 1
        for a in axes:
            size *= x.shape[a]
        y, self.xhat, self.rstd = kernels.layer_norm(x._data, data(weight), data(bias), eps, size)
        self.x, self.weight, self.has_bias = x, weight, bias is not None
        self.axes, self.eps = axes, eps
        return y

    def backward(self, dy):
        x, w, axes = self.x, self.weight, self.axes
        lead = tuple(range(x.ndim - len(axes)))
        shape = x.shape[x.ndim - len(axes):]
        if recording_backward():  # recompute the statistics as recorded functions of x
            xhat, rstd = _recorded_standardize(x, axes, self.eps)
            dx = _standardize_grad(dy if w is None else dy * w, xhat, rstd, axes)
            dw = _sum(dy * xhat, lead) if w is not None else None
            return dx, dw, _sum(dy, lead) if self.has_bias else None, None, None
        dx, dw, db = kernels.layer_norm_grad(dy._data, self.xhat, self.rstd, data(w))
        return (dx, dw.reshape(shape) if w is not None else None,
                db.reshape(shape) if self.has_bias else None, None, None)


def _recorded_standardize(x: Tensor, axes: tuple, eps: float):
    """``(xhat, rstd)`` of ``x`` over ``axes`` as recorded Tensor ops (for second-order
    gradients)."""
    centered = x - mean(x, axes, keepdims=True)
    rstd = 1.0 / sqrt(mean(centered * centered, axes, keepdims=True) + eps)
    return centered * rstd, rstd


def _standardize_grad(g: Tensor, xhat: Tensor, rstd: Tensor, axes: tuple) -> Tensor:
    """The gradient of ``xhat = (x - mean) * rstd`` given ``g = d loss / d xhat``."""
    gx = g - mean(g, axes, keepdims=True) - xhat * mean(g * xhat, axes, keepdims=True)
    return gx * rstd


def _normalize(x: Tensor, axes: tuple, eps: float):
    """``(x - mean) / sqrt(var + eps)`` over ``axes``; also the (constant) mean and biased var."""
    node = Normalize()
    out = node(x, axes, float(eps))
    return out, node.mu, node.var


def _float_input(op: str, inp, min_ndim: int = 0, layout: str = "(N, C, ...)") -> Tensor:
    """The input of a normalisation as a Tensor, in float32 under autocast (norms compute in
    float32, see minigrad.autodiff.autocast), checked to have at least ``min_ndim`` axes."""
    inp = _f(inp)
    if AUTOCAST.enabled:
        (inp,) = autocast_high(inp)
    if inp.ndim < min_ndim:
        raise ValueError(f"{op}: expected an input {layout}, got shape {inp.shape}")
    return inp


def _scale_shift(out: Tensor, weight, bias) -> Tensor:
    """``out * weight + bias``, leaving out whichever of the two is None (the affine part)."""
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


def _channel_param(op: str, name: str, p, c: int, ndim: int, like: Tensor):
    """A per-channel tensor given as (C,) or (1, C, 1, ...), reshaped to broadcast over NC..."""
    if p is None:
        return None
    p = p if isinstance(p, Tensor) else Tensor(p, device=like._device)
    if p.size != c or (p.ndim > 1 and p.shape[1] != c):
        raise ValueError(f"{op}: {name} has shape {p.shape}, expected {c} channels")
    return reshape(p, (1, c) + (1,) * (ndim - 2))


def running_stats_update(running_mean, running_var, batch_mean, batch_var, count,
                         momentum: float):
    """The running statistics after one training batch, MegEngine's rule (``momentum`` weights the
    old value): ``momentum * running + (1 - momentum) * batch``, folding in the *unbiased* batch
    variance ``batch_var * count / (count - 1)``. Backend arrays in, the new (mean, var) arrays out;
    the one place this rule is written (``batch_norm`` and ``SyncBatchNorm`` both use it). ``count``
    is an int, or a 0-d array of the batch arrays' device (read it without waiting for the GPU).

    Example::

        mean, var = running_stats_update(rm, rv, mu, var, count=n * h * w, momentum=0.9)
    """
    with on_device_of(batch_var):
        if isinstance(count, numbers.Number):
            unbiased = batch_var * (count / max(count - 1, 1))
        else:  # a count still on the GPU (SyncBatchNorm's, summed over the ranks)
            unbiased = batch_var * (count / get_array_module(count).maximum(count - 1, 1))
        return (running_mean * momentum + batch_mean * (1.0 - momentum),
                running_var * momentum + unbiased * (1.0 - momentum))


def batch_norm(inp, running_mean=None, running_var=None, weight=None, bias=None, *,
               training: bool = False, momentum: float = 0.9, eps: float = 1e-5,
               inplace: bool = True):
    """Batch normalisation over every axis but the channel axis 1 of ``inp`` (N, C, ...).

    In training (or when no running statistics are given) the batch statistics normalise, and the
    running ones are updated as ``running = momentum * running + (1 - momentum) * batch`` with the
    *unbiased* batch variance for ``running_var`` (MegEngine's convention: ``momentum`` weights the
    old value). Otherwise the running statistics normalise. Per-channel tensors may be (C,) or
    (1, C, 1, 1). With ``inplace=True`` the running tensors are overwritten and the output is
    returned; with ``inplace=False`` they are left alone and ``(output, new_mean, new_var)`` is
    returned.

    Example::

        y = F.batch_norm(x, rm, rv, w, b, training=True)  # updates rm, rv in place
    """
    op = "batch_norm"
    inp = _float_input(op, inp, 2)
    c, nd = inp.shape[1], inp.ndim
    axes = (0,) + tuple(range(2, nd))
    rm = _channel_param(op, "running_mean", running_mean, c, nd, inp)
    rv = _channel_param(op, "running_var", running_var, c, nd, inp)
    w = _channel_param(op, "weight", weight, c, nd, inp)
    b = _channel_param(op, "bias", bias, c, nd, inp)
    if (rm is None) != (rv is None):
        raise ValueError(f"{op}: give both running_mean and running_var, or neither")
    new_mean = new_var = None
    if training or rm is None:
        out, mu, var = _normalize(inp, axes, eps)
        if rm is not None:
            new_mean, new_var = running_stats_update(rm._data, rv._data, mu, var, inp.size // c,
                                                     momentum)
    else:
        out = (inp - rm.detach()) / sqrt(rv.detach() + eps)
    out = _scale_shift(out, w, b)
    if not inplace:
        if new_mean is None:
            return out, running_mean, running_var
        return (
            out,
            Tensor._wrap(new_mean.reshape(running_mean.shape), inp._device),
            Tensor._wrap(new_var.reshape(running_var.shape), inp._device),
        )
    if new_mean is not None:
        with inp._device.context():
            running_mean._data[...] = new_mean.reshape(running_mean.shape)
            running_var._data[...] = new_var.reshape(running_var.shape)
    return out


def layer_norm(inp, normalized_shape, affine: bool = True, weight=None, bias=None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` axes of each sample; with ``affine`` the
    result is scaled by ``weight`` and shifted by ``bias`` (both of shape ``normalized_shape``)."""
    op = "layer_norm"
    inp = _float_input(op, inp)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or inp.shape[inp.ndim - k :] != shape:
        raise ValueError(
            f"{op}: normalized_shape {shape} does not match the trailing axes of input {inp.shape}"
        )
    axes = tuple(range(inp.ndim - k, inp.ndim))
    if not affine:
        weight = bias = None
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"{op}: {name} has shape {tuple(p.shape)}, expected {shape}")
    weight, bias = (p if p is None or isinstance(p, Tensor) else Tensor(p, device=inp._device)
                    for p in (weight, bias))
    if all(p is None or p.dtype == inp.dtype for p in (weight, bias)):
        return LayerNorm()(inp, weight, bias, axes, float(eps))
    out, _, _ = _normalize(inp, axes, eps)  # mixed dtypes: the composition promotes as usual
    return _scale_shift(out, weight, bias)


def group_norm(inp, num_groups: int, affine: bool = True, weight=None, bias=None,
               eps: float = 1e-5) -> Tensor:
    """Normalise each sample over groups of ``C // num_groups`` channels (and all spatial axes);
    ``weight``/``bias`` are per channel, (C,) or (1, C, 1, 1)."""
    op = "group_norm"
    inp = _float_input(op, inp, 2)
    n, c = inp.shape[:2]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"{op}: num_groups={num_groups} must divide the {c} channels")
    grouped = reshape(inp, (n, num_groups, -1))
    out, _, _ = _normalize(grouped, (2,), eps)
    out = reshape(out, inp.shape)
    if affine:
        w = _channel_param(op, "weight", weight, c, inp.ndim, inp)
        b = _channel_param(op, "bias", bias, c, inp.ndim, inp)
        out = _scale_shift(out, w, b)
    return out


def instance_norm(inp, affine: bool = True, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Normalise each channel of each sample over its spatial axes (``group_norm`` with one group
    per channel); with ``affine`` scale and shift by the per-channel ``weight``/``bias`` ((C,) or
    (1, C, 1, ...)), which MegEngine then requires.

    Example::

        y = F.nn.instance_norm(x, affine=False)  # x (N, C, H, W): every y[n, c] has mean 0, var 1
    """
    op = "instance_norm"
    inp = _float_input(op, inp, 3, "(N, C, spatial...)")
    if affine and (weight is None or bias is None):
        raise ValueError(f"{op}: affine=True needs both weight and bias")
    out, _, _ = _normalize(inp, tuple(range(2, inp.ndim)), eps)
    if affine:
        c = inp.shape[1]
        out = _scale_shift(out, _channel_param(op, "weight", weight, c, inp.ndim, inp),
                           _channel_param(op, "bias", bias, c, inp.ndim, inp))
    return out
