"""Device names and objects.

Names follow MegEngine: ``cpu0``, ``gpu0``..``gpuN``, and the wildcards ``xpux`` (a GPU when CuPy
sees a CUDA device, else the CPU), ``cpux`` and ``gpux``. A :class:`Device` knows its array module,
how to move arrays onto itself, and how to make itself CUDA's current device: CuPy launches every
kernel and allocates every array on the *current* device, so code that works on a ``gpuN`` tensor
runs inside ``device.context()`` (ops do that in ``Function.__call__``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import sys
import warnings

import numpy as np

from minigrad import seams
from minigrad.backend.device_checks import raise_deferred_errors
from minigrad.backend.dtypes import is_bfloat16
from minigrad.backend.transfer import host_to_device
from minigrad.backend.xp import (
    cupy_import_error,
    cupy_is_stand_in,
    cupy_or_none,
    is_cupy_array,
)

_NAME = re.compile(r"^(cpu|gpu|xpu|cuda)(\d+|x)?(?::\d+)?$")


#: Where the NVIDIA driver lists one entry per GPU; reading it does not initialise CUDA.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"
#: CUDA's answer when the machine simply has no GPU (not an error worth reporting).
CUDA_ERROR_NO_DEVICE = 100


class GpuProbe:
    """How many CUDA devices this process can use, and why there are none when there are none
    (``reason``; ``failed`` when that is an error rather than a machine without GPUs).

    Counting goes through the operating system first (``CUDA_VISIBLE_DEVICES``, then the driver's
    ``/proc`` entries), because asking CUDA itself (``cudaGetDeviceCount``) initialises the CUDA
    driver, after which a forked child can no longer use the GPU: resolving ``xpux`` in a parent
    that is about to launch GPU workers must not do that. Where the operating system cannot tell
    (no ``/proc`` entries, e.g. WSL) CUDA is asked in a short-lived subprocess, or in this process
    once CUDA is initialised here anyway. A CUDA error is kept as ``reason`` (and shown by every
    GPU request) rather than read as "0 GPUs" without a word.
    """

    def __init__(self, count: int, reason: str | None = None, failed: bool = False):
        self.count = count
        self.reason = reason
        self.failed = failed

    def __repr__(self) -> str:
        return f"GpuProbe(count={self.count}, reason={self.reason!r}, failed={self.failed})"


_probe: GpuProbe | None = None


def probe_gpus() -> GpuProbe:
    """Count the usable CUDA devices once per process (see :class:`GpuProbe`)."""
    global _probe
    if _probe is None:
        _probe = _count_gpus()
    return _probe


def _count_gpus() -> GpuProbe:
    cp = cupy_or_none()
    if cp is None:
        error = cupy_import_error() or ""
        # not installed is a CPU-only machine; installed but failing to load is a problem
        return GpuProbe(0, f"CuPy could not be imported ({error})",
                        failed=not error.startswith("ModuleNotFoundError: No module named 'cupy'"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid entry such as "-1": only the ones before it count
        n = next((i for i, v in enumerate(ids) if v.startswith("-")), len(ids))
        return GpuProbe(n, None if n else f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
    if os.path.isdir(NVIDIA_GPUS_DIR):
        try:
            n = len(os.listdir(NVIDIA_GPUS_DIR))
        except OSError as exc:
            return GpuProbe(0, f"cannot count GPUs: {NVIDIA_GPUS_DIR} is unreadable "
                               f"({exc.strerror}); set CUDA_VISIBLE_DEVICES to choose the GPUs "
                               "explicitly", failed=True)
        return GpuProbe(n, None if n else f"the NVIDIA driver lists no GPU in {NVIDIA_GPUS_DIR}")
    if not cuda_initialized():
        return count_gpus_in_subprocess()
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except cp.cuda.runtime.CUDARuntimeError as exc:
        if getattr(exc, "status", None) == CUDA_ERROR_NO_DEVICE:
            return GpuProbe(0, "CUDA reports no device")
        return GpuProbe(0, f"CUDA failed while counting devices: {exc}", failed=True)
    return GpuProbe(n, None if n else "CUDA reports no device")


#: What a fresh interpreter runs to count the GPUs for :func:`count_gpus_in_subprocess`.
COUNT_GPUS_SCRIPT = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
#: Seconds allowed for that interpreter (CUDA's initialisation can take several seconds).
COUNT_GPUS_TIMEOUT = 120


def count_gpus_in_subprocess() -> GpuProbe:
    """Ask CUDA for the number of devices in a fresh Python process, leaving CUDA uninitialised
    in this one (so that it can still fork GPU workers); its error, if any, becomes the reason."""
    try:
        proc = subprocess.run([sys.executable, "-c", COUNT_GPUS_SCRIPT], capture_output=True,
                              text=True, timeout=COUNT_GPUS_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuProbe(0, f"cannot count GPUs in a subprocess ({exc})", failed=True)
    if proc.returncode == 0 and proc.stdout.strip().isdigit():
        n = int(proc.stdout.strip())
        return GpuProbe(n, None if n else "CUDA reports no device")
    lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit code {proc.returncode}"]
    if "cudaErrorNoDevice" in lines[-1]:
        return GpuProbe(0, "CUDA reports no device")
    return GpuProbe(0, f"CUDA failed while counting devices: {lines[-1]}", failed=True)


def is_cuda_available() -> bool:
    """True when CuPy is installed and at least one CUDA device is visible (without initialising
    CUDA where the operating system can tell; see :class:`GpuProbe`)."""
    return get_device_count("gpu") > 0


def get_device_count(device_type: str = "gpu") -> int:
    """Number of devices of a kind: ``"gpu"`` counts CUDA devices, ``"cpu"`` is always 1 (one
    NumPy device using every core), ``"xpu"`` counts what ``xpux`` resolves to (the GPUs, else
    the CPU); MegEngine's other accelerators (``"rocm"``, ``"cambricon"``, ``"atlas"``) have no
    backend here and count 0.

    Example::

        mg.get_device_count("gpu")   # 0 on a CPU-only machine; probe_gpus().reason says why
    """
    if device_type == "cpu":
        return 1
    if device_type == "xpu":
        return get_device_count("gpu") or 1
    if device_type in ("rocm", "cambricon", "atlas"):
        return 0
    if device_type not in ("gpu", "cuda"):
        raise ValueError(
            f"get_device_count: unknown device type {device_type!r}, expected 'gpu', 'cpu' or "
            "'xpu'"
        )
    return probe_gpus().count


class Device:
    """A concrete device: ``Device("cpu", 0)`` or ``Device("gpu", 1)``.

    Equality and hashing go by name so devices can key dicts; ``str(dev)`` is MegEngine's name.
    """

    __slots__ = ("kind", "index", "_xp", "_context")

    def __init__(self, kind: str, index: int = 0):
        self.kind = kind
        self.index = index
        if kind == "cpu":
            self._xp = np
            self._context = _NULL_CONTEXT
        else:
            self._xp = _require_cupy(f"gpu{index}")
            n = probe_gpus().count
            if index >= n:
                raise RuntimeError(
                    f"device gpu{index} requested but only {n} CUDA device(s) are visible"
                )
            # CuPy keeps the devices saved by ``with`` per thread: one object serves every thread
            self._context = _FirstEntry(self, self._xp.cuda.Device(index))

    @property
    def xp(self):
        """The array module (numpy or cupy) whose arrays live on this device."""
        return self._xp

    @property
    def is_gpu(self) -> bool:
        """Whether this is a CUDA device."""
        return self.kind == "gpu"

    @property
    def type(self) -> str:
        """PyTorch's name of the device kind: ``"cuda"`` for a GPU, ``"cpu"`` for the CPU (what
        ``torch.accelerator.current_accelerator().type`` gives a program to pass to ``.to``)."""
        return "cuda" if self.kind == "gpu" else self.kind

    def put(self, array, dtype=None):
        """Return ``array`` as an array on this device (copying across devices when needed).

        Host data goes to a GPU on the device's copy stream when it is in pinned memory
        (:mod:`minigrad.backend.transfer`), else through ``cupy.asarray``; an array of another GPU
        is copied from it."""
        if self.kind == "cpu":
            if is_cupy_array(array):
                array = cupy_or_none().asnumpy(array)
            return np.asarray(array, dtype=dtype)
        if _is_bfloat16(dtype) or (dtype is None and _is_bfloat16(getattr(array, "dtype", None))):
            raise TypeError(
                f"bfloat16 on {self}: CuPy has no bfloat16 arrays; keep bfloat16 tensors on the "
                "CPU, or use float16 on a GPU (amp.autocast(low_prec_dtype='float16'))"
            )
        cp = self._xp
        with self._context:
            if isinstance(array, cp.ndarray):
                if array.data.device_id != self.index:
                    return cp.asarray(array, dtype=dtype)  # copies to the current device
                return array if dtype is None or array.dtype == dtype else array.astype(dtype)
            return host_to_device(array, dtype, self.index)

    def context(self):
        """A context manager that makes this device CUDA's current device inside its block (a
        no-op on the CPU). It may be entered from any thread, and nested; the first entry notes
        that this process uses CUDA (see :func:`cuda_initialized`)."""
        return self._context

    def synchronize(self) -> None:
        """Wait until every kernel queued on this device has finished, then raise any error found
        by a deferred index check (:mod:`minigrad.backend.device_checks`)."""
        if self.kind == "gpu":
            self._context.synchronize()
        raise_deferred_errors()

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"

    def __repr__(self) -> str:
        return f"Device('{self}')"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = as_device(other)
            except (ValueError, RuntimeError):
                return False
        return isinstance(other, Device) and other.kind == self.kind and other.index == self.index

    def __hash__(self) -> int:
        return hash((self.kind, self.index))


_NULL_CONTEXT = contextlib.nullcontext()  # the CPU's "current device" (one, always current)


class _FirstEntry:
    """A GPU device's context until it is first entered: then it notes that this process uses
    CUDA (:func:`note_cuda_use`; CuPy initialises CUDA on the first device it makes current) and
    hands the device the plain CuPy device object, so later entries cost nothing extra."""

    __slots__ = ("device", "cuda_device")

    def __init__(self, device: Device, cuda_device):
        self.device, self.cuda_device = device, cuda_device

    def __enter__(self):
        note_cuda_use()
        self.device._context = self.cuda_device
        return self.cuda_device.__enter__()

    def __exit__(self, *exc):
        return self.cuda_device.__exit__(*exc)

    def synchronize(self) -> None:
        """Wait for the device (the CuPy device object's ``synchronize``)."""
        note_cuda_use()
        self.cuda_device.synchronize()


_cuda_used = False  # a GPU device was made current here (through minigrad) since CuPy was set
_cuda_unusable: str | None = None  # why this process must not touch CUDA (see forbid_cuda)


def note_cuda_use() -> None:
    """Record that this process made a GPU current, which initialises CUDA: read by
    :func:`cuda_initialized` (cheaper than asking the driver, and seen on a stand-in CuPy too)."""
    global _cuda_used
    _cuda_used = True


def forbid_cuda(reason: str) -> None:
    """Make every later GPU device request of this process raise ``RuntimeError(reason)``: for a
    process forked after its parent initialised CUDA, where CUDA itself would only fail with an
    "initialization error" that does not say why."""
    global _cuda_unusable
    _cuda_unusable = reason
    _CACHE.clear()  # devices resolved before the fork are resolved (and refused) again


def _require_cupy(what: str):
    if _cuda_unusable is not None:
        raise RuntimeError(f"{what}: {_cuda_unusable}")
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError(
            f"{what} needs CuPy, which could not be imported ({cupy_import_error()}); "
            'install it with pip install -e ".[cuda12]" or ".[cuda13]"'
        )
    probe = probe_gpus()
    if probe.count == 0:
        raise RuntimeError(f"{what} requested but CuPy sees no CUDA device: {probe.reason}")
    return cp


_CACHE: dict[str, Device] = {}
_default_name: str | None = None


def _forget_devices() -> None:
    """The GPU array module changed (``use_cupy``): count the GPUs again, rebuild the Devices,
    and forget that the old module touched CUDA."""
    global _probe, _cuda_used
    _CACHE.clear()
    _probe = None
    _cuda_used = False


seams.GPU_ARRAYS.watch(lambda _arrays: _forget_devices())  # CuPy swapped (tests)


def as_device(device) -> Device:
    """Resolve a name (``"cpu0"``, ``"gpu1"``, ``"xpux"``, ``"cuda:0"``) or Device to a Device.

    A plain integer ``n`` is PyTorch's spelling of GPU ``n`` (``t.to(local_rank)`` in DeepSpeed's
    tutorials): ``gpu{n}``, or ``cpu0`` with a warning (once) where no GPU is visible, as the
    launcher places ranks on the CPU there."""
    if isinstance(device, Device):
        return device
    if device is None:
        return get_default_device_obj()
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"unknown device {device!r}: a GPU index must be >= 0")
        if probe_gpus().count:
            return as_device(f"gpu{int(device)}")
        if not _INDEX_ON_CPU_WARNED:
            _warn_index_on_cpu(int(device))
        return as_device("cpu0")
    name = str(device).strip().lower()
    cached = _CACHE.get(name)
    if cached is not None:
        return cached
    m = _NAME.match(name)
    if m is None:
        raise ValueError(
            f"unknown device {device!r}: expected cpu0, gpu0..gpuN, xpux, cpux or gpux"
        )
    kind, idx = m.group(1), m.group(2)
    if name.startswith("cuda"):
        kind = "gpu"
        idx = name.split(":")[1] if ":" in name else (idx or "0")
    if kind == "xpu":
        probe = probe_gpus()
        kind = "gpu" if probe.count else "cpu"
        if probe.failed:
            warnings.warn(f"{name}: using cpu0 because {probe.reason}", RuntimeWarning,
                          stacklevel=2)
    if idx is None or idx == "x":
        idx = _current_gpu() if kind == "gpu" else 0
    dev = Device(kind, int(idx))
    _CACHE[name] = dev
    return dev


