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

When no thread is in autocast an op pays one slot read (``AUTOCAST.enabled``, a process-wide
flag); the per-thread policy (:func:`thread_policy`) is read only while some thread is in it.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from minigrad.backend.dtypes import is_floating, parse_extra_dtype

FLOAT32 = np.dtype(np.float32)
FLOAT16 = np.dtype(np.float16)


class _ThreadPolicy(threading.local):
    """This thread's autocast: ``enabled``, ``low`` (the dtype of matrix products) and ``high``
    (the dtype of the float32-list ops). Class attributes are the defaults of every new thread."""

    enabled = False
    low = FLOAT16
    high = FLOAT32


class _Switch:
    """The process-wide flag the ops test first: ``enabled`` is True while some thread is in
    autocast. A plain slot read (~5 ns) where a ``threading.local`` read costs ~50 ns, so ops
    pay almost nothing while no thread uses autocast; the per-thread policy is read only then."""

    __slots__ = ("enabled", "_threads", "_lock")

    def __init__(self):
        self.enabled = False
        self._threads = 0  # threads whose policy is enabled now
        self._lock = threading.Lock()

    def _set(self, on: bool) -> None:
        """Switch this thread's policy on or off, keeping the count of threads in autocast."""
        if POLICY.enabled == on:
            return
        with self._lock:
            POLICY.enabled = on
            self._threads += 1 if on else -1
            self.enabled = self._threads > 0


POLICY = _ThreadPolicy()
#: What an op tests: ``if AUTOCAST.enabled:`` (then :func:`thread_policy` says what to do).
AUTOCAST = _Switch()


def thread_policy() -> _ThreadPolicy | None:
    """This thread's autocast policy (``.low``, ``.high``), or None when this thread is not in
    autocast (another one may be)."""
    policy = POLICY
    return policy if policy.enabled else None


def _dtype(spec, what: str) -> np.dtype:
    extra = parse_extra_dtype(spec) if isinstance(spec, str) else None
    dtype = extra if extra is not None else np.dtype(spec)
    if not is_floating(dtype):
        raise ValueError(f"autocast: {what} must be a floating dtype, got {dtype.name}")
    return dtype


class autocast(contextlib.ContextDecorator):  # noqa: N801 (MegEngine's and PyTorch's name)
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
        policy = POLICY
        self._saved.append((policy.enabled, policy.low, policy.high))
        if self.enabled:
            policy.low, policy.high = self.low_prec_dtype, self.high_prec_dtype
        AUTOCAST._set(self.enabled)
        return self

    def __exit__(self, *exc) -> bool:
        enabled, POLICY.low, POLICY.high = self._saved.pop()
        AUTOCAST._set(enabled)
        return False

    def __repr__(self) -> str:
        return (f"autocast(enabled={self.enabled}, low_prec_dtype={self.low_prec_dtype.name}, "
                f"high_prec_dtype={self.high_prec_dtype.name})")


class autocast_off:  # noqa: N801
    """Autocast off for a block, whatever the caller set (a backward pass uses it)."""

    def __enter__(self):
        self._prev = POLICY.enabled
        AUTOCAST._set(False)
        return self

    def __exit__(self, *exc) -> bool:
        AUTOCAST._set(self._prev)
        return False


def is_autocast_enabled() -> bool:
    """Whether ops run now follow the autocast policy (this thread)."""
    return POLICY.enabled
