"""Device names and objects, the default device (also from MINIGRAD_DEFAULT_DEVICE), and the
errors a GPU request gives on a machine without CuPy or CUDA (simulated, so they run anywhere)."""

from __future__ import annotations

import contextlib
import subprocess
import types
import warnings

import numpy as np
import pytest

import minigrad as mg
from minigrad.backend import device as device_mod
from minigrad.backend import xp as xp_mod
from minigrad.backend.device import Device, as_device


@pytest.fixture
def fresh_devices(monkeypatch):
    """Forget cached name lookups and any default set by earlier tests (restored afterwards)."""
    monkeypatch.setattr(device_mod, "_CACHE", {})
    monkeypatch.setattr(device_mod, "_probe", None)
    monkeypatch.setattr(device_mod, "_default_name", None)
    monkeypatch.delenv("MINIGRAD_DEFAULT_DEVICE", raising=False)


@pytest.fixture
def no_cupy(monkeypatch, fresh_devices):
    """Pretend CuPy failed to import."""
    monkeypatch.setattr(xp_mod, "_cupy", None)
    monkeypatch.setattr(xp_mod, "_cupy_checked", True)
    monkeypatch.setattr(xp_mod, "_cupy_error", "ModuleNotFoundError: No module named 'cupy'")


@pytest.mark.parametrize("name", ["cpu0", "cpux", "CPU0", " cpu0 "])
def test_cpu_names(name, fresh_devices):
    dev = as_device(name)
    assert dev.kind == "cpu" and dev.index == 0 and dev.xp is np and not dev.is_gpu
    assert str(dev) == "cpu0" and repr(dev) == "Device('cpu0')"


def test_device_equality_and_hash(fresh_devices):
    a, b = as_device("cpu0"), Device("cpu", 0)
    assert a == b and a == "cpu0" and a == "cpux" and hash(a) == hash(b)
    assert a != "cpu1" and a != "not-a-device"
    assert as_device(a) is a
    assert {a: 1}[b] == 1


@pytest.mark.parametrize("name", ["tpu0", "cpu-1", "gpu0x", "", "cpu0:x"])
def test_unknown_names_are_rejected(name, fresh_devices):
    with pytest.raises(
        ValueError, match=r"unknown device .*: expected cpu0, gpu0..gpuN, xpux, cpux or gpux"
    ):
        as_device(name)


def test_xpux_falls_back_to_cpu_without_cuda(no_cupy):
    assert as_device("xpux") == "cpu0"
    assert not mg.is_cuda_available()
    assert mg.get_device_count("gpu") == 0 and mg.get_device_count("cpu") == 1


@pytest.mark.parametrize("name", ["gpu0", "gpux", "gpu1", "cuda:0", "cuda"])
def test_gpu_without_cupy_says_why(name, no_cupy):
    with pytest.raises(
        RuntimeError,
        match=r"needs CuPy, which could not be imported "
        r"\(ModuleNotFoundError: No module named 'cupy'\)",
    ):
        as_device(name)
    with pytest.raises(RuntimeError, match="needs CuPy"):
        mg.tensor([1.0], device=name)


def test_gpu_with_cupy_but_no_cuda_device(monkeypatch, fresh_devices):
    monkeypatch.setattr(device_mod, "cupy_or_none", lambda: object())
    monkeypatch.setattr(device_mod, "probe_gpus",
                        lambda: device_mod.GpuProbe(0, "CUDA reports no device"))
    with pytest.raises(RuntimeError, match=r"gpu0 requested but CuPy sees no CUDA device: CUDA "
                                           r"reports no device"):
        as_device("gpu0")


def test_get_device_count_rejects_unknown_kind():
    with pytest.raises(ValueError, match="get_device_count: unknown device type 'tpu'"):
        mg.get_device_count("tpu")


def test_set_and_get_default_device(fresh_devices):
    assert mg.get_default_device() == ("gpu0" if mg.is_cuda_available() else "cpu0")  # xpux
    mg.set_default_device("cpu0")
    assert mg.get_default_device() == "cpu0"
    assert mg.tensor([1.0]).device == "cpu0"
    with pytest.raises(ValueError, match="unknown device 'bogus'"):
        mg.set_default_device("bogus")
    assert mg.get_default_device() == "cpu0", "a rejected name must not change the default"


