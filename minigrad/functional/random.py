"""Random tensors (``mg.random``), reproducible under ``seed``.

The generators themselves (one per backend, seeded together by ``seed``) are in
``minigrad.backend.rng``; this module draws tensors from them.

Example::

    mg.random.seed(0)
    x = mg.random.normal(0.0, 1.0, size=(2, 3))   # float32, on the default device
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Tensor, as_dtype, place_new_tensor
from minigrad.backend.device import as_device
from minigrad.backend.rng import get_rng, seed

__all__ = ["beta", "exponential", "gamma", "get_rng", "multinomial", "normal", "permutation",
           "poisson", "rand", "randint", "randn", "seed", "uniform"]


def _cast(arr, dtype):
    return arr.astype(as_dtype(dtype) if dtype is not None else np.float32, copy=False)


def normal(mean: float = 0.0, std: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    """Samples of the normal distribution ``N(mean, std**2)`` of shape ``size`` (a scalar when
    None)."""
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).standard_normal(size=() if size is None else size) * std + mean
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def uniform(low: float = 0.0, high: float = 1.0, size=None, dtype="float32", device=None) -> Tensor:
    """Samples of the uniform distribution on ``[low, high)`` of shape ``size`` (a scalar when
    None)."""
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).uniform(low, high, size=() if size is None else size)
        return Tensor._wrap(_cast(dev.xp.asarray(arr), dtype), dev)


def permutation(n: int, dtype="int32", device=None) -> Tensor:
    """A random permutation of ``0..n-1`` (drawn on the CPU generator, so it is the same for a
    given seed whatever the device)."""
    dev = as_device(device)
    order = get_rng("cpu0").permutation(int(n)).astype(as_dtype(dtype))
    return Tensor._wrap(dev.put(order), dev)


# -- distributions with tensor parameters (MegEngine's gamma, beta, poisson) --------------------


#: The dtype the generators read distribution parameters in. CuPy's ``Generator.beta`` (and its
#: other distributions) pass array parameters to kernels that read them as double without casting
#: them: float32 or float16 parameters would be read as garbage. NumPy casts to it anyway.
PARAM_DTYPE = np.float64


def _param_arrays(op: str, params: dict, size):
    """Broadcast the parameters (numbers or Tensors) against each other, then put ``size`` in
    front (MegEngine's rule: output shape ``size + broadcast(params)``); all must be positive.
    Returns the device, the float dtype of the result and the parameters as C-contiguous float64
    NumPy/CuPy arrays of the output shape (what the generators' kernels read, see
    :data:`PARAM_DTYPE`)."""
    dev = next((p.device for p in params.values() if isinstance(p, Tensor)), None)
    dev = as_device(dev)
    dtype = np.dtype(np.float32)
    arrays = {}
    for name, p in params.items():
        if isinstance(p, Tensor):
            if p.device != dev:
                raise RuntimeError(f"random.{op}: {name} is on {p.device}, expected {dev}")
            if p.dtype.kind == "f":
                dtype = p.dtype
            arr = p.data
        else:
            arr = dev.xp.asarray(float(p))
        if arr.size and not bool((arr > 0).all()):
            raise ValueError(f"random.{op}: {name} must be positive, got {p!r}")
        arrays[name] = arr
    shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
    lead = () if size is None else ((int(size),) if np.isscalar(size) else tuple(size))
    target = lead + shape
    xp = dev.xp
    with dev.context():
        return dev, dtype, [xp.ascontiguousarray(xp.broadcast_to(a, target), dtype=PARAM_DTYPE)
                            for a in arrays.values()]


def _draw(dev, dtype, sample) -> Tensor:
    with dev.context():
        return Tensor._wrap(sample(get_rng(dev)).astype(dtype, copy=False), dev)


def gamma(shape, scale=1, size=None) -> Tensor:
    """Gamma(k = ``shape``, theta = ``scale``) samples, density ``x^(k-1) e^(-x/theta) /
    (theta^k Gamma(k))``; parameters are positive numbers or Tensors. Output shape ``size +
    broadcast(shape, scale)`` (MegEngine's rule: ``size`` is prepended), float32 unless a
    parameter tensor is another float type.

    Example::

        mg.random.gamma(2.0, 1.0, size=(2, 2))  # mean shape * scale = 2
    """
    dev, dtype, (k, theta) = _param_arrays("gamma", {"shape": shape, "scale": scale}, size)
    return _draw(dev, dtype, lambda rng: rng.gamma(k, theta))


def beta(alpha, beta, size=None) -> Tensor:  # noqa: A002  (MegEngine's argument name)
    """Beta(``alpha``, ``beta``) samples in (0, 1); shapes as in :func:`gamma`."""
    dev, dtype, (a, b) = _param_arrays("beta", {"alpha": alpha, "beta": beta}, size)
    return _draw(dev, dtype, lambda rng: rng.beta(a, b))


def poisson(lam, size=None) -> Tensor:
    """Poisson(``lam``) counts, as floats like MegEngine (float32 unless ``lam`` is another float
    tensor); shapes as in :func:`gamma`."""
    dev, dtype, (rate,) = _param_arrays("poisson", {"lam": lam}, size)
    return _draw(dev, dtype, lambda rng: rng.poisson(rate))


def exponential(rate=1.0, size=None) -> Tensor:
    """Exponential(``rate``) samples, density ``rate * exp(-rate * x)`` for ``x > 0`` (mean
    ``1 / rate``); ``rate`` is a positive number or Tensor, shapes as in :func:`gamma`."""
    dev, dtype, (lam,) = _param_arrays("exponential", {"rate": rate}, size)
    return _draw(dev, dtype, lambda rng: rng.exponential(1.0 / lam))


def multinomial(input: Tensor, num_samples: int, replacement: bool = False) -> Tensor:  # noqa: A002
    """``num_samples`` category indices (int32) drawn from each row of ``input``, a 1-D or 2-D
    tensor of non-negative weights (each non-empty row with a positive sum), proportionally to
    the weights; ``replacement=False`` draws each index at most once. Output shape
    ``input.shape[:-1] + (num_samples,)``. Drawn on the CPU generator, like :func:`permutation`.

    Example::

        mg.random.multinomial(mg.tensor([1.0, 2.0, 3.0, 4.0]), 2)   # e.g. [3, 1]
    """
    if input.ndim not in (1, 2):
        raise ValueError(f"random.multinomial: input must be 1-D or 2-D, got shape {input.shape}")
    num_samples = int(num_samples)
    rows = np.asarray(input.numpy(), dtype=np.float64).reshape(-1, input.shape[-1])
    n = rows.shape[-1]
    if rows.size and (rows < 0).any():
        raise ValueError("random.multinomial: weights must be non-negative")
    if not replacement and num_samples > n and rows.shape[0]:
        raise ValueError(f"random.multinomial: cannot draw {num_samples} of {n} categories "
                         "without replacement")
    rng = get_rng("cpu0")
    out = np.zeros((rows.shape[0], num_samples), dtype=np.int32)
    for i, row in enumerate(rows):
        total = row.sum()
        if total <= 0:
            raise ValueError(f"random.multinomial: row {i} of the weights sums to {total}")
        out[i] = rng.choice(n, size=num_samples, replace=bool(replacement), p=row / total)
    out = out.reshape(input.shape[:-1] + (num_samples,))
    return Tensor._wrap(input.device.put(out), input.device)


# -- OneFlow/PyTorch-style factories (``mg.randn``, ``mg.rand``, ``mg.randint``) -----------------


def _size(size: tuple) -> tuple:
    """``f(2, 3)`` and ``f((2, 3))`` both mean shape (2, 3)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(n) for n in size)


def _placed(out: Tensor, placement, sbp, op: str) -> Tensor:
    """A global tensor when placement/sbp are given: the whole logical tensor was drawn from the
    seeded generator on every rank, each keeps its piece, so the logical values depend on the
    seed only, never on the SBP or the number of ranks."""
    if placement is None and sbp is None:
        return out
    return place_new_tensor(out, placement, sbp, op)


def randn(*size, dtype="float32", device=None, placement=None, sbp=None) -> Tensor:
    """Standard normal samples of shape ``size`` (``randn(2, 3)`` or ``randn((2, 3))``); a global
    tensor with ``placement`` and ``sbp`` (OneFlow's ``flow.randn``).

    Example::

        x = mg.randn(4, 5, placement=mg.placement("cpu", [0, 1]), sbp=mg.sbp.split(0))
    """
    return _placed(normal(0.0, 1.0, _size(size), dtype, device), placement, sbp, "randn")


def rand(*size, dtype="float32", device=None, placement=None, sbp=None) -> Tensor:
    """Uniform samples on [0, 1) of shape ``size``; global with ``placement`` and ``sbp``."""
    return _placed(uniform(0.0, 1.0, _size(size), dtype, device), placement, sbp, "rand")


def randint(low, high=None, size=(), dtype="int32", device=None, placement=None,
            sbp=None) -> Tensor:
    """Integers drawn uniformly from ``[low, high)`` (``randint(high, size=...)`` starts at 0);
    int32 like minigrad's other integer tensors; global with ``placement`` and ``sbp``.

    Example::

        labels = mg.randint(0, 10, (16,))
    """
    if high is None:
        low, high = 0, low
    if int(high) <= int(low):
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    dev = as_device(device)
    with dev.context():
        arr = get_rng(dev).integers(int(low), int(high), size=_size((size,)))
        out = Tensor._wrap(dev.xp.asarray(arr).astype(as_dtype(dtype)), dev)
    return _placed(out, placement, sbp, "randint")
