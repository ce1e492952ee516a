"""Convolution layers (NCHW): ``Conv1d``, ``Conv2d``, ``Conv3d`` and ``ConvTranspose2d``.

Weights use MegEngine's layout, so MegEngine state_dicts load as they are: ``(out, in, *kernel)``
for convolutions and ``(in, out, *kernel)`` for the transposed one, and with ``groups > 1`` a
leading groups axis, ``(groups, out // groups, in // groups, *kernel)`` (transposed:
``(groups, in // groups, out // groups, *kernel)``). Biases have MegEngine's broadcastable shape
``(1, out, 1, 1)`` (``(1, out, 1)`` for Conv1d). Initialisation is PyTorch's default (Kaiming
uniform with ``a = sqrt(5)`` over ``fan_in = in // groups * prod(kernel)``).
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.module import init
from minigrad.module.module import Module


def _tuple(value, n: int, name: str, layer: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(f"{layer}: {name} must have {n} values, got {tuple(value)}")
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _conv_parameter_counter(nd: int, transposed: bool) -> staticmethod:
    """The ``count_parameters`` of an ``nd``-d convolution layer: the number of trainable
    parameters of the layer built with these arguments, computed without building it (a pipeline
    stage partitions layers that it never builds). Its signature is the layer's constructor's."""

    def count(in_channels, out_channels, kernel_size, groups, bias) -> int:
        kernel = math.prod(_tuple(kernel_size, nd, "kernel_size", "count_parameters"))
        return in_channels * out_channels // groups * kernel + (out_channels if bias else 0)

    def count_parameters(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                         dilation=1, groups: int = 1, bias: bool = True, **kwargs) -> int:
        return count(in_channels, out_channels, kernel_size, groups, bias)

    def count_transposed_parameters(in_channels: int, out_channels: int, kernel_size, stride=1,
                                    padding=0, output_padding=0, dilation=1, groups: int = 1,
                                    bias: bool = True, **kwargs) -> int:
        return count(in_channels, out_channels, kernel_size, groups, bias)

    counter = count_transposed_parameters if transposed else count_parameters
    counter.__doc__ = _conv_parameter_counter.__doc__
    return staticmethod(counter)


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
        g = self.groups
        if self._transposed:
            per_group = (self.in_channels // g, self.out_channels // g)
        else:
            per_group = (self.out_channels // g, self.in_channels // g)
        wshape = ((g,) if g > 1 else ()) + per_group + self.kernel_size
        self.weight = Parameter(np.zeros(wshape, np.float32))
        bshape = (1, self.out_channels) + (1,) * n
        self.bias = Parameter(np.zeros(bshape, np.float32)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw fresh initial weights: Kaiming-uniform weight, ``U(+-1/sqrt(fan_in))`` bias. The fan
        is computed from the layer's sizes rather than the weight's shape, which MegEngine's grouped
        layout and a dense 3-D kernel would make ambiguous."""
        fan_in = self.in_channels // self.groups * math.prod(self.kernel_size)
        if self._transposed:
            fan_in = self.out_channels // self.groups * math.prod(self.kernel_size)
        bound = init.calculate_gain("leaky_relu", init.DEFAULT_LAYER_A) * math.sqrt(3.0 / fan_in)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
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
        """MegEngine's form: the channels and kernel size, then only the arguments that differ
        from their defaults (``Conv2d(3, 128, kernel_size=(3, 3), padding=(1, 1), bias=False)``)."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if any(v != 1 for v in self.stride):
            s += f", stride={self.stride}"
        if any(self.padding):
            s += f", padding={self.padding}"
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s if self.bias is not None else s + ", bias=False"


class Conv1d(_ConvNd):
    """1-d convolution over ``(N, C, L)`` inputs."""

    _nd = 1
    count_parameters = _conv_parameter_counter(1, transposed=False)

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

    count_parameters = _conv_parameter_counter(2, transposed=False)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)


class Conv3d(_ConvNd):
    """3-d convolution over ``(N, C, D, H, W)`` inputs."""

    _nd = 3

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv3d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-d convolution (the adjoint of ``Conv2d``; upsampling in decoders).

    ``output_padding`` adds rows/columns at the bottom/right of the output, to pick among the
    output sizes that a strided ``Conv2d`` maps onto the same input size: the output is
    ``(H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1``.

    Example::

        up = M.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        up(x).shape  # x (N, 16, 7, 7) -> (N, 8, 14, 14)
    """

    _transposed = True
    count_parameters = _conv_parameter_counter(2, transposed=True)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, dilation=1, groups: int = 1, bias: bool = True, **kwargs):
        self.output_padding = _tuple(output_padding, 2, "output_padding", "ConvTranspose2d")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv_transpose2d(x, self.weight, self.bias, stride=self.stride,
                                  padding=self.padding, output_padding=self.output_padding,
                                  dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        extra = f", output_padding={self.output_padding}" if any(self.output_padding) else ""
        return super().extra_repr() + extra


class ConvTranspose3d(_ConvNd):
    """Transposed 3-d convolution over ``(N, C, D, H, W)`` (the adjoint of ``Conv3d``). The weight
    is MegEngine's ``(in, out, kd, kh, kw)`` (grouped: ``(groups, in/groups, out/groups, kd, kh,
    kw)``); each output size is ``(size - 1) * stride - 2 * padding + dilation * (k - 1) +
    output_padding + 1``.

    Example::

        up = M.ConvTranspose3d(8, 4, 2, stride=2)
        up(x).shape  # x (N, 8, 4, 4, 4) -> (N, 4, 8, 8, 8)
    """

    _nd = 3
    _transposed = True
    count_parameters = _conv_parameter_counter(3, transposed=True)

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, dilation=1, groups: int = 1, bias: bool = True, **kwargs):
        self.output_padding = _tuple(output_padding, 3, "output_padding", "ConvTranspose3d")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        return F.conv_transpose3d(x, self.weight, self.bias, stride=self.stride,
                                  padding=self.padding, output_padding=self.output_padding,
                                  dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        extra = f", output_padding={self.output_padding}" if any(self.output_padding) else ""
        return super().extra_repr() + extra


class LocalConv2d(Module):
    """A locally connected 2-d layer: a convolution whose kernel differs at every output position
    (MegEngine's), for inputs of the fixed size ``(input_height, input_width)``. The weight is
    ``(groups, OH, OW, in/groups, kh, kw, out/groups)``; there is no bias, as in MegEngine. Each
    position's kernel starts Kaiming-uniform over its ``in/groups * kh * kw`` inputs.

    Example::

        lc = M.LocalConv2d(3, 8, 7, 7, kernel_size=3)
        lc(x).shape  # x (N, 3, 7, 7) -> (N, 8, 5, 5)
    """

    def __init__(self, in_channels: int, out_channels: int, input_height: int, input_width: int,
                 kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
                 conv_mode: str = "cross_correlation", **kwargs):
        super().__init__(**kwargs)
        layer = "LocalConv2d"
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.input_height, self.input_width = int(input_height), int(input_width)
        self.kernel_size = _tuple(kernel_size, 2, "kernel_size", layer)
        self.stride = _tuple(stride, 2, "stride", layer)
        self.padding = _tuple(padding, 2, "padding", layer)
        self.dilation = _tuple(dilation, 2, "dilation", layer)
        self.groups = int(groups)
        self.conv_mode = conv_mode
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"{layer}: in_channels ({self.in_channels}) and out_channels ({self.out_channels}) "
                f"must both be divisible by groups ({self.groups})"
            )
        out = tuple(
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip((self.input_height, self.input_width), self.kernel_size,
                                        self.stride, self.padding, self.dilation, strict=True)
        )
        g = self.groups
        shape = (g,) + out + (self.in_channels // g,) + self.kernel_size + (self.out_channels // g,)
        self.weight = Parameter(np.zeros(shape, np.float32))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-uniform (``a = sqrt(5)``, PyTorch's layer default) over each kernel's fan-in."""
        fan_in = self.in_channels // self.groups * math.prod(self.kernel_size)
        bound = init.calculate_gain("leaky_relu", init.DEFAULT_LAYER_A) * math.sqrt(3.0 / fan_in)
        init.uniform_(self.weight, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return F.local_conv2d(x, self.weight, None, stride=self.stride, padding=self.padding,
                              dilation=self.dilation, conv_mode=self.conv_mode)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, input_height={self.input_height}, "
                f"input_width={self.input_width}, kernel_size={self.kernel_size}")
