"""The softmax family: ``softmax`` and ``logsoftmax`` along one axis.

Both are primitives with one fused kernel each way (``minigrad.backend.kernels``: max-shifted
forward, one-pass backward), and a backward written with Tensor ops when it is itself being
recorded (second order): they sit on every training step's hot path, in classifiers' losses and in
every attention layer.
"""

from __future__ import annotations

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import kernels
from minigrad.functional._util import autocast_high, recording_backward
from minigrad.functional.elementwise import _f, exp
from minigrad.functional.reduction import sum as _sum

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
        self.x, self.axis = x, axis
        self.y = kernels.softmax(x._data, axis)
        return self.y

    def backward(self, dy):
        if recording_backward():  # recompute the output as a recorded function of x
            y = softmax(self.x, self.axis)
            return y * (dy - _sum(dy * y, self.axis, keepdims=True)), None
        return kernels.softmax_grad(self.y, dy._data, self.axis), None


class LogSoftmax(Function):
    """``y = logsoftmax(x)``; gradient ``dy - e**y * sum(dy)`` along the axis."""

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
    stability.

    Example::

        probs = F.softmax(logits, axis=1)   # each row sums to 1
    """
    inp = _f(inp)
    if AUTOCAST.enabled:  # float32 (see minigrad.autodiff.autocast)
        (inp,) = autocast_high(inp)
    return Softmax()(inp, _axis(inp, axis, "softmax"))


def logsoftmax(inp, axis: int | None = None) -> Tensor:
    """``x - logsumexp(x)`` along ``axis`` (default: the last); stable for large logits."""
    inp = _f(inp)
    if AUTOCAST.enabled:  # float32 (see minigrad.autodiff.autocast)
        (inp,) = autocast_high(inp)
    return LogSoftmax()(inp, _axis(inp, axis, "logsoftmax"))


log_softmax = logsoftmax
