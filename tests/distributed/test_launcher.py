"""The fork launcher and the ``python -m minigrad.distributed.launch`` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.runtime import launch
from minigrad.distributed.runtime.launcher import cuda_initialized, visible_gpu_count
from minigrad.testing.distributed import run_workers
from minigrad.testing.wait import wait_until


def test_decorator_forms_and_rank_ordered_results(monkeypatch):
    def body(k):
        return dist.get_rank() * k, dist.get_world_size(), os.environ["LOCAL_RANK"]

    gpus = visible_gpu_count()
    if gpus and cuda_initialized():  # an earlier GPU test of this process initialised CUDA
        with pytest.raises(RuntimeError, match="CUDA was already initialised in the parent"):
            dist.launcher(body)(10)
    else:
        n = gpus or 2  # one rank per visible GPU, else 2 CPU processes
        assert dist.launcher(body)(10) == [(10 * r, n, str(r)) for r in range(n)]

    @dist.launcher(device_type="cpu")
    def plain(k):
        return body(k)

    assert plain(10) == [(0, 2, "0"), (10, 2, "1")]  # CPU default: 2 processes

    monkeypatch.setenv("MINIGRAD_NPROC", "3")

    @dist.launcher(device_type="cpu")
    def from_env():
        return os.environ["RANK"], os.environ["WORLD_SIZE"], dist.get_backend()

    assert from_env() == [(str(r), "3", "auto") for r in range(3)]

    @dist.launcher(n_gpus=1, device_type="cpu")
    def single():
        return dist.is_distributed(), comm.all_reduce(np.arange(3)).tolist()

    assert single() == [(True, [0, 1, 2])]


def test_large_return_values_do_not_deadlock():
    def body():
        return np.full(3_000_000, dist.get_rank(), np.float64)  # 24 MB per rank through a pipe

    res = run_workers(body, 2, timeout=30)
    assert res[0].sum() == 0 and res[1].sum() == 3_000_000


def test_blas_threads_are_shared_fairly():
    def body():
        import ctypes

        paths = {ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln.lower()}
        counts = []
        for p in paths:
            lib = ctypes.CDLL(p)
            for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
                if hasattr(lib, sym):
                    counts.append(getattr(lib, sym)())
        return counts, os.environ.get("OMP_NUM_THREADS")

    cores = os.cpu_count() or 1
    for counts, omp in run_workers(body, 2):
        assert omp == str(max(1, cores // 2))
        assert all(c == max(1, cores // 2) for c in counts)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_no_orphans_after_failure(tmp_path):
    def body():
        r = dist.get_rank()
        child = subprocess.Popen(["sleep", "600"])  # a grandchild, e.g. a data-loader worker
        (tmp_path / f"pids{r}").write_text(f"{os.getpid()} {child.pid}")
        comm.barrier()
        if r == 0:
            raise RuntimeError("first rank fails")
        time.sleep(600)  # killed by the launcher long before

    t = time.monotonic()
    with pytest.raises(dist.LaunchError, match="first rank fails"):
        run_workers(body, 3, timeout=240)
    assert time.monotonic() - t < 120  # the failure ended the job, not its timeout
    pids = [int(p) for r in range(3) for p in (tmp_path / f"pids{r}").read_text().split()]
    # killed processes may take a moment to be gone: wait for that, not for a fixed time
    wait_until(lambda: not [p for p in pids if _running(p)], "the killed ranks and grandchildren")


def test_job_timeout_kills_everything():
    def body():
        time.sleep(600)

    t = time.monotonic()
    with pytest.raises(dist.LaunchError, match="timed out after 1 s"):
        run_workers(body, 2, timeout=1)
    assert time.monotonic() - t < 120  # far below the ranks' 600 s: they were killed


def test_cuda_not_initialised_here():
    assert cuda_initialized() is False


SCRIPT = textwrap.dedent(
    """
    import sys, os
    import numpy as np
    import minigrad.distributed as dist
    from minigrad.distributed import comm

    dist.init_process_group()
    r = dist.get_rank()
    y = comm.all_reduce(np.full(4, r + 1.0))
    print("rank", r, "local", os.environ["LOCAL_RANK"], "sum", y[0], "args", sys.argv[1:])
    if "--fail" in sys.argv and r == 1:
        raise SystemExit(3)
    """
)


def test_launch_cli(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    logdir = tmp_path / "logs"
    cmd = [sys.executable, "-m", "minigrad.distributed.launch", "--nproc_per_node", "2",
           "--logdir", str(logdir), str(script), "--lr", "0.1"]
    cpu_only = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # 2 CPU ranks also on a 1-GPU machine
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=cpu_only)
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        log = (logdir / f"rank{r}.log").read_text()
        assert f"rank {r} local {r} sum 3.0 args ['--lr', '0.1']" in log

    proc = subprocess.run(cmd + ["--fail"], capture_output=True, text=True, timeout=60,
                          env=cpu_only)
    assert proc.returncode == 1
    assert "rank 1" in proc.stderr and "exit code 3" in proc.stderr


def test_launch_cli_runs_more_ranks_than_gpus_on_the_cpu(monkeypatch, capfd, tmp_path):
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('device', os.environ['MINIGRAD_DEFAULT_DEVICE'])\n")
    monkeypatch.setattr(launch, "visible_gpu_count", lambda device_type: 2)
    assert launch.main(["--nproc_per_node", "3", str(script)]) == 0
    out, err = capfd.readouterr()
    assert "launch: 3 ranks per node but 2 visible GPU(s)" in err
    assert out.count("device cpu0") == 3
