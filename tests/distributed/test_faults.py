"""Faults and bad input: failing/killed ranks, skipped and mismatched collectives, hostile store
traffic, leaks. Every scenario must end quickly with an error that names the culprit."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.runtime import launcher as launcher_module
from minigrad.testing.distributed import run_workers
from minigrad.testing.wait import wait_until


def _mg_shm_files() -> set[str]:
    return set(glob.glob("/dev/shm/mg-*"))


def test_rank_that_raises_is_named_with_traceback():
    def body():
        comm.all_reduce(np.ones(3))
        if dist.get_rank() == 1:
            raise ValueError("boom from the model")
        comm.all_reduce(np.ones(3))  # rank 0 would wait here forever without the launcher

    t = time.monotonic()
    with pytest.raises(dist.LaunchError, match="rank 1 failed") as info:
        run_workers(body, 2, timeout=30)
    assert time.monotonic() - t < 10
    assert info.value.rank == 1
    assert "ValueError: boom from the model" in str(info.value) and "Traceback" in str(info.value)


def test_rank_killed_by_sigkill_mid_step():
    def body():
        for step in range(1000):
            comm.all_reduce(np.ones(1000))
            if step == 20 and dist.get_rank() == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    t = time.monotonic()
    with pytest.raises(dist.LaunchError, match="rank 2") as info:
        run_workers(body, 3, timeout=240)
    assert time.monotonic() - t < 120  # the death was noticed, not the job's timeout
    assert "SIGKILL" in str(info.value)


def test_skipped_collective_times_out_naming_op_and_seq(tmp_path):
    done = str(tmp_path / "rank0-done")

    def body():
        r = dist.get_rank()
        comm.all_reduce(np.ones(2))
        if r == 1:  # alive, but skips collective #2 until rank 0 gave up on it
            wait_until(lambda: os.path.exists(done), "rank 0's timeout")
            return "skipped"
        try:
            comm.broadcast(np.ones(2), root=0)
        except dist.CollectiveTimeoutError as exc:
            return str(exc)
        finally:
            open(done, "w").close()
        return "no error"

    t = time.monotonic()
    msg, skipped = run_workers(body, 2, timeout=240, collective_timeout=2)
    assert skipped == "skipped" and 1.9 < time.monotonic() - t
    assert "broadcast#2" in msg and "timed out after 2 s" in msg and "[1]" in msg


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_mismatched_calls_raise_on_every_rank(monkeypatch, transport):
    monkeypatch.setenv("MINIGRAD_DIST_TRANSPORT", transport)

    def body():
        r = dist.get_rank()
        msgs = []
        x = np.ones((3, 4), np.float32) if r == 0 else np.ones((4, 3), np.float32)
        try:
            comm.all_reduce(x)
        except dist.CollectiveMismatchError as exc:
            msgs.append(str(exc))
        return msgs

    res = run_workers(body, 3, timeout=30)
    for msgs in res:
        assert len(msgs) == 1
        assert "rank 0 called all_reduce#1" in msgs[0] and "[3, 4]" in msgs[0]
        assert "rank 1 called all_reduce#1" in msgs[0] and "[4, 3]" in msgs[0]


def test_different_ops_and_dtypes_mismatch():
    def body():
        r = dist.get_rank()
        out = []
        try:
            if r == 0:
                comm.all_reduce(np.ones(3, np.float32))
            else:
                comm.all_reduce(np.ones(3, np.float64))
        except dist.CollectiveMismatchError as exc:
            out.append(str(exc))
        return out

    for msgs in run_workers(body, 2, timeout=30):
        assert "'float32'" in msgs[0] and "'float64'" in msgs[0]  # named, never '<f4'
        assert "<f4" not in msgs[0]

    def body():
        try:
            if dist.get_rank() == 0:
                comm.all_reduce(np.ones(3))
            else:
                comm.broadcast(np.ones(3), root=0)
        except dist.CollectiveMismatchError as exc:
            return str(exc)

    for msg in run_workers(body, 2, timeout=30):
        assert "all_reduce#1" in msg and "broadcast#1" in msg


def check_strings_body() -> dict:
    """Every collective with a ``check`` string: equal strings go through (the result is right),
    different ones raise CollectiveMismatchError (rank 0 passes "step 0", the others "step 1").
    A fresh group per collective: after a mismatch the cpu backend's group is unusable. Also run
    under mpiexec by ``mpi_job.py``."""
    r, n = dist.get_rank(), dist.get_world_size()
    x = np.arange(6.0).reshape(2, 3) + r
    calls = {
        "all_reduce": lambda g, c: comm.all_reduce(x.copy(), group=g, check=c),
        "broadcast": lambda g, c: comm.broadcast(x.copy(), 0, g, check=c),
        "reduce": lambda g, c: comm.reduce(x.copy(), root=0, group=g, check=c),
        "all_gather": lambda g, c: comm.all_gather(x, g, check=c),
        "gather": lambda g, c: comm.gather(x, 0, g, check=c),
        "scatter": lambda g, c: comm.scatter([x + j for j in range(n)] if r == 0 else None, 0,
                                             g, check=c),
        "reduce_scatter": lambda g, c: comm.reduce_scatter([x] * n, group=g, check=c),
        "all_to_all": lambda g, c: comm.all_to_all([x + j for j in range(n)], g, check=c),
        "all_gather (async)": lambda g, c: comm.all_gather(x, g, async_op=True, check=c).wait(),
        "barrier": lambda g, c: comm.barrier(g, check=c),
    }
    out = {}
    for name, call in calls.items():
        g = dist.new_group(list(range(n)))
        result = call(g, "step 0")
        try:
            call(g, f"step {min(r, 1)}")
            out[name] = (result, None, None)
        except dist.CollectiveMismatchError as exc:
            out[name] = (result, str(exc), [c.get("check") for c in exc.calls])
    return out


def check_strings(out: dict, r: int, n: int) -> None:
    """Rank ``r``'s results of :func:`check_strings_body`."""
    xs = [np.arange(6.0).reshape(2, 3) + j for j in range(n)]
    expected = {"all_reduce": sum(xs), "broadcast": xs[0], "reduce": sum(xs) if r == 0 else None,
                "all_gather": xs, "gather": xs if r == 0 else None, "scatter": xs[0] + r,
                "reduce_scatter": sum(xs), "all_to_all": [x + r for x in xs],
                "all_gather (async)": xs, "barrier": None}
    assert list(out) == list(expected)
    for name, (result, msg, checks) in out.items():
        op = name.split()[0]
        if expected[name] is None:
            assert result is None, name
        else:
            np.testing.assert_array_equal(np.asarray(result), np.asarray(expected[name]), name)
        assert msg is not None, f"rank {r}: {name} with different check strings did not raise"
        assert checks == ["step 0"] + ["step 1"] * (n - 1), (name, checks)
        assert f"rank 0 called {op}#2(" in msg and "check='step 0'" in msg, msg
        assert f"rank {n - 1} called {op}#2(" in msg and "check='step 1'" in msg, msg


