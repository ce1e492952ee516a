"""Automatic mixed precision: MegEngine's ``megengine.amp`` (``autocast``, ``GradScaler``) with
PyTorch's spellings on the same objects, bfloat16, and float32 master weights.

* :class:`autocast` (context manager and decorator): matrix products in float16 or bfloat16,
  accuracy-sensitive ops in float32; the op table is in ``docs/amp.md``. Its state lives in
  ``minigrad.autodiff.autocast`` so that ``minigrad.functional`` reads it without importing up.
* :class:`GradScaler`: dynamic loss scaling; ranks agree on overflow; the overflow report names
  the parameters whose gradients overflowed.
* :func:`master_weights`: float32 master copies of float16/bfloat16 parameters.

This package sits above ``minigrad.distributed`` (the scaler agrees on overflow over process
groups) and below ``minigrad.testing``.

A training step with both (``import minigrad.amp as amp``) is the example of :class:`GradScaler`.
"""

from minigrad.amp.grad_scaler import (
    GradScaler,
    LossScaleCollapse,
    OverflowReport,
    OverflowWarning,
)
from minigrad.amp.master_weights import MasterWeights, master_weights
from minigrad.autodiff.autocast import autocast, is_autocast_enabled

__all__ = [
    "GradScaler",
    "LossScaleCollapse",
    "MasterWeights",
    "OverflowReport",
    "OverflowWarning",
    "autocast",
    "is_autocast_enabled",
    "master_weights",
]