_INDEX_ON_CPU_WARNED = False


def _warn_index_on_cpu(index: int) -> None:
    global _INDEX_ON_CPU_WARNED
    _INDEX_ON_CPU_WARNED = True
    warnings.warn(f"device {index} (GPU {index}): no GPU is visible here, using cpu0",
                  RuntimeWarning, stacklevel=4)


def _current_gpu() -> int:
    """CUDA's current device: asked from CUDA only once CUDA is initialised in this process;
    before that it is device 0 by CUDA's definition (and asking would initialise CUDA)."""
    cp = _require_cupy("gpux")
    return int(cp.cuda.runtime.getDevice()) if cuda_initialized() else 0


#: ``cuCtxGetCurrent``'s status until ``cuInit`` ran in this process.
CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_initialized() -> bool:
    """Whether this process has initialised the CUDA driver (after which a forked child cannot use
    the GPU). Answered without initialising it: True once minigrad made a GPU current here
    (:func:`note_cuda_use`); otherwise the driver is asked (CuPy or PyTorch may have initialised
    it directly), unless the GPU array module is a test's stand-in, which the driver's state does
    not concern."""
    if _cuda_used:
        return True
    return not cupy_is_stand_in() and cuda_driver_initialized()


def cuda_driver_initialized() -> bool:
    """Whether the CUDA driver was initialised in this process, asked without initialising it:
    its library must already be loaded, and then ``cuCtxGetCurrent`` says "not initialised"
    until ``cuInit`` ran."""
    try:
        with open("/proc/self/maps") as maps:
            if "libcuda.so" not in maps.read():
                return False
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    context = ctypes.c_void_p()
    return driver.cuCtxGetCurrent(ctypes.byref(context)) != CUDA_ERROR_NOT_INITIALIZED


def synchronize(device=None) -> None:
    """Wait for every kernel queued on ``device`` (default: the default device) and raise any
    error a deferred index check found (``torch.cuda.synchronize``; time GPU work between two
    calls).

    Example::

        mg.backend.synchronize("gpu0")
    """
    as_device(device).synchronize()


def set_default_device(device: str = "xpux") -> None:
    """Set the device new tensors go to (``mg.set_default_device("cpu0")``)."""
    global _default_name
    as_device(device)  # validate now, not at the first tensor
    _default_name = str(device)


def get_default_device() -> str:
    """The default device's name, e.g. ``"cpu0"``."""
    return str(get_default_device_obj())


def get_default_device_obj() -> Device:
    name = _default_name or os.environ.get("MINIGRAD_DEFAULT_DEVICE") or "xpux"
    return as_device(name)


def _is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` (an ``np.dtype``, None or anything else) is bfloat16."""
    return isinstance(dtype, np.dtype) and is_bfloat16(dtype)