def test_different_check_strings_raise_on_every_rank():
    for r, out in enumerate(run_workers(check_strings_body, 3, timeout=60)):
        check_strings(out, r, 3)


def test_garbage_and_wrong_secret_do_not_disturb_the_job():
    def body():
        client = dist.get_client()
        r = dist.get_rank()
        comm.all_reduce(np.ones(2))
        if r == 0:
            for payload in (b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", os.urandom(300)):
                with socket.create_connection((client.host, client.port), timeout=5) as s:
                    s.recv(40)
                    try:  # the store may drop us before we finish: that is the point
                        s.sendall(payload)
                        s.shutdown(socket.SHUT_WR)
                        s.recv(10)
                    except OSError:
                        pass
            with pytest.raises(dist.StoreError, match="wrong secret"):
                dist.Client(client.host, client.port, secret="not-the-secret", timeout=5)
        client.barrier("after-attack", 2)
        client.user_set(f"k{r}", r * 10)
        other = client.user_get(f"k{1 - r}", timeout=10)
        return other, comm.all_reduce(np.full(2, r + 1.0))

    res = run_workers(body, 2, timeout=30)
    assert res[0][0] == 10 and res[1][0] == 0
    for _, y in res:
        np.testing.assert_array_equal(y, [3.0, 3.0])


def test_port_already_in_use_is_a_clear_error():
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", 0))
    blocker.listen(1)
    port = blocker.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"port {port}"):
            dist.Server(port)

        @dist.launcher(n_gpus=2, device_type="cpu", port=port)
        def job():
            return 1

        with pytest.raises(OSError, match=f"port {port}"):
            job()
    finally:
        blocker.close()


def test_no_shared_memory_left_behind(monkeypatch):
    # only this test's jobs count (another suite may run on the machine at the same time)
    jobs = []
    start = launcher_module.start_job_store

    def recording_start(*args):
        server, port, secret, job = start(*args)
        jobs.append(job)
        return server, port, secret, job

    monkeypatch.setattr(launcher_module, "start_job_store", recording_start)

    def body():
        comm.send(np.ones(10), (dist.get_rank() + 1) % 2)
        comm.recv((dist.get_rank() + 1) % 2)
        if dist.get_rank() == 1:
            comm.send(np.ones(10), 0)  # never received: its ring stays unclaimed
        return comm.all_reduce(np.ones(5))

    run_workers(body, 2, timeout=30)
    with pytest.raises(dist.LaunchError):
        run_workers(lambda: os.kill(os.getpid(), signal.SIGKILL), 2, timeout=30)
    assert len(jobs) == 2
    assert {f for f in _mg_shm_files() for job in jobs if f.startswith(f"/dev/shm/mg-{job}-")} \
        == set()


@pytest.mark.stress
@pytest.mark.timeout(20 * 600)
def test_stress_multiprocess_suite_20_times():
    """``pytest -m stress``: the whole multi-process suite (distributed + examples) 20 times in a
    row, each run in a fresh interpreter under a hard timeout: any hang or flaky failure fails."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "tests/distributed", "tests/examples", "-m", "not stress"]
    for i in range(20):
        try:
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {i + 1}/20 hung (no result after 600 s)")
        assert proc.returncode == 0, f"run {i + 1}/20 failed:\n{proc.stdout[-3000:]}"