def test_default_device_from_environment(monkeypatch, fresh_devices):
    monkeypatch.setenv("MINIGRAD_DEFAULT_DEVICE", "cpux")
    assert mg.get_default_device() == "cpu0"
    assert mg.zeros(2).device == "cpu0"
    monkeypatch.setenv("MINIGRAD_DEFAULT_DEVICE", "bogus0")
    with pytest.raises(ValueError, match="unknown device 'bogus0'"):
        mg.get_default_device()
    mg.set_default_device("cpu0")  # an explicit choice wins over the environment
    assert mg.get_default_device() == "cpu0"


def test_default_gpu_from_environment_without_cupy(monkeypatch, no_cupy):
    monkeypatch.setenv("MINIGRAD_DEFAULT_DEVICE", "gpu0")
    with pytest.raises(RuntimeError, match="gpu0 needs CuPy"):
        mg.tensor([1.0])


def test_put_copies_and_casts(fresh_devices):
    dev = as_device("cpu0")
    out = dev.put([1, 2], np.float64)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 2.0])
    with dev.context():
        pass  # a no-op on the CPU, but usable as a context manager


def test_array_module_helpers():
    a = np.ones(2)
    assert mg.backend.get_array_module(a, 1.0) is np
    assert mg.backend.to_numpy(a) is a
    np.testing.assert_array_equal(mg.backend.to_numpy([1, 2]), [1, 2])


@pytest.mark.gpu
def test_gpu_device_roundtrip():
    dev = as_device("gpu0")
    assert dev.is_gpu and dev.xp.__name__ == "cupy"
    t = mg.tensor([1.0, 2.0], device="gpu0")
    assert t.device == "gpu0" and type(t._data).__module__.startswith("cupy")
    np.testing.assert_array_equal((t * 2).to("cpu0").numpy(), [2.0, 4.0])
    assert as_device("xpux") == "gpu0"
    with pytest.raises(
        TypeError, match="cannot convert a tensor on gpu0 to a NumPy array implicitly"
    ):
        np.asarray(t)


# -- counting GPUs: never read a CUDA error as "0 GPUs" silently, never initialise CUDA to count --

class FakeCUDAError(Exception):
    def __init__(self, status, text):
        super().__init__(f"{text}")
        self.status = status


