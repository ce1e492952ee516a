"""The softmax family: ``softmax`` and ``logsoftmax`` along one axis.

Both are primitives with one fused, max-shifted forward and a short backward written with Tensor
ops (so it is itself differentiable): they sit on every training step's hot path, in classifiers'
losses and in every attention layer.
"""

from __future__ import annotations

from minigrad.autodiff.function import Function
from minigrad.functional.elementwise import _f, _saved_out, exp
from minigrad.functional.reduction import sum as _sum
from minigrad.tensor import Tensor

__all__ = ["log_softmax", "logsoftmax", "softmax"]


def _axis(inp: Tensor, axis, op: str) -> int:
    if inp.ndim == 0:
        raise ValueError(f"{op}: expected a tensor of rank >= 1, got a scalar")
    axis = inp.ndim - 1 if axis is None else int(axis)
    if not -inp.ndim <= axis < inp.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for shape {inp.shape}")
    return axis % inp.ndim


class Softmax(Function):
    """``y = softmax(x)``; gradient ``y * (dy - sum(dy * y))`` along the axis."""

    def forward(self, x, axis):
        d = x._data
        y = x.xp.exp(d - d.max(axis=axis, keepdims=True))
        y /= y.sum(axis=axis, keepdims=True)
        self.x, self.y, self.axis = x, y, axis
        return y

    def backward(self, dy):
        y = _saved_out(self, self.y, lambda: softmax(self.x, self.axis))
        return y * (dy - _sum(dy * y, self.axis, keepdims=True)), None


class LogSoftmax(Function):
    """``y = logsoftmax(x)``; gradient ``dy - e**y * sum(dy)`` along the axis."""

    def forward(self, x, axis):
        xp, d = x.xp, x._data
        s = d - d.max(axis=axis, keepdims=True)
        s -= xp.log(xp.exp(s).sum(axis=axis, keepdims=True))
        self.x, self.y, self.axis = x, s, axis
        return s

    def backward(self, dy):
        y = _saved_out(self, self.y, lambda: logsoftmax(self.x, self.axis))
        return dy - exp(y) * _sum(dy, self.axis, keepdims=True), None


def softmax(inp, axis: int | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis`` (default: the last), shifted by the max for
    stability.

    Example::

        probs = F.softmax(logits, axis=1)   # each row sums to 1
    """
    inp = _f(inp)
    return Softmax()(inp, _axis(inp, axis, "softmax"))


def logsoftmax(inp, axis: int | None = None) -> Tensor:
    """``x - logsumexp(x)`` along ``axis`` (default: the last); stable for large logits."""
    inp = _f(inp)
    return LogSoftmax()(inp, _axis(inp, axis, "logsoftmax"))


log_softmax = logsoftmax
