"""In-place parameter initialisers (``M.init``), MegEngine names plus PyTorch aliases.

Example::

    M.init.xavier_uniform_(layer.weight)
    M.init.zeros_(layer.bias)

Every random draw goes through ``mg.random.get_rng`` so initialisation is reproducible under
``mg.random.seed``. Fans follow the usual convention: for a weight ``(out, in, *kernel)``,
``fan_in = in * prod(kernel)`` and ``fan_out = out * prod(kernel)``.
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.backend.rng import get_rng

#: The ``a`` of the Kaiming-uniform initialisation Linear and Conv layers use (PyTorch's default,
#: which MegEngine's layers match): the bound ``sqrt(6 / ((1 + a^2) fan_in))`` becomes
#: ``1 / sqrt(fan_in)``, the same scale as the layers' default bias.
DEFAULT_LAYER_A = math.sqrt(5)


def _fill(tensor: Tensor, array: np.ndarray) -> Tensor:
    tensor.set_value(array.astype(tensor.dtype, copy=False))
    return tensor


def fill_(tensor: Tensor, value: float) -> Tensor:
    """Fill ``tensor`` with ``value`` in place; returns it."""
    return _fill(tensor, np.full(tensor.shape, value, dtype=tensor.dtype))


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros in place (e.g. a bias)."""
    return fill_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones in place (e.g. a normalisation scale)."""
    return fill_(tensor, 1.0)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with draws from U(a, b)."""
    return _fill(tensor, get_rng("cpu0").uniform(a, b, size=tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with draws from N(mean, std^2)."""
    return _fill(tensor, get_rng("cpu0").normal(mean, std, size=tensor.shape))


def calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight stored ``(out, in, *kernel)``.

    As in MegEngine, a weight of 5 or more dimensions is read as a grouped convolution
    ``(groups, out/groups, in/groups, *kernel)`` and its fans are per group (PyTorch's fan_out
    would count all groups). A dense 3-D convolution weight has 5 dimensions too; MegEngine's
    rule misreads it the same way, which is why the conv layers compute their own fan.
    """
    shape = tensor.shape
    if len(shape) < 2:
        raise ValueError(
            f"init: fan in/out need a weight with at least 2 dimensions, got shape {shape}"
        )
    if len(shape) >= 5:
        shape = shape[1:]
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (as in PyTorch and MegEngine)."""
    linear = {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid"}
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fan(tensor: Tensor, mode: str) -> int:
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """U(-b, b) with ``b = gain * sqrt(6 / (fan_in + fan_out))`` (Glorot & Bengio)."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """N(0, s^2) with ``s = gain * sqrt(2 / (fan_in + fan_out))`` (Glorot & Bengio)."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def msra_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                  nonlinearity: str = "leaky_relu") -> Tensor:
    """Kaiming/He uniform: U(-b, b) with ``b = gain * sqrt(3 / fan)``."""
    gain = calculate_gain(nonlinearity, a)
    bound = gain * math.sqrt(3.0 / _fan(tensor, mode))
    return uniform_(tensor, -bound, bound)


def msra_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                 nonlinearity: str = "leaky_relu") -> Tensor:
    """Kaiming/He normal: N(0, s^2) with ``s = gain / sqrt(fan)``."""
    gain = calculate_gain(nonlinearity, a)
    return normal_(tensor, 0.0, gain / math.sqrt(_fan(tensor, mode)))


kaiming_uniform_ = msra_uniform_
kaiming_normal_ = msra_normal_
