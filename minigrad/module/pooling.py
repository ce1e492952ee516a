"""Pooling layers over ``(N, C, H, W)``: ``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d``."""

from __future__ import annotations

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.module.module import Module, no_parameters


def _check_4d(layer: Module, x: Tensor) -> None:
    if x.ndim != 4:
        raise ValueError(
            f"{type(layer).__name__}: expected input of shape (N, C, H, W), got {tuple(x.shape)}"
        )


class MaxPool2d(Module):
    """Max over ``kernel_size`` windows; ``stride`` defaults to ``kernel_size``."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, kernel_size, stride=None, padding=0, **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def forward(self, x: Tensor) -> Tensor:
        _check_4d(self, x)
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        stride = self.kernel_size if self.stride is None else self.stride  # the one in effect
        return f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}"


class AvgPool2d(Module):
    """Mean over windows. ``mode`` is MegEngine's: ``"average_count_exclude_padding"`` (default)
    divides by the number of real pixels, ``"average"`` by the full window size."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, kernel_size, stride=None, padding=0,
                 mode: str = "average_count_exclude_padding", **kwargs):
        super().__init__(**kwargs)
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.mode = mode

    def forward(self, x: Tensor) -> Tensor:
        _check_4d(self, x)
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, mode=self.mode)

    def extra_repr(self) -> str:
        stride = self.kernel_size if self.stride is None else self.stride  # the one in effect
        return (f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}, "
                f"mode={self.mode!r}")


class AdaptiveAvgPool2d(Module):
    """Average-pool to a fixed output size ``oshp`` (int or ``(oh, ow)``) whatever the input."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, oshp, **kwargs):
        super().__init__(**kwargs)
        self.oshp = oshp

    def forward(self, x: Tensor) -> Tensor:
        _check_4d(self, x)
        return F.adaptive_avg_pool2d(x, self.oshp)

    def extra_repr(self) -> str:
        return f"oshp={self.oshp}"
