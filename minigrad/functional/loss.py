"""Losses and the top-k accuracy metric, all compositions of existing ops.

Every loss takes ``reduction``: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per-element loss).
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function, dispatches
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import kernels
from minigrad.backend.device_checks import check_range
from minigrad.backend.xp import to_numpy
from minigrad.functional._util import autocast_high, recording_backward
from minigrad.functional.elementwise import _f, exp, log, log1p, relu
from minigrad.functional.elementwise import abs as _abs
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import broadcast_to, indexing_one_hot, one_hot
from minigrad.functional.softmax_family import logsoftmax, softmax

__all__ = [
    "binary_cross_entropy",
    "cross_entropy",
    "ctc_loss",
    "hinge_loss",
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
    if AUTOCAST.enabled:  # losses compute in float32 (see minigrad.autodiff.autocast)
        pred, label = autocast_high(pred, label)
    if pred.shape != label.shape:
        raise ValueError(f"{op}: pred shape {pred.shape} and label shape {label.shape} differ")
    return pred, label


class LogitsCrossEntropy(Function):
    """Cross entropy of (N, C) logits against labels as one node. It ends nearly every training
    step, and its gradient is simply ``softmax - one_hot``: one pass instead of the backward of
    log-softmax, indexing, negation and mean. On the CPU the same values as the composition, bit
    for bit; on a GPU one kernel each way (``kernels.cross_entropy_rows``)."""

    def forward(self, pred, label, reduction):
        nll, self.prob = kernels.cross_entropy_rows(pred._data, label._data)
        self.pred, self.label, self.reduction = pred, label, reduction
        if reduction == "none":
            return nll
        return nll.mean() if reduction == "mean" else nll.sum()

    def backward(self, dy):
        n, c = self.pred.shape
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            g = softmax(self.pred, 1) - one_hot(self.label, c).astype(self.pred.dtype)
            scale = dy.reshape((n, 1)) if self.reduction == "none" else dy
            return g * (scale / n if self.reduction == "mean" else scale), None, None
        # prob is ours (the graph is freed after this backward): the gradient is made in it
        divisor = n if self.reduction == "mean" else 1
        return kernels.cross_entropy_rows_grad(self.prob, self.label._data, dy._data,
                                               divisor), None, None


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
    if AUTOCAST.enabled:  # losses compute in float32 (see minigrad.autodiff.autocast)
        (pred,) = autocast_high(pred)
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
    check_range(label._data, 0, n_cls, lambda lo, hi: ValueError(
        f"{op}: labels must be in [0, {n_cls}), got min {lo} max {hi}"))
    if with_logits and not label_smooth and pred.ndim == 2:
        return LogitsCrossEntropy()(pred, label, reduction)
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


class SquareLoss(Function):
    """``sum((pred - label)**2) * scale`` as one node (``scale``: ``1/n`` for the mean, None for
    the sum). It ends many training steps, and as a composition it is four nodes each way; on the
    CPU this is the composition's arithmetic, array op for array op (the same values, bit for
    bit): forward the difference, its square, the sum, the scaling; backward ``u = dy * scale *
    diff`` and ``u + u`` (the square's two equal gradients), negated for the label when it wants
    one. On a GPU one kernel each way (``kernels.squared_error_sum``). Backward uses Tensor ops
    when it is being recorded."""

    def forward(self, pred, label, scale):
        total, self.diff = kernels.squared_error_sum(pred._data, label._data, scale)
        self.pred, self.label, self.scale = pred, label, scale
        return total

    def backward(self, dy):
        need_label = self.needs_input_grad(1)
        if recording_backward():
            diff = self.pred - self.label
            g = dy if self.scale is None else dy * self.scale
            u = broadcast_to(g, diff.shape) * diff
            dp = u + u
            return dp, (-dp if need_label else None), None
        dp = kernels.squared_error_grad(self.pred._data, self.label._data, self.diff, dy._data,
                                        self.scale)
        return dp, (-dp if need_label else None), None


def square_loss(pred, label, reduction: str = "mean") -> Tensor:
    """Mean (or sum) squared error ``(pred - label)**2`` (MegEngine's name for MSE)."""
    _check_reduction(reduction, "square_loss")
    pred, label = _float_pair("square_loss", pred, label)
    if (reduction != "none" and not AUTOCAST.enabled and pred.dtype == label.dtype
            and pred.dtype.kind == "f" and not dispatches((pred, label))):
        n = pred.size
        scale = (1.0 / n if n else float("nan")) if reduction == "mean" else None
        return SquareLoss()(pred, label, scale)
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
    with logits._device.context():
        order = xp.argsort(-logits._data, axis=1, kind="stable")
        hit = order == target._data.reshape(-1, 1)
        accs = tuple(
            Tensor._wrap(xp.asarray(hit[:, :k].any(axis=1).mean(), dtype=np.float32),
                         logits._device)
            for k in ks
        )
    return accs[0] if isinstance(topk, int) else accs


def hinge_loss(pred, label, norm: str = "L1", reduction: str = "mean") -> Tensor:
    """SVM hinge loss of scores ``pred`` (N, C) against labels ``label`` in {-1, +1} (same shape):
    per sample ``sum_j max(0, 1 - pred * label)`` (``norm="L1"``) or the sum of its squares
    (``norm="L2"``), then reduced over the batch.

    Example::

        F.nn.hinge_loss(mg.tensor([[0.5, -0.5]]), mg.tensor([[1.0, -1.0]]))  # 1.0
    """
    op = "hinge_loss"
    _check_reduction(reduction, op)
    pred, label = _float_pair(op, pred, label)
    if norm.upper() not in ("L1", "L2"):
        raise ValueError(f"{op}: norm must be 'L1' or 'L2', got {norm!r}")
    if pred.ndim != 2:
        raise ValueError(f"{op}: pred must be (N, C), got shape {pred.shape}")
    margin = relu(1.0 - pred * label)
    per_sample = _sum(margin if norm.upper() == "L1" else margin * margin, 1)
    return _reduce(per_sample, reduction, op)


def _ctc_extended_labels(xp, label, lengths, blank: int):
    """(N, 2*S+1) label sequences with a blank before, between and after the symbols."""
    n = lengths.shape[0]
    if label.ndim == 1:  # concatenated labels: unpack into rows padded with blanks
        rows = xp.full((n, int(lengths.max())), blank, dtype=label.dtype)
        starts = xp.concatenate([xp.zeros(1, dtype=lengths.dtype), xp.cumsum(lengths)[:-1]])
        for i in range(n):
            rows[i, : int(lengths[i])] = label[int(starts[i]) : int(starts[i] + lengths[i])]
        label = rows
    ext = xp.full((n, 2 * label.shape[1] + 1), blank, dtype=xp.int64)
    ext[:, 1::2] = label
    return ext


def _logsumexp3(xp, a, b, c):
    m = xp.maximum(xp.maximum(a, b), c)
    safe = xp.where(xp.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + xp.log(xp.exp(a - safe) + xp.exp(b - safe) + xp.exp(c - safe))


def _shift(xp, x, k: int):
    """``x[..., s - k]`` along the last axis, ``-inf`` where ``s - k`` is out of range."""
    out = xp.full_like(x, -xp.inf)
    if k > 0:
        out[..., k:] = x[..., :-k]
    else:
        out[..., :k] = x[..., -k:]
    return out


class _CTC(Function):
    """Negative log-likelihood of each label sequence under per-frame class probabilities, by the
    forward (alpha) recursion over the blank-extended label in log space; the gradient comes from
    the backward (beta) recursion: ``d(-log p)/d pred[t, n, k] = -sum_{s: ext[s] = k} gamma / pred``
    with the state occupancies ``gamma = alpha * beta / (emission * p)`` (Graves et al., 2006)."""

    def forward(self, pred, pred_lengths, ext, blank):
        xp = pred.xp
        probs = pred._data.astype(np.float64)
        t_len, n, _ = probs.shape
        tiny = np.finfo(np.float64).tiny
        batch = xp.arange(n)[:, None]
        emit = xp.log(xp.maximum(probs, tiny))[:, batch, ext]  # (T, N, L) log-probability per state
        skip = xp.zeros(ext.shape, dtype=bool)
        skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
        skip_add = xp.where(skip, 0.0, -xp.inf)
        lengths = xp.asarray(pred_lengths)
        labels = (ext != blank).sum(axis=1)
        states = xp.arange(ext.shape[1])[None, :]
        final = (states == 2 * labels[:, None]) | (states == 2 * labels[:, None] - 1)

        alpha = xp.full((t_len,) + ext.shape, -xp.inf)
        alpha[0, :, :2] = emit[0, :, :2]
        for t in range(1, t_len):
            prev = alpha[t - 1]
            alpha[t] = _logsumexp3(xp, prev, _shift(xp, prev, 1), _shift(xp, prev, 2) + skip_add)
            alpha[t] += emit[t]
        last = alpha[lengths - 1, xp.arange(n)]  # (N, L): alpha at each sample's last frame
        ends = xp.where(final, last, -xp.inf)  # the two states that complete the label
        top = ends.max(axis=1)
        safe = xp.where(xp.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            loglik = safe + xp.log(xp.exp(ends - safe[:, None]).sum(axis=1))
        self.saved = (probs, emit, skip_add, lengths, final, alpha, loglik, ext, pred.dtype)
        return (-loglik).astype(pred.dtype)

    def backward(self, dy):
        probs, emit, skip_add, lengths, final, alpha, loglik, ext, dtype = self.saved
        xp = dy.xp
        t_len, n, c = probs.shape
        beta = xp.full(alpha.shape, -xp.inf)
        ahead = xp.full(ext.shape, -xp.inf)  # beta at frame t + 1
        for t in range(t_len - 1, -1, -1):
            step = _logsumexp3(xp, ahead, _shift(xp, ahead, -1), _shift(xp, ahead + skip_add, -2))
            start = xp.where(final, emit[t], -xp.inf)
            now = xp.where((t == lengths - 1)[:, None], start, step + emit[t])
            beta[t] = xp.where((t < lengths)[:, None], now, -xp.inf)
            ahead = beta[t]
        feasible = xp.isfinite(loglik)
        with np.errstate(invalid="ignore"):
            gamma = xp.exp(alpha + beta - emit - xp.where(feasible, loglik, 0.0)[None, :, None])
        gamma = xp.where(feasible[None, :, None], gamma, 0.0)
        one_hot = ext[:, :, None] == xp.arange(c)  # (N, L, C)
        occupancy = xp.einsum("tns,nsc->tnc", gamma, one_hot.astype(np.float64))
        tiny = np.finfo(np.float64).tiny
        grad = -occupancy / xp.maximum(probs, tiny) * (probs > tiny)
        grad *= dy._data.astype(np.float64)[None, :, None]
        return grad.astype(dtype), None, None, None


def ctc_loss(pred, pred_lengths, label, label_lengths, blank: int = 0,
             reduction: str = "mean") -> Tensor:
    """Connectionist Temporal Classification loss, MegEngine's conventions.

    ``pred`` (T, N, C) holds per-frame class *probabilities* (not logits; apply softmax first),
    ``pred_lengths`` (N,) the number of valid frames of each sample, ``label`` the target symbols
    as (N, S) padded rows or one concatenated 1-D tensor, ``label_lengths`` (N,) their lengths, and
    ``blank`` the blank class. The loss of a sample is ``-log p(label | pred)`` summed over all
    alignments; ``"mean"`` averages ``loss / label_length`` over the batch (MegEngine's choice),
    ``"sum"`` adds the losses. A label that cannot fit in its frames has infinite loss and no
    gradient.

    Example::

        loss = F.nn.ctc_loss(F.softmax(logits, axis=-1), pred_lengths, labels, label_lengths)
    """
    op = "ctc_loss"
    _check_reduction(reduction, op)
    pred = _f(pred)
    if pred.ndim != 3:
        raise ValueError(f"{op}: pred must be (T, N, C) probabilities, got shape {pred.shape}")
    t_len, n, c = pred.shape
    xp = np  # lengths and labels are checked and extended on the host, then sent to pred's device
    ints = [to_numpy(v._data) if isinstance(v, Tensor) else np.asarray(v)
            for v in (pred_lengths, label, label_lengths)]
    p_len, lab, l_len = ints
    for name, v in (("pred_lengths", p_len), ("label", lab), ("label_lengths", l_len)):
        if v.dtype.kind not in "iu":
            raise TypeError(f"{op}: {name} must be an integer tensor, got dtype {v.dtype}")
    if p_len.shape != (n,) or l_len.shape != (n,):
        raise ValueError(f"{op}: pred_lengths {p_len.shape} and label_lengths {l_len.shape} must "
                         f"both be ({n},) for a batch of {n}")
    if not 0 <= blank < c:
        raise ValueError(f"{op}: blank must be in [0, {c}), got {blank}")
    if n and (int(p_len.min()) < 1 or int(p_len.max()) > t_len):
        raise ValueError(f"{op}: pred_lengths must be in [1, {t_len}], got min "
                         f"{int(p_len.min())} max {int(p_len.max())}")
    if n and int(l_len.min()) < 1:
        raise ValueError(f"{op}: label_lengths must be >= 1, got min {int(l_len.min())}")
    if lab.ndim == 1 and lab.shape[0] != int(l_len.sum()):
        raise ValueError(f"{op}: a concatenated label has {lab.shape[0]} symbols but "
                         f"label_lengths add up to {int(l_len.sum())}")
    if lab.ndim == 2 and (lab.shape[0] != n or int(l_len.max()) > lab.shape[1]):
        raise ValueError(f"{op}: label {lab.shape} does not hold {n} rows of up to "
                         f"{int(l_len.max())} symbols")
    if lab.ndim not in (1, 2):
        raise ValueError(f"{op}: label must be (N, S) or concatenated 1-D, got shape {lab.shape}")
    if lab.size and (int(lab.min()) < 0 or int(lab.max()) >= c):
        raise ValueError(f"{op}: label symbols must be in [0, {c}), got min {int(lab.min())} "
                         f"max {int(lab.max())}")
    if lab.ndim == 2:  # symbols beyond a row's length are padding: make them blanks
        lab = xp.where(xp.arange(lab.shape[1])[None, :] < l_len[:, None], lab, blank)
    ext = pred._device.put(_ctc_extended_labels(xp, lab, l_len, blank))
    loss = _CTC()(pred, p_len, ext, blank)
    if reduction == "mean":
        return (loss / Tensor._wrap(pred._device.put(l_len.astype(pred.dtype)),
                                    pred._device)).mean()
    return _reduce(loss, reduction, op)