def fake_cupy(count=None, error=None):
    """A stand-in for CuPy whose runtime must not be asked unless the OS cannot tell."""

    def get_device_count():
        if error is not None:
            raise error
        if count is None:
            raise AssertionError("CUDA was asked to count devices (that initialises CUDA)")
        return count

    def get_device():
        raise AssertionError("CUDA was asked for its current device before it was initialised")

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count, getDevice=get_device,
                                    CUDARuntimeError=FakeCUDAError)
    cuda = types.SimpleNamespace(runtime=runtime, Device=lambda index: contextlib.nullcontext())
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def gpu_probe(monkeypatch, fresh_devices, tmp_path):
    """Fresh GPU counting with a fake CuPy; no CUDA_VISIBLE_DEVICES and no driver entries."""
    monkeypatch.setattr(device_mod, "_probe", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(device_mod, "NVIDIA_GPUS_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(device_mod, "cuda_initialized", lambda: False)

    def use(cupy):
        monkeypatch.setattr(device_mod, "cupy_or_none", lambda: cupy)
        monkeypatch.setattr(device_mod, "_probe", None)

    return use


def test_gpus_are_counted_from_the_os_without_initialising_cuda(gpu_probe, monkeypatch, tmp_path):
    gpu_probe(fake_cupy())  # any call into the CUDA runtime fails the test
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (gpus / bus).mkdir()
    monkeypatch.setattr(device_mod, "NVIDIA_GPUS_DIR", str(gpus))
    assert mg.get_device_count("gpu") == 2 and mg.is_cuda_available()
    assert as_device("xpux") == Device("gpu", 0)  # current device: 0 until CUDA is initialised
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(device_mod, "_probe", None)
    assert mg.get_device_count("gpu") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,1")  # CUDA stops at the invalid entry
    monkeypatch.setattr(device_mod, "_probe", None)
    assert mg.get_device_count("gpu") == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(device_mod, "_probe", None)
    assert mg.get_device_count("gpu") == 0
    assert "CUDA_VISIBLE_DEVICES='' hides every GPU" in device_mod.probe_gpus().reason


def test_a_cuda_error_is_reported_not_read_as_no_gpu(gpu_probe, monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_initialized", lambda: True)  # asked in this process
    gpu_probe(fake_cupy(error=FakeCUDAError(35, "cudaErrorInsufficientDriver: CUDA driver "
                                                "version is insufficient for CUDA runtime")))
    assert mg.get_device_count("gpu") == 0
    probe = device_mod.probe_gpus()
    assert probe.failed and "cudaErrorInsufficientDriver" in probe.reason
    with pytest.warns(RuntimeWarning, match=r"xpux: using cpu0 because CUDA failed while "
                                            r"counting devices: cudaErrorInsufficientDriver"):
        assert as_device("xpux") == "cpu0"
    with pytest.raises(RuntimeError, match=r"gpu0 requested but CuPy sees no CUDA device: CUDA "
                                           r"failed while counting devices: cudaErrorInsuff"):
        as_device("gpu0")


def test_no_gpu_at_all_is_not_an_error(gpu_probe, recwarn, monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_initialized", lambda: True)  # asked in this process
    gpu_probe(fake_cupy(error=FakeCUDAError(100, "cudaErrorNoDevice: no CUDA-capable device")))
    assert as_device("xpux") == "cpu0" and not device_mod.probe_gpus().failed
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    gpu_probe(fake_cupy(count=0))
    assert device_mod.probe_gpus().reason == "CUDA reports no device"


def test_an_unreadable_driver_device_list_is_a_failure_not_zero_gpus(gpu_probe, monkeypatch,
                                                                    tmp_path):
    gpu_probe(fake_cupy())
    monkeypatch.setattr(device_mod, "NVIDIA_GPUS_DIR", str(tmp_path))

    def denied(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(device_mod.os, "listdir", denied)
    probe = device_mod.probe_gpus()
    assert probe.failed and probe.count == 0 and "Permission denied" in probe.reason


@pytest.mark.parametrize("returncode, stdout, stderr, count, failed, reason", [
    (0, "3\n", "", 3, False, None),
    (0, "0\n", "", 0, False, "CUDA reports no device"),
    (1, "", "Traceback ...\ncupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorNoDevice: "
            "no CUDA-capable device is detected", 0, False, "CUDA reports no device"),
    (1, "", "Traceback ...\ncupy_backends.cuda.api.runtime.CUDARuntimeError: "
            "cudaErrorInsufficientDriver: CUDA driver version is insufficient", 0, True,
     "CUDA failed while counting devices: cupy_backends.cuda.api.runtime.CUDARuntimeError: "
     "cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
])
def test_without_os_entries_cuda_is_asked_in_a_subprocess(gpu_probe, monkeypatch, returncode,
                                                          stdout, stderr, count, failed, reason):
    gpu_probe(fake_cupy())  # this process's CUDA must not be asked (it would be initialised)
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)

    monkeypatch.setattr(device_mod.subprocess, "run", run)
    probe = device_mod.probe_gpus()
    assert (probe.count, probe.failed, probe.reason) == (count, failed, reason)
    assert calls == [[device_mod.sys.executable, "-c", device_mod.COUNT_GPUS_SCRIPT]]
    assert "getDeviceCount" in device_mod.COUNT_GPUS_SCRIPT


def test_a_subprocess_that_cannot_run_is_a_failure(gpu_probe, monkeypatch):
    gpu_probe(fake_cupy())

    def run(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(device_mod.subprocess, "run", run)
    probe = device_mod.probe_gpus()
    assert probe.failed and probe.count == 0 and "timed out after 120 seconds" in probe.reason


def test_an_integer_is_a_gpu_index_or_cpu0_without_gpus(monkeypatch, fresh_devices):
    """``t.to(local_rank)`` (PyTorch's and DeepSpeed's spelling): ``gpu{n}`` where GPUs are seen,
    else ``cpu0`` with one warning per process (the launcher's CPU fallback)."""
    monkeypatch.setattr(device_mod, "_INDEX_ON_CPU_WARNED", False)
    monkeypatch.setattr(device_mod, "probe_gpus", lambda: device_mod.GpuProbe(0, "no GPU"))
    with pytest.warns(RuntimeWarning, match="device 1 \\(GPU 1\\): no GPU is visible here"):
        assert as_device(1) == as_device("cpu0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert as_device(np.int64(0)) == as_device("cpu0")  # warned once only
        assert mg.tensor([1.0]).to(0).device == "cpu0"
    monkeypatch.setattr(device_mod, "probe_gpus", lambda: device_mod.GpuProbe(2, None))
    gpu1 = object()  # (a real gpu1 needs CuPy): the name an index resolves to
    monkeypatch.setattr(device_mod, "_CACHE", {"gpu1": gpu1})
    assert as_device(1) is gpu1
    with pytest.raises(ValueError, match="a GPU index must be >= 0"):
        as_device(-1)
    with pytest.raises(ValueError, match="unknown device True"):
        as_device(True)
