"""Array backends: NumPy on the CPU, CuPy on NVIDIA GPUs.

Every kernel in minigrad is written once against an array module ``xp``; this package decides which
module that is for a given device or array, and keeps the CuPy import optional so that CPU-only
installs never touch CUDA.
"""

from minigrad.backend.device import (
    Device,
    as_device,
    get_default_device,
    get_device_count,
    is_cuda_available,
    set_default_device,
    synchronize,
)
from minigrad.backend.xp import cupy_or_none, get_array_module, to_numpy

__all__ = [
    "Device",
    "as_device",
    "cupy_or_none",
    "get_array_module",
    "get_default_device",
    "get_device_count",
    "is_cuda_available",
    "set_default_device",
    "synchronize",
    "to_numpy",
]
