"""Normalisation layers: ``BatchNorm1d/2d``, ``SyncBatchNorm``, ``LayerNorm``, ``GroupNorm``,
``InstanceNorm``.

BatchNorm follows MegEngine: parameters and running statistics have shape ``(1, C, 1, 1)``, and in
training ``running = momentum * running + (1 - momentum) * batch`` with ``momentum=0.9`` and the
*unbiased* batch variance for ``running_var`` (``F.nn`` ``running_stats_update``, the one place
that rule is written). ``freeze=True`` (MegEngine's option for fine-tuning, e.g. detection
backbones) always normalises with the running statistics, never updates them and sends no gradient
to ``weight``/``bias``, in training too.

``SyncBatchNorm`` needs a sum over the ranks of a process group, which only the distributed runtime
can do, and ``minigrad.distributed`` sits *above* this package in the layer order (backend ->
autodiff/tensor -> functional -> module -> optimizer/data -> distributed). So this module declares
what it needs, a :class:`StatsReducer`, and uses a one-process reducer (the sum over one rank is
the tensor itself) until ``minigrad.distributed`` installs its all-reduce with
:func:`set_stats_reducer` when it is imported. Any program that has a process group has imported
``minigrad.distributed``, so ``M.SyncBatchNorm`` (MegEngine's name) works without this package ever
importing the distributed runtime: dependency inversion instead of an upward import.
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.functional.normalization import running_stats_update
from minigrad.module.module import Module


def _expect(ok: bool, layer: str, expected: str, x: Tensor) -> None:
    """Raise the layer's shape error: ``Layer(args): expected input of shape ..., got (...)``."""
    if not ok:
        raise ValueError(f"{layer}: expected input of shape {expected}, got {tuple(x.shape)}")


def affine_parameters(affine: bool, shape) -> tuple[Parameter | None, Parameter | None]:
    """The ``(weight, bias)`` of a normalisation layer: ones and zeros of ``shape``, or
    ``(None, None)`` without ``affine``."""
    if not affine:
        return None, None
    return Parameter(np.ones(shape, np.float32)), Parameter(np.zeros(shape, np.float32))


