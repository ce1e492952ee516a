"""The checkpoint's random part: every rank's CPU generator and each GPU generator it has drawn
from continue the same streams after a load (checked on the fake CuPy, two devices)."""

import os

import numpy as np
import pytest
from fakes import fake_cupy

import minigrad as mg
import minigrad.distributed as dist
from minigrad.testing.distributed import run_workers


@pytest.fixture
def fake():
    with fake_cupy.installed(2) as cp:
        yield cp


def _draws(devices):
    return {d: mg.random.normal(size=(5,), dtype="float64", device=d).numpy() for d in devices}


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_gpu_generators_continue_after_a_load(fake, tmp_path):
    devices = ["cpu0", "gpu0", "gpu1"]
    mg.random.seed(3)
    _draws(devices)  # move every stream away from the seed
    path = dist.checkpoint.save({"step": 1}, str(tmp_path / "ckpt"))
    index = dist.checkpoint.read_index(path)
    assert {"__rng__/rank0", "__rng__/rank0/gpu0", "__rng__/rank0/gpu1"} <= set(index["objects"])
    expected = _draws(devices)
    assert not _same(expected, _draws(devices))  # the streams moved on
    mg.random.seed(99)  # fresh generators, another seed: only the checkpoint can restore them
    dist.checkpoint.load({"step": 0}, path)
    assert _same(_draws(devices), expected)
    dist.checkpoint.load({"step": 0}, path, rng=False)
    assert not _same(_draws(devices), expected)


def test_a_gpu_generator_never_drawn_from_is_not_saved(fake, tmp_path):
    mg.random.seed(3)
    _draws(["gpu1"])
    path = dist.checkpoint.save({"step": 1}, str(tmp_path / "ckpt"))
    keys = set(dist.checkpoint.read_index(path)["objects"])
    assert "__rng__/rank0/gpu1" in keys and "__rng__/rank0/gpu0" not in keys


def test_set_state_refuses_a_state_of_another_shape(fake):
    from minigrad.backend.rng import set_state  # noqa: PLC0415

    with pytest.raises(ValueError, match=r"gpu0 generator is \(6,\) uint64, got \(3,\) uint64"):
        set_state("gpu0", np.zeros(3, np.uint64))


def _ranks(root, resume):
    gpu = f"gpu{dist.get_rank()}"
    mg.random.seed(5 + dist.get_rank())  # each rank its own streams
    _draws([gpu])
    if resume:
        mg.random.seed(7)
        dist.checkpoint.load({}, os.path.join(root, "ckpt"))
    else:
        dist.checkpoint.save({}, os.path.join(root, "ckpt"))
    return _draws(["cpu0", gpu])


def test_each_rank_gets_its_own_gpu_stream_back(fake, tmp_path):
    saved = run_workers(_ranks, 2, str(tmp_path), False, timeout=60)
    resumed = run_workers(_ranks, 2, str(tmp_path), True, timeout=60)
    assert not _same(saved[0], {"cpu0": saved[1]["cpu0"], "gpu0": saved[1]["gpu1"]})
    for a, b in zip(saved, resumed):
        assert _same(a, b)
