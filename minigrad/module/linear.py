"""``Linear``: ``y = x @ weight.T + bias``, ``weight`` stored ``(out_features, in_features)``."""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.module import init
from minigrad.module.module import Module


class Linear(Module):
    """Fully connected layer (MegEngine/PyTorch layout and PyTorch's default initialisation:
    Kaiming-uniform weight with ``a = sqrt(5)``, bias ``U(-1/sqrt(in), 1/sqrt(in))``).

    Example::

        fc = M.Linear(784, 10)
        fc(mg.tensor(np.zeros((32, 784), "float32"))).shape  # (32, 10)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.weight = Parameter(np.zeros((self.out_features, self.in_features), np.float32))
        self.bias = Parameter(np.zeros(self.out_features, np.float32)) if bias else None
        self.reset_parameters()

    @staticmethod
    def count_parameters(in_features: int, out_features: int, bias: bool = True, **kwargs) -> int:
        """The number of trainable parameters ``Linear(...)`` with these arguments has, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        return (in_features + bool(bias)) * out_features

    def reset_parameters(self) -> None:
        """Draw fresh initial weights (PyTorch's default scheme, see the class docstring)."""
        init.msra_uniform_(self.weight, a=init.DEFAULT_LAYER_A)
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"{type(self).__name__}(in_features={self.in_features}, out_features="
                f"{self.out_features}): expected input of shape (..., {self.in_features}), "
                f"got {tuple(x.shape)}"
            )
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
