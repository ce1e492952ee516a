"""The CPU kernels' LLVM tuning (``minigrad.backend.kernels.jit``): on x86-64 numba tunes them for
``x86-64-v3`` whatever the host's model is, unless the user chose a CPU name; the instructions
stay the host's. Each case runs in a fresh interpreter, since numba reads the setting once."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from minigrad.backend.kernels import jit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, numpy as np
from minigrad.backend import kernels
y, mask = kernels.relu(np.array([-1.0, 2.0], np.float32))   # compiles (or loads) a kernel
import numba.core.config as config
from numba.core.registry import cpu_target
codegen = cpu_target.target_context.codegen()
print(json.dumps({"config": config.CPU_NAME, "codegen": codegen._get_host_cpu_name(),
                  "y": y.tolist()}))
"""


def _probe(**env_changes) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_NAME"}
    env.update(env_changes)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")
def test_kernels_are_tuned_for_x86_64_v3_whatever_the_host():
    got = _probe()
    assert got == {"config": jit.TUNING_CPU, "codegen": "x86-64-v3", "y": [0.0, 2.0]}


def test_a_cpu_name_the_user_set_is_kept():
    got = _probe(NUMBA_CPU_NAME="generic")
    assert got["config"] == "generic" and got["codegen"] == "generic"
    assert got["y"] == [0.0, 2.0]
