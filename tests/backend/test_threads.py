"""mg.set_num_threads / get_num_threads, the per-rank share in a launched job, and the OpenBLAS
waiting policy applied at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import minigrad as mg
from minigrad.backend.threads import BLAS_SPIN_ENV, BLAS_SPIN_EXPONENT, available_cores
from minigrad.testing.distributed import run_workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", BLAS_SPIN_ENV)


def _fresh_python(code: str, **env) -> list:
    """Run ``code`` in a new interpreter with no thread settings inherited; its printed words."""
    full = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    full.update(PYTHONPATH=ROOT, **env)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_set_num_threads_round_trips():
    before = mg.get_num_threads()
    try:
        mg.set_num_threads(1)
        assert mg.get_num_threads() == 1
        mg.set_num_threads(available_cores())
        assert mg.get_num_threads() == available_cores()
    finally:
        mg.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_set_num_threads_rejects_non_positive_ints(bad):
    with pytest.raises(ValueError, match="set_num_threads: expected a positive int"):
        mg.set_num_threads(bad)


def test_the_count_survives_the_blas_that_scipy_loads_later():
    # numba (the CPU kernels) imports SciPy on the first kernel call, after the count was set, and
    # SciPy brings an OpenBLAS of its own at its default count: the answer stays the count set,
    # which NumPy's BLAS (the one minigrad computes with) has
    if available_cores() < 2:
        pytest.skip("one core: every pool has one thread anyway")
    code = ("import numpy as np, minigrad as mg, minigrad.functional as F\n"
            "from threadpoolctl import threadpool_info\n"
            "mg.set_num_threads(1)\n"
            "F.gelu(F.relu(mg.tensor(np.ones((4, 4), np.float32))))\n"
            "pools = [p for p in threadpool_info() if p['user_api'] == 'blas']\n"
            "print(mg.get_num_threads(), len(pools),"
            " *[p['num_threads'] for p in pools if 'numpy' in p['filepath']])")
    words = _fresh_python(code)
    assert words[0] == "1" and set(words[2:]) <= {"1"}, words


def test_a_single_process_gets_every_core():
    words = _fresh_python("import minigrad as mg; print(mg.get_num_threads())")
    assert words == [str(available_cores())]


def test_each_rank_of_a_launch_gets_its_share():
    counts = run_workers(lambda: mg.get_num_threads(), 2, timeout=60)
    assert counts == [max(1, (os.cpu_count() or 1) // 2)] * 2


def test_blas_waiting_policy_is_set_before_numpy_loads_unless_chosen():
    show = f"import minigrad, os; print(os.environ.get('{BLAS_SPIN_ENV}'))"
    assert _fresh_python(show) == [str(BLAS_SPIN_EXPONENT)]
    assert _fresh_python(show, **{BLAS_SPIN_ENV: "20"}) == ["20"]
    assert _fresh_python("import numpy; " + show) == ["None"]  # too late: OpenBLAS has loaded