class BatchNormBase(Module):
    """What every batch normalisation shares: the affine parameters and running statistics (all
    ``(1, C, 1, 1)``), the input check, and :meth:`update_running_stats`. Subclasses say which
    input ranks they take (``input_ndims``, described by ``input_layout``); ranks other than 4 are
    normalised as ``(N, C, L, 1)``."""

    input_ndims: tuple[int, ...] = (4,)
    input_layout = "(N, C, H, W)"

    @staticmethod
    def count_parameters(num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                         affine: bool = True, track_running_stats: bool = True,
                         freeze: bool = False, **kwargs) -> int:
        """The number of trainable parameters of this layer built with these arguments, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        return 2 * num_features if affine else 0

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
        self.weight, self.bias = affine_parameters(self.affine, shape)
        if self.track_running_stats:
            self.running_mean = Tensor(np.zeros(shape, np.float32))
            self.running_var = Tensor(np.ones(shape, np.float32))
        else:
            self.running_mean = self.running_var = None

    def reset_running_stats(self) -> None:
        """Back to mean 0 and variance 1, as after construction."""
        if self.track_running_stats:
            self.running_mean.set_value(np.zeros(self.running_mean.shape, np.float32))
            self.running_var.set_value(np.ones(self.running_var.shape, np.float32))

    @property
    def uses_batch_stats(self) -> bool:
        """Whether ``forward`` normalises with the batch's statistics (in training, or always when
        no running statistics are tracked, and never when frozen) rather than the running ones."""
        return (self.training or not self.track_running_stats) and not self.freeze

    def _tracked_stats(self):
        """The running statistics ``forward`` reads and updates: none while
        ``track_running_stats`` is False, even when the layer was built with them (MegEngine lets
        the flag be switched after construction); turning it on for a layer built without them is
        an error."""
        if not self.track_running_stats:
            return None, None
        if self.running_mean is None:
            raise ValueError(f"{type(self).__name__}({self.num_features}): track_running_stats "
                             "was set to True on a layer built with track_running_stats=False, "
                             "which has no running statistics")
        return self.running_mean, self.running_var

    def update_running_stats(self, batch_mean: Tensor, batch_var: Tensor, count) -> None:
        """Fold one batch's per-channel mean and biased variance (over ``count`` values per
        channel: an int or a 0-d array on the batch's device) into the running statistics (a no-op
        when they are not tracked)."""
        if not self.track_running_stats:
            return
        mean, var = running_stats_update(self.running_mean.data, self.running_var.data,
                                         batch_mean.detach().data, batch_var.detach().data,
                                         count, self.momentum)
        self.running_mean.set_value(mean)
        self.running_var.set_value(var)

    def check_input(self, x: Tensor) -> None:
        """Raise a ValueError naming the layer unless ``x`` has an accepted rank and C channels."""
        ok = x.ndim in self.input_ndims and x.shape[1] == self.num_features
        _expect(ok, f"{type(self).__name__}({self.num_features})",
                f"{self.input_layout} with C={self.num_features}", x)

    def forward(self, x: Tensor) -> Tensor:
        self.check_input(x)
        shape = x.shape
        if x.ndim != 4:  # (N, C) or (N, C, L) -> (N, C, L, 1)
            x = x.reshape(shape[0], shape[1], math.prod(shape[2:]), 1)  # also when empty
        weight, bias = self.weight, self.bias
        if self.freeze and self.affine:  # MegEngine: statistics and affine parameters are fixed
            weight, bias = weight.detach(), bias.detach()
        running_mean, running_var = self._tracked_stats()
        y = F.batch_norm(
            x, running_mean, running_var, weight, bias,
            training=self.uses_batch_stats, momentum=self.momentum, eps=self.eps, inplace=True,
        )
        return y.reshape(shape) if len(shape) != 4 else y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(BatchNormBase):
    """Batch normalisation over ``(N, C)`` or ``(N, C, L)`` inputs.

    Example::

        bn = M.BatchNorm1d(64)
        y = bn(x)   # x (N, 64): each feature standardised over the batch, then scaled and shifted
    """

    input_ndims = (2, 3)
    input_layout = "(N, C) or (N, C, L)"
    count_parameters = staticmethod(BatchNormBase.count_parameters)


class BatchNorm2d(BatchNormBase):
    """Batch normalisation over ``(N, C, H, W)`` inputs (statistics per channel).

    Example::

        bn = M.BatchNorm2d(16)
        y = bn(x)   # x (N, 16, H, W)
    """

    count_parameters = staticmethod(BatchNormBase.count_parameters)


class StatsReducer:
    """How ``SyncBatchNorm`` sums its statistics over the ranks of a process group.

    This base class is the one-process world (``world_size`` 1, the sum of a tensor is itself);
    ``minigrad.distributed`` installs a subclass that all-reduces (see the module docstring).
    ``group`` is whatever the layer was given (None: every rank of the job).
    """

    def world_size(self, group) -> int:
        """Number of ranks whose batches the statistics cover."""
        return 1

    def sum(self, tensor: Tensor, group) -> Tensor:
        """The (differentiable) sum of ``tensor`` over the ranks of ``group``."""
        return tensor

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_stats_reducer = StatsReducer()


def set_stats_reducer(reducer: StatsReducer) -> StatsReducer:
    """Install the reducer every ``SyncBatchNorm`` uses; returns the previous one (to restore)."""
    global _stats_reducer
    if not isinstance(reducer, StatsReducer):
        raise TypeError(f"set_stats_reducer: expected a StatsReducer, got {type(reducer).__name__}")
    previous, _stats_reducer = _stats_reducer, reducer
    return previous


def get_stats_reducer() -> StatsReducer:
    """The reducer ``SyncBatchNorm`` uses now."""
    return _stats_reducer


class SyncBatchNorm(BatchNormBase):
    """BatchNorm over ``(N, C)``, ``(N, C, L)`` or ``(N, C, H, W)`` whose training statistics cover
    the batches of every rank of ``group`` (default: all ranks), MegEngine's ``M.SyncBatchNorm``.

    Per-channel mean and variance come from two differentiable sums over the ranks (of values and
    count, then of squared deviations), so the output and the gradients equal one process
    normalising the concatenated batch. Outside training, or in a one-process world, it is plain
    BatchNorm.

    Example::

        bn = M.SyncBatchNorm(16)   # inside @dist.launcher: statistics over all ranks' batches
    """

    input_ndims = (2, 3, 4)
    input_layout = "(N, C), (N, C, L) or (N, C, H, W)"

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.9,
                 affine: bool = True, track_running_stats: bool = True, group=None, **kwargs):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, **kwargs)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        reducer = _stats_reducer
        if not self.uses_batch_stats or reducer.world_size(self.group) == 1:
            return super().forward(x)
        self.check_input(x)
        shape = x.shape
        x4 = x.reshape(shape[0], shape[1], math.prod(shape[2:]), 1)
        axes = (0, 2, 3)
        local_count = Tensor(float(x4.shape[0] * x4.shape[2]), dtype=x.dtype, device=x.device)
        count = reducer.sum(local_count, self.group)
        mean = reducer.sum(x4.sum(axis=axes, keepdims=True), self.group) / count
        centered = x4 - mean
        var = reducer.sum((centered * centered).sum(axis=axes, keepdims=True), self.group) / count
        y = centered / F.sqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        self.update_running_stats(mean, var, count.detach().data)  # no wait for the GPU
        return y.reshape(shape)

    def extra_repr(self) -> str:
        group = "" if self.group is None else f", group={self.group}"
        return super().extra_repr() + group


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` axes, then scale and shift."""

    @staticmethod
    def count_parameters(normalized_shape, eps: float = 1e-5, affine: bool = True,
                         **kwargs) -> int:
        """The number of trainable parameters of this layer built with these arguments, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        return 2 * math.prod(shape) if affine else 0

    def __init__(self, normalized_shape, eps: float = 1e-5, affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        self.eps = float(eps)
        self.affine = bool(affine)
        self.weight, self.bias = affine_parameters(self.affine, self.normalized_shape)

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        ok = x.ndim >= n and tuple(x.shape[x.ndim - n:]) == self.normalized_shape
        _expect(ok, f"LayerNorm({self.normalized_shape})",
                f"(..., {', '.join(map(str, self.normalized_shape))})", x)
        return F.layer_norm(x, self.normalized_shape, affine=self.affine, weight=self.weight,
                            bias=self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, affine={self.affine}"


class GroupNorm(Module):
    """Normalise each group of ``num_channels // num_groups`` channels per sample."""

    @staticmethod
    def count_parameters(num_groups: int, num_channels: int, eps: float = 1e-5,
                         affine: bool = True, **kwargs) -> int:
        """The number of trainable parameters of this layer built with these arguments, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        return 2 * num_channels if affine else 0

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
        self.weight, self.bias = affine_parameters(self.affine, self.num_channels)

    def forward(self, x: Tensor) -> Tensor:
        _expect(x.ndim >= 2 and x.shape[1] == self.num_channels,
                f"GroupNorm({self.num_groups}, {self.num_channels})",
                f"(N, {self.num_channels}, ...)", x)
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
        c = self.num_channels
        _expect(x.ndim >= 3 and x.shape[1] == c, f"InstanceNorm({c})", f"(N, {c}, H, W)", x)
        return F.nn.instance_norm(x, self.affine, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, affine={self.affine}"
