"""Activation layers: thin modules over the functional ops, so they can sit in a ``Sequential``."""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.module.module import Module, no_parameters


class _Activation(Module):
    """A layer without parameters that applies ``function`` (one of ``F``'s activations) to its
    input: the shared body of ReLU, GELU, SiLU, Sigmoid and Tanh. They inherit ``Module``'s
    constructor, so they share this ``count_parameters`` too (see ``LayerSpec.num_parameters``)."""

    count_parameters = staticmethod(no_parameters)
    function = staticmethod(lambda x: x)

    def forward(self, x: Tensor) -> Tensor:
        return self.function(x)


class ReLU(_Activation):
    """``max(x, 0)``.

    Example::

        net = M.Sequential(M.Linear(784, 256), M.ReLU(), M.Linear(256, 10))
    """

    function = staticmethod(F.relu)


class GELU(_Activation):
    """Exact (erf-based) GELU, ``x * Phi(x)``."""

    function = staticmethod(F.gelu)


class SiLU(_Activation):
    """``x * sigmoid(x)`` (a.k.a. swish)."""

    function = staticmethod(F.silu)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``."""

    function = staticmethod(F.sigmoid)


class Tanh(_Activation):
    """The hyperbolic tangent."""

    function = staticmethod(F.tanh)


class LeakyReLU(Module):
    """``max(x, 0) + negative_slope * min(x, 0)``."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, negative_slope: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        self.negative_slope = float(negative_slope)

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class PReLU(Module):
    """``max(x, 0) + a * min(x, 0)`` with a learned slope ``a`` (``weight``), initialised to
    ``init``: one slope shared by all channels (``num_parameters=1``, shape ``(1,)``) or one per
    channel of NCHW input (shape ``(1, C, 1, 1)``), as in MegEngine.

    Example::

        act = M.PReLU(num_parameters=16)   # after a Conv2d with 16 output channels
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, **kwargs):
        super().__init__(**kwargs)
        self.num_parameters = int(num_parameters)
        shape = (1, self.num_parameters, 1, 1) if self.num_parameters > 1 else (1,)
        self.weight = Parameter(np.full(shape, init, dtype=np.float32))

    def forward(self, x: Tensor) -> Tensor:
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softmax(Module):
    """Softmax along ``axis`` (default: the last axis)."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, axis: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.axis = axis

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"
