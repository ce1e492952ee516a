"""The floating dtypes minigrad knows beyond NumPy's own: ``bfloat16``.

NumPy has float16, float32 and float64 but no bfloat16 (8 exponent bits like float32, 7 mantissa
bits). The ``ml_dtypes`` package (an optional dependency: ``pip install minigrad[bf16]``)
registers one with NumPy: arrays of it cast, add, multiply, compare and reduce like any float
array, but its dtype ``kind`` is ``"V"`` (a user dtype), not ``"f"``. So minigrad asks
:func:`is_floating` wherever it means "does this dtype carry gradients", and never
``dtype.kind == "f"`` alone.

CuPy has no bfloat16 arrays, so on a GPU bfloat16 is refused with a clear error (see
``docs/amp.md``).
"""

from __future__ import annotations

import numpy as np

#: The low-precision floating dtypes that are not NumPy kind ``"f"``, by name.
EXTRA_FLOAT_NAMES = frozenset({"bfloat16"})

_BFLOAT16: np.dtype | None = None


class _Seen:
    """``SEEN.bfloat16`` turns True the first time minigrad meets a bfloat16 dtype (asked for by
    name, or found on an array or an op's input). Until then the matrix products skip their
    bfloat16 test: one slot read instead of two dtype lookups per call."""

    __slots__ = ("bfloat16",)

    def __init__(self):
        self.bfloat16 = False


SEEN = _Seen()


def bfloat16() -> np.dtype:
    """NumPy's bfloat16 dtype from ``ml_dtypes`` (imported on first use, so that float32-only
    programs never load it); an ImportError saying how to install it when it is missing."""
    global _BFLOAT16
    if _BFLOAT16 is None:
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(
                "dtype bfloat16 needs the ml_dtypes package (NumPy has no bfloat16): "
                "pip install ml_dtypes  (or minigrad[bf16])"
            ) from None
        _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
        SEEN.bfloat16 = True
    return _BFLOAT16


def is_floating(dtype) -> bool:
    """Whether ``dtype`` (an ``np.dtype``) is a floating dtype: NumPy's float16/32/64 or
    bfloat16. Only such tensors get gradients."""
    kind = dtype.kind
    if kind == "f":
        return True
    if kind == "V" and dtype.name in EXTRA_FLOAT_NAMES:
        SEEN.bfloat16 = True
        return True
    return False


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is ``ml_dtypes.bfloat16`` (without importing ml_dtypes)."""
    return dtype.kind == "V" and is_floating(dtype)


def parse_extra_dtype(name: str) -> np.dtype | None:
    """The dtype named ``name`` when it is one NumPy does not know by itself (``"bfloat16"``,
    ``"bf16"``); None for every other name."""
    if name in ("bfloat16", "bf16"):
        return bfloat16()
    return None


def finfo(dtype):
    """``np.finfo`` for NumPy's floats, ``ml_dtypes.finfo`` for bfloat16 (``np.finfo`` refuses
    it): the largest value, eps and the smallest normal of a floating dtype."""
    dtype = np.dtype(dtype)
    if is_bfloat16(dtype):
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def as_float_dtype(spec, where: str) -> np.dtype:
    """``spec`` (a name such as ``"float16"``/``"bfloat16"``, or a dtype) as a floating
    ``np.dtype``; a ValueError naming ``where`` and what it got otherwise (settings such as
    ``reduce_dtype=`` and ``param_dtype=`` use it)."""
    extra = parse_extra_dtype(spec) if isinstance(spec, str) else None
    try:
        dtype = extra if extra is not None else np.dtype(spec)
    except TypeError:
        raise ValueError(f"{where} must be a floating dtype, got {spec!r}") from None
    if not is_floating(dtype):
        raise ValueError(f"{where} must be a floating dtype, got {dtype.name}")
    return dtype


def float_sum(xp, d, axis=None, keepdims: bool = False):
    """``d.sum(axis)`` of a float array, with float16 and bfloat16 accumulated in float32 and the
    result rounded to their dtype (what GPUs do). ml_dtypes' bfloat16 sum adds in bfloat16: 50,000
    values in [0, 1) sum to 256, so gradient sums over a batch (bias gradients, broadcasts'
    adjoints) would stall."""
    if d.dtype.itemsize < 4 and is_floating(d.dtype):
        return xp.sum(d, axis=axis, keepdims=keepdims, dtype=np.float32).astype(d.dtype)
    return d.sum(axis=axis, keepdims=keepdims)
