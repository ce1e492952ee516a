"""Autocast: the per-thread switch that makes the matrix products run in low precision.

Under ``with autocast():`` the ops of ``minigrad.functional`` follow one policy (the table is in
``docs/amp.md``): matrix products (``matmul``, ``linear``, convolutions, ``einsum``, attention)
round their float inputs to the low-precision dtype (float16 or bfloat16) and return it; the ops
that lose accuracy in low precision (softmax, log-softmax, losses, norms, ``exp``/``log``,
``sum``/``mean``) compute in float32; every other op runs in its inputs' dtype (mixed inputs
promote as NumPy does: float16 with float32 gives float32).

The state lives here, at the bottom of the autodiff layer, so that ``minigrad.functional`` reads
it without importing upward; ``minigrad.amp.autocast`` is this class. It is per thread, like
PyTorch's: a data-loader thread is never in autocast because the main thread is. A backward pass
always runs with autocast off (``GradManager``), so gradient ops run in the dtypes of the
recorded forward.

When autocast is off an op pays one attribute read (``AUTOCAST.enabled``).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from minigrad.backend.dtypes import is_floating, parse_extra_dtype

FLOAT32 = np.dtype(np.float32)
FLOAT16 = np.dtype(np.float16)


class _AutocastState(threading.local):
    """What the ops read: ``enabled``, ``low`` (the dtype of matrix products) and ``high`` (the
    dtype of the float32-list ops). Class attributes are the defaults of every new thread."""

    enabled = False
    low = FLOAT16
    high = FLOAT32


AUTOCAST = _AutocastState()


def _dtype(spec, what: str) -> np.dtype:
    extra = parse_extra_dtype(spec) if isinstance(spec, str) else None
    dtype = extra if extra is not None else np.dtype(spec)
    if not is_floating(dtype):
        raise ValueError(f"autocast: {what} must be a floating dtype, got {dtype.name}")
    return dtype


class autocast:  # noqa: N801 (MegEngine's and PyTorch's name)
    """Run the block (or the decorated function) with mixed precision, as ``megengine.amp.
    autocast``: matrix products in ``low_prec_dtype``, the accuracy-sensitive ops in
    ``high_prec_dtype``. ``enabled=False`` turns autocast off inside an autocast block. Blocks
    nest; leaving one restores the state before it.

    Example::

        with gm:
            with amp.autocast():                       # float16 products
                loss = F.nn.cross_entropy(net(x), y)   # loss is float32
            scaler.backward(gm, loss)

        @amp.autocast(low_prec_dtype="bfloat16")
        def forward(x): ...
    """

    def __init__(self, enabled: bool = True, low_prec_dtype="float16",
                 high_prec_dtype="float32"):
        self.enabled = bool(enabled)
        self.low_prec_dtype = _dtype(low_prec_dtype, "low_prec_dtype")
        self.high_prec_dtype = _dtype(high_prec_dtype, "high_prec_dtype")
        self._saved: list[tuple] = []

    def __enter__(self) -> "autocast":
        state = AUTOCAST
        self._saved.append((state.enabled, state.low, state.high))
        state.enabled = self.enabled
        if self.enabled:
            state.low, state.high = self.low_prec_dtype, self.high_prec_dtype
        return self

    def __exit__(self, *exc) -> bool:
        state = AUTOCAST
        state.enabled, state.low, state.high = self._saved.pop()
        return False

    def __call__(self, func):
        """Use as a decorator: every call of ``func`` runs inside this autocast."""

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return (f"autocast(enabled={self.enabled}, low_prec_dtype={self.low_prec_dtype.name}, "
                f"high_prec_dtype={self.high_prec_dtype.name})")


class autocast_off:  # noqa: N801
    """Autocast off for a block, whatever the caller set (a backward pass uses it)."""

    def __enter__(self):
        self._prev = AUTOCAST.enabled
        AUTOCAST.enabled = False
        return self

    def __exit__(self, *exc) -> bool:
        AUTOCAST.enabled = self._prev
        return False


def is_autocast_enabled() -> bool:
    """Whether ops run now follow the autocast policy (this thread)."""
    return AUTOCAST.enabled
