"""Activation layers: thin modules over the functional ops, so they can sit in a ``Sequential``."""

from __future__ import annotations

import minigrad.functional as F
from minigrad.module.module import Module
from minigrad.tensor import Tensor


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class LeakyReLU(Module):
    """``max(x, 0) + negative_slope * min(x, 0)``."""

    def __init__(self, negative_slope: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        self.negative_slope = float(negative_slope)

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(Module):
    """Exact (erf-based) GELU."""

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x)


class SiLU(Module):
    """``x * sigmoid(x)`` (a.k.a. swish)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Softmax(Module):
    """Softmax along ``axis`` (default: the last axis)."""

    def __init__(self, axis: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"
