"""Every device-parametrised test of the single-process packages again on the fake CuPy's second
GPU while device 0 is current (``MINIGRAD_TEST_FAKE_GPU=gpu1``, see ``tests/conftest.py``): a raw
array operation outside its tensor's device context, a NumPy call on a device array or an implicit
host copy fails there, as it would on a machine with two GPUs."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["tests/functional", "tests/module", "tests/test_tensor.py", "tests/backend",
            "tests/optimizer", "tests/amp", "tests/autodiff"]


@pytest.mark.timeout(600)
def test_every_device_test_passes_on_the_second_fake_gpu():
    env = dict(os.environ, MINIGRAD_TEST_FAKE_GPU="gpu1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-k", "gpu1", *PACKAGES], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=580)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout.splitlines()[-1], tail
