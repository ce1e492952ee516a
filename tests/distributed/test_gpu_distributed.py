"""GPU jobs of several processes (``gpu_jobs.py``): on the fake CuPy here, and marked ``gpu`` on
CUDA in a fresh interpreter (so that CUDA is first initialised in the forked ranks); plus the
launcher's rank-to-GPU binding."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
from fakes import fake_cupy

import minigrad as mg
import minigrad.distributed as dist
from minigrad.backend import device as device_mod
from minigrad.testing.distributed import run_workers

launcher_mod = importlib.import_module("minigrad.distributed.runtime.launcher")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_jobs  # noqa: E402


@pytest.mark.parametrize("job", sorted(gpu_jobs.JOBS))
def test_job_on_the_fake_cupy(job):
    with fake_cupy.installed(1):
        gpu_jobs.JOBS[job]()


@pytest.mark.parametrize("job", ["data_parallel", "pipeline"])
def test_jobs_leave_cuda_untouched_in_the_parent_whose_default_is_gpu0(job):
    """In a fresh interpreter the default device is gpu0: a reference computed there initialises
    CUDA before the ranks are forked, and each rank then fails at its first GPU request."""
    with fake_cupy.installed(1):
        mg.set_default_device("xpux")  # what a fresh interpreter resolves (gpu0 here)
        try:
            assert mg.get_default_device() == "gpu0" and not device_mod.cuda_initialized()
            gpu_jobs.JOBS[job]()
            assert not device_mod.cuda_initialized(), f"{job} made a GPU current in the parent"
        finally:
            mg.set_default_device("cpu0")


def _gpu_sum():
    import cupy  # noqa: PLC0415  (the fake)

    return float(cupy.asnumpy((mg.tensor([1.0, 2.0], device="gpu0") * 2).sum().data))


def _cpu_sum():
    return float((mg.tensor([1.0, 2.0]) * 2).sum().item())


def test_the_fork_guard_applies_whatever_the_launch_device_type(monkeypatch):
    """CUDA initialised in the parent (the flag is monkeypatched: the fake has no driver): GPU
    launches are refused, ranks launched on the CPU still run, but their first GPU request
    raises the reason instead of CUDA's bare initialization error."""
    with fake_cupy.installed(1):
        assert run_workers(_gpu_sum, 1) == [6.0]  # CUDA untouched in the parent: ranks use GPU 0
        monkeypatch.setattr(launcher_mod, "cuda_initialized", lambda: True)
        with pytest.raises(RuntimeError, match="CUDA was already initialised in the parent"):
            dist.launcher(_cpu_sum, n_gpus=1, backend="cpu")()
        assert run_workers(_cpu_sum, 1) == [6.0]
        with pytest.raises(dist.LaunchError, match=r"gpu0: CUDA was already initialised in the "
                                                    r"parent process of dist.launcher"):
            run_workers(_gpu_sum, 1)


def test_making_a_gpu_current_marks_cuda_initialised(monkeypatch):
    monkeypatch.setattr(device_mod, "cuda_driver_initialized", lambda: True)  # (a GPU machine)
    assert device_mod.cuda_initialized()
    with fake_cupy.installed(1):  # the real driver's state is nothing to the fake's GPUs
        dev = device_mod.as_device("gpu0")
        assert not device_mod.cuda_initialized()  # resolving a GPU's name touches no GPU
        mg.tensor([1.0], device=dev)
        assert device_mod.cuda_initialized()
    monkeypatch.setattr(device_mod, "cuda_driver_initialized", lambda: False)
    assert not device_mod.cuda_initialized()  # a new array module (the fake removed): forgotten


@pytest.mark.gpu
@pytest.mark.parametrize("job", ["nccl_world_size_one", "cupy_collectives", "data_parallel",
                                 "pipeline"])
def test_job_on_cuda(job):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "gpu_jobs.py"), job],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{job}: passed" in proc.stdout


def _rank_device():
    import cupy  # noqa: PLC0415  (the fake)

    y = mg.tensor([1.0, 2.0]) * 2  # on the rank's default device
    return cupy.cuda.runtime.getDevice(), mg.get_default_device(), str(y.device), y.data.device.id


def test_the_launcher_binds_each_rank_to_its_gpu():
    with fake_cupy.installed(2):
        ranks = dist.launcher(_rank_device, backend="cpu")()  # one rank per visible GPU
        assert ranks == [(0, "gpu0", "gpu0", 0), (1, "gpu1", "gpu1", 1)]
        with pytest.raises(ValueError, match=r"dist.launcher: 3 ranks but 2 visible GPU\(s\)"):
            dist.launcher(_rank_device, n_gpus=3, device_type="gpu")
        with pytest.warns(RuntimeWarning, match="running the ranks on the CPU"):
            job = dist.launcher(_where, n_gpus=3, backend="cpu")
        assert job() == ["cpu0"] * 3


def _where():
    return mg.get_default_device()


def _staged_on_gpu1():
    import cupy  # noqa: PLC0415  (the fake)

    from minigrad.distributed import comm  # noqa: PLC0415

    with cupy.cuda.Device(1):
        x = cupy.full(3, float(dist.get_rank() + 1))
    # device 0 is current: staged results must still land on the inputs' GPU
    gathered = comm.all_gather(x)
    comm.all_reduce(x)
    return [g.device.id for g in gathered], x.device.id, cupy.asnumpy(x).tolist()


def test_staged_results_land_on_the_inputs_gpu():
    with fake_cupy.installed(2):
        out = run_workers(_staged_on_gpu1, 2, backend="cpu")
    assert out == [([1, 1], 1, [3.0, 3.0, 3.0])] * 2
