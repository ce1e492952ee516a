"""Neural-network ops. Most are compositions of elementwise, reduction and shape primitives
(so they get gradients for free); convolution and pooling own their backward."""

from __future__ import annotations

import numpy as np

from minigrad.functional.elementwise import _f, exp, log, maximum, relu, sigmoid, tanh  # noqa: F401
from minigrad.functional.linalg import matmul
from minigrad.functional.reduction import logsumexp, max, sum  # noqa: A004
from minigrad.functional.shape import indexing_one_hot
from minigrad.tensor import Tensor


def linear(inp, weight, bias=None) -> Tensor:
    """``inp @ weight.T + bias`` with ``weight`` stored (out_features, in_features)."""
    out = matmul(inp, weight, transpose_b=True)
    return out if bias is None else out + bias


def softmax(inp, axis: int | None = None) -> Tensor:
    """Softmax along ``axis`` (default: the last axis), shifted by the constant max for stability."""
    inp = _f(inp)
    axis = inp.ndim - 1 if axis is None else axis
    m = Tensor._wrap(inp.xp.max(inp._data, axis=axis, keepdims=True), inp._device)
    e = exp(inp - m)
    return e / sum(e, axis, keepdims=True)


def logsoftmax(inp, axis: int | None = None) -> Tensor:
    inp = _f(inp)
    axis = inp.ndim - 1 if axis is None else axis
    return inp - logsumexp(inp, axis, keepdims=True)


log_softmax = logsoftmax


def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True, label_smooth: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """Cross entropy of class scores ``pred`` (N, C, ...) against integer labels (N, ...)."""
    pred = _f(pred)
    label = label if isinstance(label, Tensor) else Tensor(np.asarray(label), device=pred._device)
    if label.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: label must be an integer tensor, got dtype {label.dtype}")
    axis = axis % pred.ndim
    expect = pred.shape[:axis] + pred.shape[axis + 1 :]
    if label.shape != expect:
        raise ValueError(
            f"cross_entropy: label shape {label.shape} does not match pred shape {pred.shape} "
            f"(expected {expect} for axis={axis})"
        )
    n_cls = pred.shape[axis]
    if label.size and (int(label._data.min()) < 0 or int(label._data.max()) >= n_cls):
        raise ValueError(
            f"cross_entropy: labels must be in [0, {n_cls}), got min {int(label._data.min())} "
            f"max {int(label._data.max())}"
        )
    logp = logsoftmax(pred, axis) if with_logits else log(pred)
    nll = -indexing_one_hot(logp, label, axis)
    if label_smooth:
        nll = (1 - label_smooth) * nll - label_smooth * sum(logp, axis) / n_cls
    return _reduce(nll, reduction, "cross_entropy")


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
