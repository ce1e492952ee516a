"""Normalisation layers: ``BatchNorm1d/2d``, ``LayerNorm``, ``GroupNorm``, ``InstanceNorm``.

BatchNorm follows MegEngine: parameters and running statistics have shape ``(1, C, 1, 1)``, and in
training ``running = momentum * running + (1 - momentum) * batch`` with ``momentum=0.9`` and the
*unbiased* batch variance for ``running_var``. ``freeze=True`` (MegEngine's option for fine-tuning,
e.g. detection backbones) always normalises with the running statistics, never updates them and
sends no gradient to ``weight``/``bias``, in training too.
"""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.module.module import Module
from minigrad.tensor import Parameter, Tensor


class _BatchNorm(Module):
    _ndims: tuple[int, ...] = (4,)
    _expect = "(N, C, H, W)"

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, track_running_stats: bool = True, freeze: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if freeze and not track_running_stats:
            raise ValueError(
                f"{type(self).__name__}: freeze=True needs track_running_stats=True (frozen "
                "statistics are the running ones)"
            )
        self.freeze = bool(freeze)
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        shape = (1, self.num_features, 1, 1)
        if self.affine:
            self.weight = Parameter(np.ones(shape, np.float32))
            self.bias = Parameter(np.zeros(shape, np.float32))
        else:
            self.weight = self.bias = None
        if self.track_running_stats:
            self.running_mean = Tensor(np.zeros(shape, np.float32))
            self.running_var = Tensor(np.ones(shape, np.float32))
        else:
            self.running_mean = self.running_var = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.set_value(np.zeros(self.running_mean.shape, np.float32))
            self.running_var.set_value(np.ones(self.running_var.shape, np.float32))

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._ndims or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}): expected input of shape "
                f"{self._expect} with C={self.num_features}, got {tuple(x.shape)}"
            )
        shape = x.shape
        if x.ndim != 4:  # BatchNorm1d: (N, C) or (N, C, L) -> (N, C, L, 1)
            x = x.reshape(shape[0], shape[1], -1, 1)
        use_batch_stats = (self.training or not self.track_running_stats) and not self.freeze
        weight, bias = self.weight, self.bias
        if self.freeze and self.affine:  # MegEngine: statistics and affine parameters are fixed
            weight, bias = weight.detach(), bias.detach()
        y = F.batch_norm(
            x, self.running_mean, self.running_var, weight, bias,
            training=use_batch_stats, momentum=self.momentum, eps=self.eps, inplace=True,
        )
        return y.reshape(shape) if len(shape) != 4 else y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over ``(N, C)`` or ``(N, C, L)`` inputs."""

    _ndims = (2, 3)
    _expect = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over ``(N, C, H, W)`` inputs (statistics per channel)."""


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` axes, then scale and shift."""

    def __init__(self, normalized_shape, eps: float = 1e-5, affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        self.eps = float(eps)
        self.affine = bool(affine)
        if self.affine:
            self.weight = Parameter(np.ones(self.normalized_shape, np.float32))
            self.bias = Parameter(np.zeros(self.normalized_shape, np.float32))
        else:
            self.weight = self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if tuple(x.shape[x.ndim - n:]) != self.normalized_shape or x.ndim < n:
            raise ValueError(
                f"LayerNorm({self.normalized_shape}): expected input of shape "
                f"(..., {', '.join(map(str, self.normalized_shape))}), got {tuple(x.shape)}"
            )
        return F.layer_norm(x, self.normalized_shape, affine=self.affine, weight=self.weight,
                            bias=self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, affine={self.affine}"


class GroupNorm(Module):
    """Normalise each group of ``num_channels // num_groups`` channels per sample."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_groups = int(num_groups)
        self.num_channels = int(num_channels)
        if self.num_channels % self.num_groups:
            raise ValueError(
                f"GroupNorm: num_channels ({self.num_channels}) must be divisible by num_groups "
                f"({self.num_groups})"
            )
        self.eps = float(eps)
        self.affine = bool(affine)
        if self.affine:
            self.weight = Parameter(np.ones(self.num_channels, np.float32))
            self.bias = Parameter(np.zeros(self.num_channels, np.float32))
        else:
            self.weight = self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"GroupNorm({self.num_groups}, {self.num_channels}): expected input of shape "
                f"(N, {self.num_channels}, ...), got {tuple(x.shape)}"
            )
        return F.group_norm(x, self.num_groups, affine=self.affine, weight=self.weight,
                            bias=self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class InstanceNorm(GroupNorm):
    """Normalise each channel of each sample over its spatial axes, then scale and shift per
    channel: ``GroupNorm`` with one group per channel (no running statistics).

    Example::

        norm = M.InstanceNorm(3)
        norm(x)  # x (N, 3, H, W): every (n, c) plane gets mean 0 and variance 1
    """

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True, **kwargs):
        super().__init__(num_channels, num_channels, eps, affine, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"InstanceNorm({self.num_channels}): expected input of shape "
                f"(N, {self.num_channels}, H, W), got {tuple(x.shape)}"
            )
        return F.nn.instance_norm(x, self.affine, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, affine={self.affine}"
