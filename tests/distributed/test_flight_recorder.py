"""The flight recorder (every rank dumps its last calls when a collective fails; rank 0 and the
command line print which rank did what) and the comm log (exact bytes and counts of a
data-parallel run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
from minigrad.distributed import LaunchError, comm
from minigrad.distributed.comm import recorder
from minigrad.testing.distributed import run_workers


def _rank1_skips_an_all_reduce():
    x = np.ones(3) * (dist.get_rank() + 1)
    comm.all_reduce(x)
    comm.broadcast(x, root=0)
    if dist.get_rank() == 0:
        comm.all_reduce(x)  # rank 1 never makes this call
    else:
        comm.barrier()  # LAST CALL OF RANK 1
    return x


def _line_of(marker: str) -> int:
    with open(__file__) as fh:
        return next(i for i, line in enumerate(fh, 1) if marker in line and "def " not in line
                    and "_line_of" not in line)


def test_a_skipped_collective_is_named_by_rank_op_seq_and_line(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(recorder.DIR_ENV, str(tmp_path))
    with pytest.raises(LaunchError, match="CollectiveMismatchError"):
        run_workers(_rank1_skips_an_all_reduce, 2, timeout=60)
    assert sorted(os.listdir(tmp_path)) == ["analysis.txt", "rank0.json", "rank1.json"]
    text = recorder.analyze(str(tmp_path))
    barrier_line = f"test_flight_recorder.py:{_line_of('LAST CALL OF RANK 1')}"
    assert "rank 1 never called seq 3 all_reduce" in text, text
    assert "its last call: seq 3 barrier (group [0, 1], not finished)" in text, text
    assert barrier_line in text, text
    # rank 0 printed the same analysis when it failed
    assert (tmp_path / "analysis.txt").read_text().strip() == text
    assert "rank 1 never called seq 3 all_reduce" in capfd.readouterr().err
    cli = subprocess.run([sys.executable, "-m", "minigrad.distributed.flight_recorder",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and cli.stdout.strip() == text


def _data_parallel_steps(steps: int):
    net = M.Sequential(M.Linear(6, 5), M.ReLU(), M.Linear(5, 3))
    dist.bcast_list_(net.tensors())
    # buckets of one byte: every parameter in a bucket of its own
    gm = ad.GradManager().attach(net.parameters(), callbacks=[
        dist.make_allreduce_cb("mean", bucket_size_mb=1 / 2 ** 20)])
    dist.comm_log.enable()
    dist.comm_log.clear()
    rng = np.random.default_rng(dist.get_rank())
    for _ in range(steps):
        with gm:
            gm.backward(net(mg.tensor(rng.standard_normal((4, 6)).astype("float32"))).sum())
    rows = {size: row for (op, size), row in dist.comm_log.totals().items() if op == "all_reduce"}
    text = dist.comm_log.summary(print_out=False)
    dist.comm_log.disable()
    return rows, text, [p.size * 4 for p in net.parameters()]


def test_comm_log_counts_the_gradient_bytes_of_a_data_parallel_run():
    steps = 3
    for rows, text, param_bytes in run_workers(_data_parallel_steps, 2, steps):
        assert sum(r["bytes"] for r in rows.values()) == sum(param_bytes) * steps
        assert sum(r["count"] for r in rows.values()) == len(param_bytes) * steps
        assert sorted(rows) == sorted(set(param_bytes))
        assert text.splitlines()[0].split()[:2] == ["op", "msg"] and "all_reduce" in text


def test_the_ring_keeps_the_last_calls_only():
    keep = recorder._ring.maxlen
    before = len(recorder.recent())
    for _ in range(keep + 5):
        recorder.begin("probe", (0,), None, [np.zeros(2)], "cpu")
    probes = [r for r in recorder.recent() if r.kind == "probe"]
    assert len(recorder.recent()) == keep and len(probes) == keep and before <= keep
    assert probes[-1].caller.endswith(f"test_flight_recorder.py:{_line_of('recorder.begin(')}")


def test_the_comm_log_is_off_by_default_and_on_with_the_environment_variable():
    code = "import minigrad.distributed as dist; print(dist.comm_log.enabled)"
    for value, expected in ((None, "False"), ("1", "True")):
        env = {k: v for k, v in os.environ.items() if k != recorder.LOG_ENV}
        if value is not None:
            env[recorder.LOG_ENV] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr


def test_rank_0_does_not_wait_for_the_dumps_of_ranks_that_ended_their_program(tmp_path,
                                                                            monkeypatch):
    # in an MPI job a rank that ended (sys.exit) never dumps: rank 0 analyses without waiting
    # PEER_WAIT for it, once the ranks still running have dumped
    from minigrad.distributed.runtime import failures  # noqa: PLC0415
    from minigrad.distributed.runtime.store import Client, Server  # noqa: PLC0415

    monkeypatch.setenv(recorder.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(recorder, "_job", dict(recorder._job))  # restored after the test
    server = Server(0, secret="s")
    client = Client("127.0.0.1", server.port, secret="s", timeout=5)
    try:
        recorder.configure("job1", 1, 3)
        recorder.dump("rank 1's collective failed")  # rank 1 is running and dumped
        client.set("job1/exited/2", 1)  # rank 2 ended its program
        recorder.configure("job1", 0, 3)
        failures.arm(client, "job1", 0, 3, abort=lambda: None, dump=lambda reason: None)
        start = time.monotonic()
        recorder.on_failure(RuntimeError("boom"))
        assert time.monotonic() - start < recorder.PEER_WAIT / 2
        assert (tmp_path / "analysis.txt").exists()
    finally:
        failures.disarm()
        client.close()
        server.close()
