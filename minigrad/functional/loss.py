"""Losses and the top-k accuracy metric, all compositions of existing ops.

Every loss takes ``reduction``: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-element loss).
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.function import Function
from minigrad.functional._util import recording_backward
from minigrad.functional.elementwise import _f, exp, log, log1p, relu
from minigrad.functional.elementwise import abs as _abs
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import indexing_one_hot, one_hot
from minigrad.functional.softmax_family import logsoftmax, softmax
from minigrad.tensor import Tensor

__all__ = [
    "binary_cross_entropy",
    "cross_entropy",
    "l1_loss",
    "mse_loss",
    "square_loss",
    "topk_accuracy",
]


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_reduction(reduction: str, op: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _float_pair(op: str, pred, label):
    pred = _f(pred)
    label = label if isinstance(label, Tensor) else Tensor(label, device=pred._device)
    label = _f(label)
    if pred.shape != label.shape:
        raise ValueError(f"{op}: pred shape {pred.shape} and label shape {label.shape} differ")
    return pred, label


class _LogitsCrossEntropy(Function):
    """Cross entropy of (N, C) logits against labels as one node. It ends nearly every training
    step, and its gradient is simply ``softmax - one_hot``: one pass instead of the backward of
    log-softmax, indexing, negation and mean. Same values as the composition, bit for bit."""

    def forward(self, pred, label, reduction):
        xp, d, lab = pred.xp, pred._data, label._data
        rows = xp.arange(d.shape[0])
        z = d - d.max(axis=1, keepdims=True)
        e = xp.exp(z)
        s = e.sum(axis=1, keepdims=True)
        nll = xp.log(s[:, 0]) - z[rows, lab]  # == -logsoftmax[label], same rounding
        e /= s
        self.pred, self.label, self.rows, self.prob = pred, label, rows, e
        self.reduction = reduction
        if reduction == "none":
            return nll
        return nll.mean() if reduction == "mean" else nll.sum()

    def backward(self, dy):
        n, c = self.pred.shape
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            g = softmax(self.pred, 1) - one_hot(self.label, c).astype(self.pred.dtype)
            scale = dy.reshape((n, 1)) if self.reduction == "none" else dy
            return g * (scale / n if self.reduction == "mean" else scale), None, None
        g, d = self.prob, dy._data  # prob is ours: the graph is freed after this backward
        g[self.rows, self.label._data] -= 1
        g *= d[:, None] if self.reduction == "none" else (d / n if self.reduction == "mean" else d)
        return g, None, None


def cross_entropy(pred, label, axis: int = 1, with_logits: bool = True, label_smooth: float = 0.0,
                  reduction: str = "mean") -> Tensor:
    """Cross entropy of class scores ``pred`` (N, C, ...) against integer labels (N, ...).

    ``with_logits=False`` means ``pred`` already holds probabilities. ``label_smooth`` mixes the
    one-hot target with the uniform distribution: ``(1 - s) * nll - s * mean_c(log p_c)``.

    Example::

        loss = F.cross_entropy(logits, labels)  # logits (N, 10), labels int32 (N,)
    """
    op = "cross_entropy"
    _check_reduction(reduction, op)
    pred = _f(pred)
    label = label if isinstance(label, Tensor) else Tensor(np.asarray(label), device=pred._device)
    if label.dtype.kind not in "iu":
        raise TypeError(f"{op}: label must be an integer tensor, got dtype {label.dtype}")
    if pred.ndim == 0:
        raise ValueError(f"{op}: pred must have a class axis, got a scalar")
    axis = axis % pred.ndim
    expect = pred.shape[:axis] + pred.shape[axis + 1 :]
    if label.shape != expect:
        raise ValueError(
            f"{op}: label shape {label.shape} does not match pred shape {pred.shape} "
            f"(expected {expect} for axis={axis})"
        )
    n_cls = pred.shape[axis]
    if label.size:
        lo, hi = int(label._data.min()), int(label._data.max())
        if lo < 0 or hi >= n_cls:
            raise ValueError(f"{op}: labels must be in [0, {n_cls}), got min {lo} max {hi}")
    if with_logits and not label_smooth and pred.ndim == 2:
        return _LogitsCrossEntropy()(pred, label, reduction)
    logp = logsoftmax(pred, axis) if with_logits else log(pred)
    nll = -indexing_one_hot(logp, label, axis)
    if label_smooth:
        nll = nll * (1.0 - label_smooth) - _sum(logp, axis) * (label_smooth / n_cls)
    return _reduce(nll, reduction, op)


def binary_cross_entropy(pred, label, with_logits: bool = True,
                         reduction: str = "mean") -> Tensor:
    """Binary cross entropy against float targets in [0, 1] of the same shape.

    With logits ``x`` it is ``relu(x) - x*y + log1p(exp(-|x|))`` (no overflow for any ``x``);
    with probabilities ``p`` it is ``-(y log p + (1-y) log(1-p))``.
    """
    op = "binary_cross_entropy"
    _check_reduction(reduction, op)
    pred, label = _float_pair(op, pred, label)
    if with_logits:
        loss = relu(pred) - pred * label + log1p(exp(-_abs(pred)))
    else:
        loss = -(label * log(pred) + (1.0 - label) * log(1.0 - pred))
    return _reduce(loss, reduction, op)


def l1_loss(pred, label, reduction: str = "mean") -> Tensor:
    """Mean (or sum) absolute error ``|pred - label|``."""
    _check_reduction(reduction, "l1_loss")
    pred, label = _float_pair("l1_loss", pred, label)
    return _reduce(_abs(pred - label), reduction, "l1_loss")


def square_loss(pred, label, reduction: str = "mean") -> Tensor:
    """Mean (or sum) squared error ``(pred - label)**2`` (MegEngine's name for MSE)."""
    _check_reduction(reduction, "square_loss")
    pred, label = _float_pair("square_loss", pred, label)
    diff = pred - label
    return _reduce(diff * diff, reduction, "square_loss")


mse_loss = square_loss


def topk_accuracy(logits, target, topk=1):
    """Fraction of rows of ``logits`` (N, C) whose ``target`` class is among the ``k`` highest
    scores, for each ``k`` in ``topk``: a float32 scalar tensor for an int ``topk``, a tuple of them
    for a tuple. Ties are broken towards the lower class index. Not differentiable."""
    op = "topk_accuracy"
    logits = _f(logits)
    target = target if isinstance(target, Tensor) else Tensor(np.asarray(target),
                                                               device=logits._device)
    if logits.ndim != 2:
        raise ValueError(f"{op}: logits must be 2-D (N, C), got shape {logits.shape}")
    if target.dtype.kind not in "iu" or target.shape != logits.shape[:1]:
        raise ValueError(
            f"{op}: target must be integer with shape {logits.shape[:1]}, got dtype "
            f"{target.dtype} shape {target.shape}"
        )
    ks = (topk,) if isinstance(topk, int) else tuple(topk)
    n_cls = logits.shape[1]
    for k in ks:
        if not 1 <= k <= n_cls:
            raise ValueError(f"{op}: k={k} out of range for {n_cls} classes")
    xp = logits.xp
    order = xp.argsort(-logits._data, axis=1, kind="stable")
    hit = order == target._data.reshape(-1, 1)
    accs = tuple(
        Tensor._wrap(xp.asarray(hit[:, :k].any(axis=1).mean(), dtype=np.float32), logits._device)
        for k in ks
    )
    return accs[0] if isinstance(topk, int) else accs
