"""``minigrad.backend.device_api``: MegEngine's ``megengine.device`` module (device discovery, the
default device, memory status), for code that imports it by that name.

The device model itself lives in :mod:`minigrad.backend.device`; the functions that MegEngine also
exposes at top level (``get_device_count``, ``is_cuda_available``, ``get_default_device``,
``set_default_device``) are the same objects as ``mg.<name>``. GPU queries go through CuPy and
raise a clear error on a machine without CUDA. MegEngine's ROCm/Cambricon/Atlas devices do not
exist here (always unavailable), and neither do its allocator tuning knobs.

Example::

    import minigrad.backend.device_api as device
    if device.is_cuda_available():
        total, free = device.get_mem_status_bytes("gpu0")
"""

from __future__ import annotations

import os

from minigrad.backend import device as _backend
from minigrad.backend.xp import cupy_or_none

as_device = _backend.as_device
get_default_device = _backend.get_default_device
get_device_count = _backend.get_device_count
is_cuda_available = _backend.is_cuda_available
set_default_device = _backend.set_default_device

__all__ = [
    "coalesce_free_memory",
    "get_allocated_memory",
    "get_cuda_compute_capability",
    "get_cuda_device_property",
    "get_cuda_driver_version",
    "get_cuda_version",
    "get_cudnn_version",
    "get_default_device",
    "get_device_count",
    "get_max_allocated_memory",
    "get_mem_status_bytes",
    "get_reserved_memory",
    "is_atlas_available",
    "is_cambricon_available",
    "is_cuda_available",
    "is_rocm_available",
    "reset_max_memory_stats",
    "set_default_device",
    "what_is_xpu",
]


def is_cambricon_available() -> bool:
    """False: minigrad has no Cambricon backend."""
    return False


def is_atlas_available() -> bool:
    """False: minigrad has no Atlas backend."""
    return False


def is_rocm_available() -> bool:
    """False: minigrad has no ROCm backend."""
    return False


def what_is_xpu() -> str:
    """The device type ``xpux`` resolves to: ``"cuda"`` when CuPy sees a GPU, else ``"cpu"``."""
    return "cuda" if is_cuda_available() else "cpu"


def _cuda(what: str):
    cp = cupy_or_none()
    if cp is None or not is_cuda_available():
        raise RuntimeError(f"{what} needs CuPy and a CUDA device, and this machine has none")
    return cp


def _gpu(device, what: str):
    dev = as_device(device)  # None: the default device
    if dev.kind != "gpu":
        raise ValueError(
            f"{what}: {dev} is a CPU device; minigrad keeps no memory pool on the CPU (NumPy "
            "allocates directly), so only GPU devices have these statistics"
        )
    return dev


def get_mem_status_bytes(device=None) -> tuple[int, int]:
    """``(total, free)`` bytes of the memory of ``device`` (default: the default device): the
    GPU's memory, or the host's physical memory for a CPU device."""
    dev = as_device(device)  # None: the default device
    if dev.kind == "cpu":
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    cp = _cuda("get_mem_status_bytes")
    with dev.context():
        free, total = cp.cuda.runtime.memGetInfo()
    return int(total), int(free)


def _tracemalloc():
    """Python's ``tracemalloc``, imported when host memory is first asked about (it is rarely
    needed, and ``import minigrad`` should not pay for it)."""
    import tracemalloc

    return tracemalloc


def _host_tracing(what: str) -> None:
    if not _tracemalloc().is_tracing():
        raise RuntimeError(
            f"{what}: host memory is counted by tracemalloc, which is off; call "
            "mg.device.reset_max_memory_stats('cpu0') (or run a Profiler with "
            "profile_memory=True) to start counting"
        )


def reset_max_memory_stats(device=None) -> None:
    """Start the peak of :func:`get_max_allocated_memory` afresh. On a CPU device this starts
    Python's ``tracemalloc`` if it is not running (NumPy reports its array memory to it; counting
    costs time, so it is off until asked for)."""
    dev = as_device(device)
    if dev.kind != "cpu":
        raise ValueError(f"reset_max_memory_stats: {dev}: peaks are kept for the host only; "
                         "sample get_allocated_memory on a GPU")
    tracemalloc = _tracemalloc()
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    tracemalloc.reset_peak()


def get_max_allocated_memory(device=None) -> int:
    """The most bytes live arrays held on a CPU ``device`` since
    :func:`reset_max_memory_stats` (Python objects included: tracemalloc counts every
    allocation of the process)."""
    dev = as_device(device)
    if dev.kind != "cpu":
        raise ValueError(f"get_max_allocated_memory: {dev}: peaks are kept for the host only; "
                         "sample get_allocated_memory on a GPU")
    _host_tracing("get_max_allocated_memory")
    return _tracemalloc().get_traced_memory()[1]


def get_allocated_memory(device=None) -> int:
    """Bytes held by live arrays: in CuPy's memory pool on a GPU ``device``; on a CPU device
    the bytes tracemalloc counts (after :func:`reset_max_memory_stats` started it)."""
    if as_device(device).kind == "cpu":
        _host_tracing("get_allocated_memory")
        return _tracemalloc().get_traced_memory()[0]
    dev = _gpu(device, "get_allocated_memory")
    cp = _cuda("get_allocated_memory")
    with dev.context():
        return int(cp.get_default_memory_pool().used_bytes())


def get_reserved_memory(device=None) -> int:
    """Bytes CuPy's memory pool holds on a GPU ``device`` (in use plus cached for reuse)."""
    dev = _gpu(device, "get_reserved_memory")
    cp = _cuda("get_reserved_memory")
    with dev.context():
        return int(cp.get_default_memory_pool().total_bytes())


def coalesce_free_memory() -> None:
    """Give the cached, unused GPU blocks of CuPy's memory pools back to the driver (a no-op
    without CUDA)."""
    cp = cupy_or_none()
    if cp is not None and is_cuda_available():
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


def get_cuda_compute_capability(device: int) -> int:
    """The SM version of GPU ``device`` as ``major * 10 + minor`` (e.g. 80 for an A100)."""
    cp = _cuda("get_cuda_compute_capability")
    return int(cp.cuda.Device(int(device)).compute_capability)


def get_cuda_device_property(device: int) -> dict:
    """CUDA's device properties of GPU ``device`` (name, totalGlobalMem, major, minor, ...)."""
    cp = _cuda("get_cuda_device_property")
    return cp.cuda.runtime.getDeviceProperties(int(device))


def get_cuda_version() -> int:
    """The CUDA runtime version CuPy uses, ``major * 1000 + minor * 10``."""
    return int(_cuda("get_cuda_version").cuda.runtime.runtimeGetVersion())


def get_cuda_driver_version() -> int:
    """The CUDA driver's version, ``major * 1000 + minor * 10``."""
    return int(_cuda("get_cuda_driver_version").cuda.runtime.driverGetVersion())


def get_cudnn_version() -> int:
    """cuDNN's version as CuPy sees it (minigrad's kernels do not need cuDNN)."""
    _cuda("get_cudnn_version")
    try:
        from cupy.cuda import cudnn  # noqa: PLC0415  (optional part of CuPy)
    except ImportError as exc:
        raise RuntimeError(f"get_cudnn_version: cuDNN is not available to CuPy ({exc})") from None
    return int(cudnn.getVersion())
