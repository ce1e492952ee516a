"""Elastic restarts: a rank SIGKILLed in a ``--max_restarts 2`` job, the group restarted with a
new rendezvous, the program resuming from ``dist.checkpoint.latest``: the final parameters equal
the uninterrupted run's bitwise. A SIGKILL during a save leaves ``latest`` naming the previous
complete checkpoint, which loads."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from layouts import Run

import minigrad.distributed as dist
import minigrad.distributed.checkpoint.storage as storage
from minigrad.distributed.runtime.launcher import launcher

HERE = os.path.dirname(os.path.abspath(__file__))
STOP = 5


def _launch(root, kill_at, out, max_restarts):
    cmd = [sys.executable, "-m", "minigrad.distributed.launch", "--nproc_per_node", "2",
           "--max_restarts", str(max_restarts), os.path.join(HERE, "elastic_train.py"),
           str(root), str(STOP), str(kill_at), str(out)]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "MINIGRAD_DIST_TIMEOUT": "60"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_sigkilled_rank_restarts_and_finishes_bitwise(tmp_path):
    kill_at = int(np.random.default_rng().integers(1, STOP))  # a random step, never step 0
    ref = _launch(tmp_path / "ref", -1, tmp_path / "ref.npz", 0)
    assert ref.returncode == 0, ref.stderr
    got = _launch(tmp_path / "run", kill_at, tmp_path / "run.npz", 2)
    assert got.returncode == 0, got.stderr
    assert "restarting the group (restart 1 of 2)" in got.stderr
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "run.npz")
    assert int(b["restart"]) == 1 and int(b["resumed_from"]) == kill_at, kill_at
    assert int(a["restart"]) == 0 and int(a["resumed_from"]) == 0
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert np.array_equal(a[name], b[name]), (name, kill_at)


def test_without_restarts_the_failure_ends_the_job(tmp_path):
    got = _launch(tmp_path / "run", 2, tmp_path / "run.npz", 0)
    assert got.returncode == 1 and "rank 1" in got.stderr and "SIGKILL" in got.stderr
    assert not os.path.exists(tmp_path / "run.npz")


# -- @dist.launcher(max_restarts=...) and a SIGKILL in the middle of a save -----------------------
def _train_with_kill_in_save(root, stop, kill_in_save_of):
    restart = int(os.environ["MINIGRAD_RESTART_COUNT"])
    job = Run("data2")
    state, latest = job.resume(root)
    resumed = (latest and os.path.basename(latest), state["step"])
    if restart == 0 and dist.get_rank() == 0:
        real = storage.write_pieces

        def write_then_die(directory, rank, pieces):  # rank 0's file is written, no index
            record = real(directory, rank, pieces)
            if directory.endswith(f"step-{kill_in_save_of}"):
                os.kill(os.getpid(), signal.SIGKILL)
            return record

        import minigrad.distributed.checkpoint.saving as saving
        saving.write_pieces = write_then_die
    for step in range(state["step"], stop):
        job.step(step)
        state["step"] = step + 1
        dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    return restart, resumed, {k: np.asarray(v) for k, v in job.model.state_dict().items()}


def test_sigkill_during_a_save_keeps_latest_at_the_previous_checkpoint(tmp_path):
    job = launcher(_train_with_kill_in_save, n_gpus=2, device_type="cpu", job_timeout=120,
                   max_restarts=1)
    out = job(str(tmp_path / "run"), 4, 3)
    ref = launcher(_train_with_kill_in_save, n_gpus=2, device_type="cpu", job_timeout=120)(
        str(tmp_path / "ref"), 4, 0)
    for (restart, resumed, params), (_, _, expected) in zip(out, ref):
        assert restart == 1 and resumed == ("step-2", 2)  # step-3 was never committed
        for k in expected:
            assert np.array_equal(params[k], expected[k]), k


def test_sigkill_during_a_save_without_restarts(tmp_path):
    root = tmp_path / "run"
    job = launcher(_train_with_kill_in_save, n_gpus=2, device_type="cpu", job_timeout=120)
    with pytest.raises(dist.LaunchError, match="rank 0"):
        job(str(root), 4, 2)
    assert os.path.exists(root / "step-2" / "rank00000.safetensors")
    assert not os.path.exists(root / "step-2" / "index.json")
    assert (root / "latest").read_text().strip() == "step-1"
    assert dist.checkpoint.latest(root) == str(root / "step-1")
    state = Run("single").state(0)
    dist.checkpoint.load(state, dist.checkpoint.latest(root))
    assert state["step"] == 1


def test_max_restarts_must_be_a_count():
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0, got -1"):
        launcher(_train_with_kill_in_save, n_gpus=2, device_type="cpu", max_restarts=-1)
