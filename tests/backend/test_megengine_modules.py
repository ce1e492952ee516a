"""MegEngine's module names: ``minigrad.device`` (megengine.device) and
``minigrad.functional.distributed`` (megengine.functional.distributed)."""

from __future__ import annotations

import os
import subprocess
import sys

import minigrad.device as device
import numpy as np
import pytest

import minigrad as mg

_HAS_CUDA = mg.is_cuda_available()


def test_device_module_is_the_backend_functions():
    """megengine.device's core functions are also top-level names; here they are one object."""
    for name in ("get_device_count", "is_cuda_available", "get_default_device",
                 "set_default_device"):
        assert getattr(device, name) is getattr(mg, name)
    assert mg.device is device
    assert set(device.__all__) <= set(dir(device))


def test_device_counts_and_availability():
    """get_device_count accepts MegEngine's "gpu", "cpu" and "xpu" (what xpux resolves to);
    accelerators minigrad has no backend for count 0 and are unavailable."""
    gpus = device.get_device_count("gpu")
    assert device.get_device_count("xpu") == (gpus or 1)
    assert device.get_device_count("cpu") == 1
    assert device.what_is_xpu() == ("cuda" if gpus else "cpu")
    for kind in ("rocm", "cambricon", "atlas"):
        assert device.get_device_count(kind) == 0
    assert not (device.is_rocm_available() or device.is_cambricon_available()
                or device.is_atlas_available())
    with pytest.raises(ValueError, match="get_device_count: unknown device type 'npu'"):
        device.get_device_count("npu")


def test_default_device_round_trip():
    prev = device.get_default_device()
    try:
        device.set_default_device("cpu0")
        assert device.get_default_device() == "cpu0" and mg.tensor([1.0]).device == "cpu0"
    finally:
        device.set_default_device(prev)


def test_memory_status_on_the_cpu():
    """get_mem_status_bytes returns (total, free); on a CPU device that is host memory. Host
    allocation statistics come from tracemalloc, off until reset_max_memory_stats starts it."""
    import tracemalloc

    total, free = device.get_mem_status_bytes("cpu0")
    assert total >= free > 0
    was_tracing = tracemalloc.is_tracing()
    tracemalloc.stop()
    try:
        with pytest.raises(RuntimeError, match="get_allocated_memory: host memory is counted by "
                                               "tracemalloc, which is off"):
            device.get_allocated_memory("cpu0")
        device.reset_max_memory_stats("cpu0")
        before = device.get_allocated_memory("cpu0")
        big = np.ones(1 << 20)  # 8 MiB, reported by NumPy to tracemalloc
        assert device.get_allocated_memory("cpu0") - before >= big.nbytes
        del big
        assert device.get_max_allocated_memory("cpu0") - before >= 8 << 20
        assert device.get_allocated_memory("cpu0") - before < 1 << 20
        device.reset_max_memory_stats("cpu0")
        assert device.get_max_allocated_memory("cpu0") - before < 1 << 20
    finally:
        if not was_tracing:
            tracemalloc.stop()
    device.coalesce_free_memory()  # harmless everywhere


@pytest.mark.skipif(_HAS_CUDA, reason="checks the error raised without CUDA")
def test_cuda_queries_fail_clearly_without_cuda():
    for fn, args in ((device.get_cuda_version, ()), (device.get_cuda_compute_capability, (0,)),
                     (device.get_cuda_driver_version, ())):
        with pytest.raises(RuntimeError, match="needs CuPy and a CUDA device"):
            fn(*args)


@pytest.mark.gpu
def test_cuda_queries():
    total, free = device.get_mem_status_bytes("gpu0")
    assert total >= free > 0
    x = mg.tensor([1.0] * 1024, device="gpu0")
    assert device.get_reserved_memory("gpu0") >= device.get_allocated_memory("gpu0") >= 4096
    assert device.get_cuda_compute_capability(0) >= 30 and device.get_cuda_version() > 0
    assert "totalGlobalMem" in device.get_cuda_device_property(0)
    del x


def _run_fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter (what it imports first matters here); it must pass."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_functional_distributed_is_an_alias_loaded_only_on_request():
    """megengine.functional.distributed: the same functions as the distributed package's
    functional module; importing minigrad.functional alone must not start loading the runtime."""
    code = ("import sys, minigrad.functional as F\n"
            "assert 'minigrad.distributed' not in sys.modules\n"
            "import minigrad.functional.distributed as FD, minigrad.distributed.functional as DF\n"
            "assert all(getattr(FD, n) is getattr(DF, n) for n in FD.__all__)\n"
            "assert {'all_reduce_sum', 'all_gather', 'remote_send'} <= set(FD.__all__)\n")
    _run_fresh(code)


def test_functional_distributed_is_an_attribute_of_functional_loaded_on_first_use():
    """MegEngine code writes ``F.distributed.all_reduce_sum`` after ``import
    megengine.functional as F`` only: the attribute loads the collectives then, not before."""
    code = ("import sys, minigrad.functional as F\n"
            "assert 'minigrad.distributed' not in sys.modules\n"
            "FD = F.distributed\n"
            "import minigrad.distributed.functional as DF\n"
            "assert FD is DF and F.distributed.all_reduce_sum is DF.all_reduce_sum\n"
            "try:\n"
            "    F.no_such_op\n"
            "except AttributeError as exc:\n"
            "    assert 'no_such_op' in str(exc)\n"
            "else:\n"
            "    raise AssertionError('F.no_such_op did not raise')\n")
    _run_fresh(code)
