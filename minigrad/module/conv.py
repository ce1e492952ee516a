"""Convolution layers (NCHW): ``Conv1d``, ``Conv2d`` and ``ConvTranspose2d``.

Weights are stored ``(out, in // groups, *kernel)`` for convolutions and
``(in, out // groups, *kernel)`` for the transposed one; biases have MegEngine's broadcastable
shape ``(1, out, 1, 1)`` (``(1, out, 1)`` for Conv1d). Initialisation is PyTorch's default.
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.module import init
from minigrad.module.module import Module
from minigrad.tensor import Parameter, Tensor


def _tuple(value, n: int, name: str, layer: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(f"{layer}: {name} must have {n} values, got {tuple(value)}")
        return tuple(int(v) for v in value)
    return (int(value),) * n


class _ConvNd(Module):
    """What the convolution layers share: argument checks, parameters, init and repr."""

    _nd = 2
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        layer = type(self).__name__
        n = self._nd
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = _tuple(kernel_size, n, "kernel_size", layer)
        self.stride = _tuple(stride, n, "stride", layer)
        self.padding = _tuple(padding, n, "padding", layer)
        self.dilation = _tuple(dilation, n, "dilation", layer)
        self.groups = int(groups)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"{layer}: in_channels ({self.in_channels}) and out_channels ({self.out_channels}) "
                f"must both be divisible by groups ({self.groups})"
            )
        if self._transposed:
            wshape = (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
        else:
            wshape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        self.weight = Parameter(np.zeros(wshape, np.float32))
        bshape = (1, self.out_channels) + (1,) * n
        self.bias = Parameter(np.zeros(bshape, np.float32)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh initial weights: Kaiming-uniform weight, ``U(+-1/sqrt(fan_in))`` bias."""
        init.msra_uniform_(self.weight, a=init.DEFAULT_LAYER_A)
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight)
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def _check_input(self, x: Tensor) -> None:
        if x.ndim != self._nd + 2 or x.shape[1] != self.in_channels:
            dims = ", ".join(["N", str(self.in_channels)] + ["*"] * self._nd)
            raise ValueError(
                f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}): expected input of shape ({dims}), "
                f"got {tuple(x.shape)}"
            )

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}, padding={self.padding}")
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + f", bias={self.bias is not None}"


class Conv1d(_ConvNd):
    """1-d convolution over ``(N, C, L)`` inputs."""

    _nd = 1

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv1d(x, self.weight, self.bias, stride=self.stride[0], padding=self.padding[0],
                        dilation=self.dilation[0], groups=self.groups)


class Conv2d(_ConvNd):
    """2-d convolution over ``(N, C, H, W)`` inputs.

    Example::

        conv = M.Conv2d(3, 16, 3, padding=1)
        conv(x).shape  # (N, 16, H, W)
    """

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-d convolution (the adjoint of ``Conv2d``; upsampling in decoders)."""

    _transposed = True

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv_transpose2d(x, self.weight, self.bias, stride=self.stride,
                                  padding=self.padding, dilation=self.dilation,
                                  groups=self.groups)
