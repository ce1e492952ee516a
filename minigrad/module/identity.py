"""Shape-only layers: ``Identity`` and ``Flatten``."""

from __future__ import annotations

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.module.module import Module, no_parameters


class Identity(Module):
    """Returns its input (a placeholder where an architecture has an optional layer)."""

    count_parameters = staticmethod(no_parameters)

    def forward(self, x: Tensor) -> Tensor:
        return x


class Flatten(Module):
    """Flatten axes ``start_axis..end_axis`` (default: everything but the batch axis)."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, start_axis: int = 1, end_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.start_axis = start_axis
        self.end_axis = end_axis

    def forward(self, x: Tensor) -> Tensor:
        return F.flatten(x, self.start_axis, self.end_axis)

    def extra_repr(self) -> str:
        return f"start_axis={self.start_axis}, end_axis={self.end_axis}"
