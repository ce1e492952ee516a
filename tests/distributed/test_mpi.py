"""The mpi backend and MPI-started jobs: the collective and data-parallel suites run under
``mpiexec`` (as CI does), the MNIST data-parallel example equals the cpu backend bit for bit, and
the watchdog reports through MPI. Skipped with the reason when mpiexec or mpi4py is missing
(``pip install -e ".[mpi]"`` provides both)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _mpiexec() -> str | None:
    local = Path(sys.executable).with_name("mpiexec")  # the one installed with mpi4py's MPICH
    return str(local) if local.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
pytestmark = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpiexec and mpi4py (pip install -e '.[mpi]')",
)


def run_mpi(n: int, args: list[str], timeout: float = 180, **env) -> subprocess.CompletedProcess:
    """``mpiexec -n n python args...`` with this checkout first on the path."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), **env)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(var, None)  # this process may itself run under a launcher
    cmd = [MPIEXEC, "-n", str(n), sys.executable, *args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def _passed(proc, n: int, backend: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(n):
        assert f"rank {r}: " in proc.stdout and f"passed on backend {backend}" in proc.stdout


def test_collectives_and_data_parallel_under_mpiexec_2_ranks():
    job = str(HERE / "mpi_job.py")
    _passed(run_mpi(2, [job, "cases", "comm", "mismatch", "data_parallel"]), 2, "mpi")


def test_collectives_under_mpiexec_3_ranks():
    _passed(run_mpi(3, [str(HERE / "mpi_job.py"), "cases", "mismatch"]), 3, "mpi")


@pytest.mark.parametrize("n", [2, 3])
def test_small_reductions_ride_in_the_header_round(n):
    # bitwise equal to NumPy's reduction in member order on every rank, for every dtype and op
    _passed(run_mpi(n, [str(HERE / "mpi_job.py"), "small"]), n, "mpi")


INLINE_ROOM = """
import types
from minigrad.distributed.comm.providers import mpi
for aware in (False, True):
    mpi.cuda_aware = lambda aware=aware: aware
    backend = mpi.MpiBackend(types.SimpleNamespace(gid=0, ranks=[0], global_rank=0, rank=0))
    print(aware, backend._inline_room)
"""


def test_nothing_rides_in_the_header_round_where_mpi_takes_gpu_arrays():
    # the path must follow from the call alone, whichever device a member's array is on; a
    # singleton MPI process (no mpiexec) is enough to build the backend
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", INLINE_ROOM], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "4096", "True", "0"]


def test_check_strings_under_mpiexec_3_ranks():
    # every collective folds its check string into the fingerprint MPI's header round compares
    _passed(run_mpi(3, [str(HERE / "mpi_job.py"), "check"]), 3, "mpi")


def test_cpu_backend_in_an_mpi_job():
    # MPI only brings the ranks together (rendezvous); the data goes over shared memory
    proc = run_mpi(2, [str(HERE / "mpi_job.py"), "cases"], MINIGRAD_DIST_BACKEND="cpu",
                   EXPECT_BACKEND="cpu")
    _passed(proc, 2, "cpu")


def test_mnist_example_under_mpiexec_equals_cpu_backend_bitwise(tmp_path):
    example = str(ROOT / "examples" / "megengine_dp_mnist.py")
    args = ["--max-steps", "12", "--save"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cpu = subprocess.run([sys.executable, example, *args, str(tmp_path / "cpu.mgc")], env=env,
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    mpi = run_mpi(2, [example, *args, str(tmp_path / "mpi.mgc")])
    assert mpi.returncode == 0, mpi.stderr[-3000:]
    a, b = mg.load(str(tmp_path / "cpu.mgc")), mg.load(str(tmp_path / "mpi.mgc"))
    for key in ("w", "b"):
        assert np.asarray(a["net"][key]).tobytes() == np.asarray(b["net"][key]).tobytes(), key
    assert a["acc"] == b["acc"]


WATCHDOG = """
import logging, os, sys, numpy as np
import minigrad.distributed as dist
from minigrad.testing.wait import wait_until
flag = sys.argv[1]  # rank 0 marks its watchdog's warning; rank 1 arrives only after it


class Mark(logging.Handler):
    def emit(self, record):
        open(flag, "w").close()


dist.init_process_group(warn_after=0.3)
dist.get_logger().addHandler(Mark(logging.WARNING))
if dist.get_rank() == 1:
    wait_until(lambda: os.path.exists(flag), "rank 0's watchdog warning")
x = np.ones(3)
dist.all_reduce(x)
results = [None, None]
dist.all_gather_object(results, float(x[0]))
if dist.get_rank() == 0:  # one printer: mpiexec may split lines of different ranks
    print("results", results, flush=True)
"""


def test_watchdog_names_the_missing_rank_through_mpi(tmp_path):
    script = tmp_path / "watch.py"
    script.write_text(WATCHDOG)
    proc = run_mpi(2, [str(script), str(tmp_path / "warned")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results [2.0, 2.0]" in proc.stdout
    warning = [ln for ln in proc.stderr.splitlines() if "have not arrived" in ln]
    assert len(warning) == 1, proc.stderr
    assert warning[0].startswith("[rank 0] WARNING") and "all_reduce#1" in warning[0]
    assert "rank(s) [1] have not arrived" in warning[0] and "(backend mpi)" in warning[0]


# the end of the scripts below: the ranks still running meet in an all-reduce, and each writes
# the error it gets to its own file in the folder named last on its command line (mpiexec may
# splice the lines that different ranks print)
WAIT_AND_REPORT = """
x = np.ones(3)
try:
    dist.all_reduce(x)
except Exception as exc:
    with open(f"{sys.argv[-1]}/rank{r}", "w") as fh:
        fh.write(f"{type(exc).__name__}: {exc}")
    raise
print("rank", r, "was not stopped", flush=True)
"""

FAILING_RANK = """
import sys, time, numpy as np
import minigrad.distributed as dist
dist.init_process_group()
r = dist.get_rank()
if r == 1:
    raise RuntimeError("rank 1 stops here")
if r == 2:
    time.sleep(1.0)  # busy when rank 1 fails: it hears of it in its next collective
""" + WAIT_AND_REPORT


@pytest.mark.parametrize("backend", ["mpi", "cpu"])
def test_a_failing_rank_stops_every_rank_at_once_under_mpiexec(tmp_path, backend):
    # nothing watches the ranks under mpiexec: without the failure post the others would wait in
    # all_reduce for the 300 s timeout while rank 1 sat in MPI_Finalize
    script = tmp_path / "fail.py"
    script.write_text(FAILING_RANK)
    start = time.monotonic()
    proc = run_mpi(3, [str(script), str(tmp_path)], timeout=120, MINIGRAD_DIST_BACKEND=backend,
                   MINIGRAD_FLIGHT_RECORDER_DIR=str(tmp_path / "fr"))
    took = time.monotonic() - start
    assert proc.returncode != 0 and "was not stopped" not in proc.stdout, proc.stdout
    assert took < 60, took
    assert "RuntimeError: rank 1 stops here" in proc.stderr  # rank 1's own traceback
    # ranks 0 and 2 each raise naming their call and rank 1's failure (on shared memory the
    # second of them may hear it as the first one's abort of their all_reduce, with the cause)
    for r in (0, 2):
        told = (tmp_path / f"rank{r}").read_text()
        assert told.startswith("CollectiveError: all_reduce#1") and "in group [0, 1, 2]" in told
        assert "rank 1 failed: RuntimeError: rank 1 stops here" in told, told


ENDING_RANK = """
import sys, time, numpy as np
import minigrad.distributed as dist
dist.init_process_group()
r = dist.get_rank()
if r == int(sys.argv[1]):
    sys.exit(0)  # ends its program while the others go on to a collective with it
time.sleep(0.5)
""" + WAIT_AND_REPORT


@pytest.mark.parametrize("backend", ["mpi", "cpu"])
@pytest.mark.parametrize("ending", [1, 0])  # rank 0 also serves the job's store
def test_a_rank_ending_its_program_stops_the_others_at_once_under_mpiexec(tmp_path, backend,
                                                                          ending):
    # sys.exit raises no exception that a hook sees: without the exit post the others would wait
    # in all_reduce for the 300 s timeout (and for ever where the ending rank served the store)
    script = tmp_path / "end.py"
    script.write_text(ENDING_RANK)
    start = time.monotonic()
    proc = run_mpi(3, [str(script), str(ending), str(tmp_path)], timeout=120,
                   MINIGRAD_DIST_BACKEND=backend, MINIGRAD_FLIGHT_RECORDER_DIR=str(tmp_path / "fr"))
    took = time.monotonic() - start
    assert proc.returncode != 0 and "was not stopped" not in proc.stdout, proc.stdout
    assert took < 60, took
    # each waiting rank raises naming its call and the rank that ended (on shared memory the
    # second of them may hear it as the first one's abort of their all_reduce, with the cause)
    for r in {0, 1, 2} - {ending}:
        told = (tmp_path / f"rank{r}").read_text()
        assert told.startswith("CollectiveError: all_reduce#1"), told
        assert (f"rank(s) [{ending}] ended their program (sys.exit, or the end of the script) "
                "without joining it") in told, told


NORMAL_END = """
import sys, time, numpy as np
import minigrad.distributed as dist
dist.init_process_group()
r = dist.get_rank()
x = np.ones(3)
dist.all_reduce(x)
if r != int(sys.argv[1]):
    time.sleep(1.0)  # the others end later
with open(f"{sys.argv[2]}/rank{r}", "w") as fh:  # mpiexec may split lines of different ranks
    fh.write(str(x.tolist()))
"""


@pytest.mark.parametrize("first", [0, 2])
def test_ranks_ending_at_different_times_end_the_job_cleanly(tmp_path, first):
    # every rank posts its end; rank 0 serves the store until all have posted, so the last one
    # to end is not left waiting for a store whose process has gone into MPI_Finalize
    script = tmp_path / "normal.py"
    script.write_text(NORMAL_END)
    start = time.monotonic()
    proc = run_mpi(3, [str(script), str(first), str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - start < 60
    for r in range(3):
        assert (tmp_path / f"rank{r}").read_text() == "[3.0, 3.0, 3.0]"
