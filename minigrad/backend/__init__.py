"""Array backends: NumPy on the CPU, CuPy on NVIDIA GPUs.

Every kernel in minigrad is written once against an array module ``xp``; this package decides which
module that is for a given device or array, and keeps the CuPy import optional so that CPU-only
installs never touch CUDA. On the CPU, ``blas`` decides which library multiplies matrices (MKL
where the ``[mkl]`` extra is installed and the CPU is Intel's, else NumPy's BLAS) and
``threads`` how many threads it uses.
"""

from minigrad.backend.threads import configure_blas_waiting

configure_blas_waiting()  # before NumPy loads OpenBLAS, which reads it then (see threads.py)

from minigrad.backend.device import (  # noqa: E402
    Device,
    as_device,
    get_default_device,
    get_device_count,
    is_cuda_available,
    set_default_device,
    synchronize,
)
from minigrad.backend.threads import get_num_threads, set_num_threads  # noqa: E402
from minigrad.backend.xp import cupy_or_none, get_array_module, to_numpy  # noqa: E402

__all__ = [
    "Device",
    "as_device",
    "cupy_or_none",
    "get_array_module",
    "get_default_device",
    "get_device_count",
    "get_num_threads",
    "is_cuda_available",
    "set_default_device",
    "set_num_threads",
    "synchronize",
    "to_numpy",
]
