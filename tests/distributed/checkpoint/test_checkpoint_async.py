"""async_save: returns a future at once, training goes on changing the tensors, the checkpoint
holds the values of the moment it was asked for, and the future says when it is committed."""

import os

import numpy as np
from layouts import Run

import minigrad.distributed as dist
from minigrad.testing.distributed import run_workers


def _async_then_train(root):
    import threading

    import minigrad.distributed.checkpoint.saving as saving

    trained, real = threading.Event(), saving.write_pieces

    def write_after_training(*args):  # the writer runs only once training went on
        assert trained.wait(60)
        return real(*args)

    job = Run("data2")
    state = job.state(0)
    for step in range(2):
        job.step(step)
    state["step"] = 2
    dist.checkpoint.save(state, os.path.join(root, "sync"))
    saving.write_pieces = write_after_training
    future = dist.checkpoint.async_save(state, os.path.join(root, "async"))
    for step in range(2, 4):  # changes the parameters (in place) while the files are written
        job.step(step)
    assert not future.done()
    trained.set()
    path = future.result(timeout=60)
    return path, future.done()


def test_async_save_holds_the_values_at_the_call_and_commits(tmp_path):
    out = run_workers(_async_then_train, 2, str(tmp_path), timeout=120)
    assert [p for p, _ in out] == [str(tmp_path / "async")] * 2 and all(d for _, d in out)
    assert dist.checkpoint.latest(tmp_path) == str(tmp_path / "async")
    assert not [n for n in os.listdir(tmp_path / "async") if n.endswith(".manifest.json")]
    sync = dist.checkpoint.full_tensors(str(tmp_path / "sync"))
    done = dist.checkpoint.full_tensors(str(tmp_path / "async"))
    assert sorted(sync) == sorted(done)
    for key in sync:
        assert np.array_equal(sync[key], done[key]), key
    a = dist.checkpoint.read_index(str(tmp_path / "sync"))["objects"]
    b = dist.checkpoint.read_index(str(tmp_path / "async"))["objects"]
    assert {k: v for k, v in a.items() if "__rng__" not in k} == {
        k: v for k, v in b.items() if "__rng__" not in k}
