"""Every device-parametrised test of the single-process packages again on the fake CuPy's second
GPU while device 0 is current (``MINIGRAD_TEST_FAKE_GPU=gpu1``, see ``tests/conftest.py``): a raw
array operation outside its tensor's device context, a NumPy call on a device array or an implicit
host copy fails there, as it would on a machine with two GPUs. A second run does it with
minigrad's kernels being ``gpu.py``'s CUDA C run on the CPU (``MINIGRAD_TEST_CUDA_ON_CPU=1``,
``tests/fakes/cuda_on_cpu.py``): every op test then checks the GPU kernels as well."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["tests/functional", "tests/module", "tests/test_tensor.py", "tests/backend",
            "tests/optimizer", "tests/amp", "tests/autodiff"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kernels", ["cpu", "cuda-on-cpu"])
def test_every_device_test_passes_on_the_second_fake_gpu(kernels):
    if kernels == "cuda-on-cpu" and shutil.which("g++") is None:
        pytest.skip("running the CUDA C on the CPU needs g++")
    env = dict(os.environ, MINIGRAD_TEST_FAKE_GPU="gpu1",
               MINIGRAD_TEST_CUDA_ON_CPU="1" if kernels == "cuda-on-cpu" else "0")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-k", "gpu1", *PACKAGES], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=580)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout.splitlines()[-1], tail
