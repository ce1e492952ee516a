"""Small helpers shared by the functional modules: argument coercion and array access."""

from __future__ import annotations

import numbers

import numpy as np

from minigrad.autodiff.autocast import thread_policy
from minigrad.autodiff.recording import is_recording
from minigrad.autodiff.tensor import Tensor, as_dtype
from minigrad.backend.dtypes import SEEN, float_sum, is_bfloat16, is_floating
from minigrad.config import default_compute_mode

FLOAT32 = np.dtype(np.float32)
FLOAT16 = np.dtype(np.float16)
#: MegEngine's ``compute_mode`` values (any letter case): "default" computes in the inputs' dtype,
#: "float32" computes float16 inputs in float32 (sums of many float16 products lose digits).
COMPUTE_MODES = ("default", "float32")


def as_tensor(x, like: Tensor | None = None, dtype=None) -> Tensor:
    """Turn ``x`` into a Tensor on ``like``'s device (Tensors pass through untouched)."""
    if isinstance(x, Tensor):
        return x
    return Tensor(x, dtype=dtype, device=like._device if like is not None else None)


def binary_args(a, b, op: str, broadcast: bool = True):
    """Coerce the operands of a binary op.

    Tensor (+) Tensor follows NumPy promotion; Tensor (+) Python scalar keeps the tensor dtype
    (the scalar stays a Python number, which NumPy and CuPy treat as weakly typed), except that an
    integer tensor meeting a float scalar becomes float32. Arrays and lists become tensors on the
    tensor's device. Elementwise ops (``broadcast=True``) also get their shapes checked here.
    """
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    if ta and tb:
        if a._device is not b._device or a._data.shape != b._data.shape:  # else nothing to check
            check_compatible(op, a, b, broadcast=broadcast)
        return a, b
    if not ta and not tb:
        a = as_tensor(a)
        ta = True
    t, s = (a, b) if ta else (b, a)
    if (s.__class__ is float or s.__class__ is int) and t._data.dtype.kind == "f":
        return a, b  # a float tensor and a Python number stay as they are (``x * 0.5``): the
        # general test below (``numbers.Number``, an abstract class) costs 0.3 us
    if s is None:
        raise TypeError(f"{op}: unsupported operand None (expected a Tensor, an array or a number)")
    if isinstance(s, numbers.Number) and not isinstance(s, np.ndarray):
        if isinstance(s, (float, np.floating)) and not is_floating(t._data.dtype):
            t = t.astype(FLOAT32)
        if isinstance(s, np.generic):
            s = s.item()
        if t._data.dtype.kind == "V" and is_floating(t._data.dtype):
            # bfloat16 (ml_dtypes) promotes a Python float to float32: keep the tensor's dtype
            s = t.xp.asarray(s, dtype=t._data.dtype)
    else:
        s = Tensor(s, device=t._device)
        check_compatible(op, *((t, s) if ta else (s, t)), broadcast=broadcast)
    return (t, s) if ta else (s, t)


def check_compatible(op: str, *tensors: Tensor, broadcast: bool = True) -> None:
    """Raise a clear error naming ``op`` when tensors sit on different devices or their shapes do
    not broadcast (rather than a raw NumPy/CuPy message from deep inside the kernel)."""
    first = tensors[0]
    for t in tensors[1:]:
        if t._device != first._device:
            raise RuntimeError(
                f"{op}: operands are on different devices: {first.shape} {first.dtype} on "
                f"{first._device} and {t.shape} {t.dtype} on {t._device}; move one with .to(device)"
            )
    shapes = [t.shape for t in tensors]
    if broadcast and any(s != shapes[0] for s in shapes[1:]):
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            listed = " and ".join(str(s) for s in shapes)
            raise ValueError(f"{op}: shapes {listed} cannot be broadcast") from None


def accumulate_dtype(dtype) -> np.dtype:
    """The result dtype of sum/prod/cumsum: floats and 32/64-bit ints keep theirs (NumPy would widen
    int32 to int64); bool and 8/16-bit ints accumulate in int32 so they do not overflow at once."""
    dtype = np.dtype(dtype)
    if is_floating(dtype) or (dtype.kind in "iu" and dtype.itemsize >= 4):
        return dtype
    return np.dtype(np.int32)


def compute_mode_inputs(op: str, compute_mode: str, *tensors: Tensor):
    """Apply MegEngine's ``compute_mode`` to the inputs of a matrix product or convolution.

    Returns ``(tensors, result_dtype)``: with ``"float32"`` and any float16 input, the inputs cast
    to float32 and float16 as the dtype to cast the result back to; otherwise the inputs unchanged
    and None. Any other mode is an error naming the op (it used to be accepted and ignored).
    bfloat16 inputs always compute in float32 (NumPy has no bfloat16 product) and the result is
    rounded to bfloat16. ``"default"`` follows ``mg.config.compute_mode`` ("default" unless a
    program sets it).
    """
    if compute_mode == "default":  # the common case, on every matmul: one dict lookup
        compute_mode = default_compute_mode()  # mg.config.compute_mode
    if compute_mode == "default":
        if not SEEN.bfloat16:
            return tensors, None
        for t in tensors:
            if t._data.dtype.kind == "V" and is_bfloat16(t._data.dtype):
                return tuple(x.astype(FLOAT32) for x in tensors), t._data.dtype
        return tensors, None
    mode = str(compute_mode).lower()
    if mode not in COMPUTE_MODES:
        raise ValueError(
            f"{op}: compute_mode must be 'default' or 'float32', got {compute_mode!r}"
        )
    if mode == "float32" and any(t.dtype == FLOAT16 for t in tensors):
        return tuple(t.astype(FLOAT32) for t in tensors), FLOAT16
    return tensors, None


def autocast_low(op: str, *tensors):
    """The inputs of a matrix product (``linear``, ``matmul``, a convolution, attention) under
    autocast: float32 and low-precision float inputs are rounded to the thread's ``low`` dtype;
    the caller checked ``AUTOCAST.enabled``. Returns ``(tensors, result_dtype)`` like
    :func:`compute_mode_inputs`: the caller computes with the returned tensors and casts its result
    to ``result_dtype`` when it is not None.

    On the CPU NumPy has no fast float16 product and no bfloat16 one at all, so the rounded inputs
    go back to float32, the product accumulates in float32 and the result is rounded to the low
    dtype (what tensor cores do: low-precision inputs, float32 accumulation). On a GPU float16
    inputs go to CuPy's float16 product (cuBLAS); bfloat16 is refused there (CuPy has no
    bfloat16 arrays). Others (None, integers, float64) pass unchanged.
    """
    policy = thread_policy()
    if policy is None:  # another thread is in autocast, not this one
        return tensors, None
    low = policy.low
    out = []
    on_cpu, cast = True, False
    for t in tensors:
        if isinstance(t, Tensor) and is_floating(t.dtype) and t.dtype.itemsize <= 4:
            on_cpu = t._device.kind == "cpu"
            if not on_cpu and is_bfloat16(low):
                raise TypeError(
                    f"{op}: autocast to bfloat16 on {t._device}: CuPy has no bfloat16 arrays; "
                    "use low_prec_dtype='float16' on a GPU"
                )
            if t.dtype != low:
                t = t.astype(low)
            if on_cpu:
                t = t.astype(FLOAT32)
            cast = True
        out.append(t)
    return tuple(out), (low if cast and on_cpu else None)


def autocast_high(*tensors):
    """The inputs of an op on autocast's float32 list (softmax, losses, norms, ``exp``/``log``,
    ``sum``/``mean``): low-precision float inputs are cast to the thread's ``high`` dtype; the
    caller checked ``AUTOCAST.enabled``. Other inputs pass unchanged."""
    policy = thread_policy()
    if policy is None:  # another thread is in autocast, not this one
        return tensors
    high = policy.high
    return tuple(
        t.astype(high) if isinstance(t, Tensor) and is_floating(t.dtype)
        and t.dtype.itemsize < high.itemsize else t
        for t in tensors
    )


def data(x):
    """The backend array of a Tensor, or ``x`` itself for constants."""
    return x._data if isinstance(x, Tensor) else x


def recording_backward() -> bool:
    """True inside a backward whose ops are being recorded for a higher-order gradient."""
    return is_recording()


def normalize_axis(axis, ndim: int, op: str, unique: bool = False):
    """Axis (int, tuple, 0-d/1-d Tensor or None) -> tuple of non-negative ints; a clear error when
    out of range, or (``unique``, for reductions) when two entries name the same axis."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, Tensor):  # MegEngine accepts an axis given as a Tensor
        axis = axis.numpy().tolist()
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
        if unique and a % max(ndim, 1) in out:
            raise ValueError(f"{op}: axis {axis} names axis {a % max(ndim, 1)} twice")
        out.append(a % max(ndim, 1))
    return tuple(out)


def ntuple(value, n: int, name: str, op: str, cast=int) -> tuple:
    """An op's per-axis argument: ``3`` -> ``(3,) * n``, a sequence (or Tensor) of ``n`` values
    stays; another length is an error naming the op and the argument."""
    if isinstance(value, Tensor):
        value = value.numpy().tolist()
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(f"{op}: {name} must be a number or {n} of them, got {value!r}")
        return tuple(cast(v) for v in value)
    return (cast(value),) * n


__all__ = [
    "as_dtype",
    "as_tensor",
    "binary_args",
    "accumulate_dtype",
    "float_sum",
    "autocast_high",
    "autocast_low",
    "check_compatible",
    "compute_mode_inputs",
    "data",
    "normalize_axis",
    "ntuple",
    "recording_backward",
]
