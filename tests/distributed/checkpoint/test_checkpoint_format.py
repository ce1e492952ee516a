"""dist.checkpoint: the logical sharded format, everything a run needs, completeness at save."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from ckpt_helpers import adam, batch, manager, mlp, params, train_step

import minigrad as mg
import minigrad.distributed as dist
import minigrad.optimizer as optim
from minigrad.amp import GradScaler
from minigrad.data import DataLoader
from minigrad.data.dataset import ArrayDataset, StreamDataset
from minigrad.data.sampler import Infinite, RandomSampler
from minigrad.distributed.checkpoint import saving
from minigrad.distributed.checkpoint.pieces import (
    Box,
    Shard,
    assemble,
    boxes,
    check_coverage,
    flat_boxes,
)
from minigrad.testing.distributed import run_workers


# -- pieces --------------------------------------------------------------------------------------
def test_coverage_accepts_exact_cover_and_names_gaps_and_overlaps():
    halves = [(Box((0, 0), (2, 4)), "rank 0"), (Box((2, 0), (2, 4)), "rank 1")]
    assert check_coverage("w", (4, 4), halves) is None
    why = check_coverage("w", (4, 4), halves[:1])
    assert "'w'" in why and "8 of its 16" in why
    why = check_coverage("w", (4, 4), halves + [(Box((1, 0), (2, 4)), "rank 2")])
    assert "overlap" in why and "[1:3, 0:4] (rank 2)" in why


def test_chunked_shard_is_cut_into_one_box_per_run():
    local = np.arange(8.0).reshape(4, 2)
    shard = Shard("qkv", (8, 2), local.dtype, (np.array([0, 1, 4, 5]), np.arange(2)),
                  lambda: local, None)
    got = [(b.offsets, b.sizes, part(local).tolist()) for b, part in boxes(shard)]
    assert got == [((0, 0), (2, 2), [[0, 1], [2, 3]]), ((4, 0), (2, 2), [[4, 5], [6, 7]])]


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4), (7,), (1, 1, 6)])
def test_flat_ranges_are_boxes_in_row_major_order(shape):
    full = np.arange(np.prod(shape)).reshape(shape)
    n = full.size
    for start in range(n):
        for stop in range(start, n + 1):
            parts = flat_boxes(shape, start, stop)
            got = np.concatenate([full[tuple(slice(a, a + k) for a, k in
                                             zip(b.offsets, b.sizes))].reshape(-1)
                                  for b in parts] or [np.zeros(0, int)])
            assert got.tolist() == list(range(start, stop)), (start, stop, parts)
            assert len(parts) <= 2 * len(shape) - 1


def test_flat_shards_and_per_dimension_shards_exchange_values():
    """A ZeRO-style flat shard (a range of the flattened tensor) is another sharding of the same
    logical tensor: pieces written by flat shards fill per-dimension shards and the reverse."""
    full = np.arange(15.0).reshape(5, 3)
    written = []
    for lo, hi in [(0, 7), (7, 15)]:
        local = full.reshape(-1)[lo:hi].copy()
        shard = Shard("w", (5, 3), local.dtype, None, lambda a=local: a, None, flat=(lo, hi))
        for box, part in boxes(shard):
            written.append(({"offsets": box.offsets, "sizes": box.sizes}, part(local)))
    assert check_coverage("w", (5, 3), [(Box(p["offsets"], p["sizes"]), "") for p, _ in
                                        written]) is None
    arrays = {id(p): a for p, a in written}
    pieces = [p for p, _ in written]
    rows = Shard("w", (5, 3), full.dtype, (np.arange(1, 4), np.arange(3)), None, None)
    assert np.array_equal(assemble(rows, full.dtype, pieces, lambda p: arrays[id(p)]),
                          full[1:4])
    flat = Shard("w", (5, 3), full.dtype, None, None, None, flat=(2, 13))
    assert np.array_equal(assemble(flat, full.dtype, pieces, lambda p: arrays[id(p)]),
                          full.reshape(-1)[2:13])
    half = Shard("w", (5, 3), full.dtype, None, None, None, flat=(2, 13))
    assert assemble(half, full.dtype, pieces[:1], lambda p: arrays[id(p)]) is None


# -- one process: everything a run needs ---------------------------------------------------------
def _run_state(seed):
    model = mlp(seed)
    opt = adam(model)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    ds = ArrayDataset(np.random.default_rng(0).standard_normal((40, 4)))
    loader = DataLoader(ds, Infinite(RandomSampler(ds, batch_size=8, seed=3)))
    state = {"model": model, "optim": opt, "sched": sched, "scaler": GradScaler(init_scale=8.0),
             "data": loader, "step": 0, "extra": {"seen": np.zeros(2)}}
    return state, manager(model)


def _steps(state, gm, it, start, stop):
    out = []
    for step in range(start, stop):
        (x,) = next(it)
        y = np.tanh(x[:, :4])
        train_step(state["model"], state["optim"], gm, x, y, state["sched"])
        state["step"] = step + 1
        out.append(mg.random.rand(1).item())  # the random stream must continue too
    return out


def test_resume_in_one_process_is_bitwise(tmp_path):
    state, gm = _run_state(0)
    it = iter(state["data"])
    _steps(state, gm, it, 0, 3)
    state["scaler"].scale_factor = 4.0
    state["extra"]["seen"][:] = [3, 7]
    dist.checkpoint.save(state, tmp_path / "step-3")
    draws = _steps(state, gm, it, 3, 6)
    expected = params(state["model"])
    adam_state = state["optim"].state_dict()

    fresh, gm2 = _run_state(seed=9)  # other weights: everything must come from the files
    path = dist.checkpoint.latest(tmp_path)
    assert path == os.path.join(str(tmp_path), "step-3")
    dist.checkpoint.load(fresh, path)
    assert fresh["step"] == 3 and fresh["scaler"].scale_factor == 4.0
    assert fresh["sched"].current_epoch == 3 and fresh["extra"]["seen"].tolist() == [3, 7]
    assert _steps(fresh, gm2, iter(fresh["data"]), 3, 6) == draws
    for name, value in params(fresh["model"]).items():
        assert np.array_equal(value, expected[name]), name
    got = fresh["optim"].state_dict()
    assert got["param_groups"] == adam_state["param_groups"]
    for i, st in adam_state["state"].items():
        assert got["state"][i]["step"] == st["step"] == 6
        assert np.array_equal(got["state"][i]["exp_avg_sq"], st["exp_avg_sq"])


def test_format_is_safetensors_plus_json_index_and_never_pickle(tmp_path):
    state, gm = _run_state(0)
    _steps(state, gm, iter(state["data"]), 0, 1)
    dist.checkpoint.save(state, tmp_path / "c")
    names = sorted(os.listdir(tmp_path / "c"))
    assert names == ["index.json", "rank00000.safetensors"]
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    w = index["tensors"]["model/0.weight"]
    assert w["shape"] == [8, 4] and w["dtype"] == "float64"
    assert w["pieces"][0]["file"] == "rank00000.safetensors" and "crc32" in w["pieces"][0]
    assert index["tensors"]["optim/state/model/0.weight/exp_avg"]["shape"] == [8, 4]
    blob = (tmp_path / "c" / "rank00000.safetensors").read_bytes()
    assert b"pickle" not in blob and not blob.startswith(b"\x80")
    assert (tmp_path / "latest").read_text().strip() == "c"


def test_plan_refuses_missing_or_doubled_pieces_before_writing():
    def proposal(*pieces):
        return {"save_id": "x", "layout": "l", "objects": {},
                "pieces": [["w", [4], "float64", [a], [n]] for a, n in pieces]}

    saving._Plan([proposal((0, 2)), proposal((2, 2))], 0)  # complete
    with pytest.raises(dist.checkpoint.CheckpointError, match="'w'.*2 of its 4"):
        saving._Plan([proposal((0, 2)), proposal()], 0)
    with pytest.raises(dist.checkpoint.CheckpointError, match="'w'.*overlap"):
        saving._Plan([proposal((0, 3)), proposal((2, 2))], 1)


# -- two ranks -----------------------------------------------------------------------------------
def _replicas_save(root):
    model = mlp(0)
    opt = adam(model)
    train_step(model, opt, manager(model), *batch(0))
    dist.checkpoint.save({"model": model, "optim": opt}, os.path.join(root, "a"))
    return sorted(os.listdir(os.path.join(root, "a")))


def test_data_parallel_replicas_write_once(tmp_path):
    files = run_workers(_replicas_save, 2, str(tmp_path))
    assert files[0] == ["index.json", "rank00000.safetensors"]  # rank 1 holds only copies
    index = dist.checkpoint.read_index(str(tmp_path / "a"))
    assert index["world_size"] == 2
    assert {p["file"] for t in index["tensors"].values() for p in t["pieces"]} == {
        "rank00000.safetensors"}


def _incomplete_save(root):
    import minigrad.distributed.checkpoint.state as cs

    pl = mg.placement("cpu", [0, 1])
    w = mg.tensor(np.arange(8.0)).to_global(pl, mg.sbp.broadcast).to_global(sbp=mg.sbp.split(0))
    if dist.get_rank() == 1:  # rank 1 "forgets" its half
        cs.tensor_shard = lambda *a, **k: None
    try:
        dist.checkpoint.save({"w": w}, os.path.join(root, "b"))
    except dist.checkpoint.CheckpointError as exc:
        return str(exc)
    return "saved"


def test_save_with_a_missing_shard_fails_on_every_rank_before_the_index(tmp_path):
    out = run_workers(_incomplete_save, 2, str(tmp_path))
    for msg in out:
        assert "'w'" in msg and "4 of its 8" in msg
    assert not os.path.exists(tmp_path / "b" / "index.json")
    assert not os.path.exists(tmp_path / "b" / "rank00000.safetensors")


def test_consolidate_command_writes_one_full_weights_file(tmp_path):
    run_workers(_replicas_save, 2, str(tmp_path))
    out = tmp_path / "full.safetensors"
    done = subprocess.run(
        [sys.executable, "-m", "minigrad.distributed.checkpoint", "consolidate",
         str(tmp_path / "a"), str(out), "--prefix", "model"],
        capture_output=True, text=True, timeout=120, cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    from safetensors.numpy import load_file
    full = load_file(str(out))
    model = mlp(0)
    opt = adam(model)
    train_step(model, opt, manager(model), *batch(0))
    assert sorted(full) == sorted(params(model))
    for k, v in params(model).items():
        assert np.array_equal(full[k], v), k


def test_loading_into_another_layout_names_both_layouts(tmp_path):
    import logging

    run_workers(_replicas_save, 2, str(tmp_path))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = dist.get_logger()
    logger.addHandler(handler)
    try:
        model = mlp(3)
        dist.checkpoint.load({"model": model, "optim": adam(model)}, str(tmp_path / "a"))
        dist.checkpoint.load({"model": model, "optim": adam(model)}, str(tmp_path / "a"),
                             rng=False)
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records if "resharding" in r.getMessage()]
    assert len(messages) == 2
    assert "saved with world size 2; resharding to world size 1" in messages[0]


def _unsavable_on_rank_1(root):
    state = {"step": 1, "note": object() if dist.get_rank() == 1 else "fine"}
    try:
        dist.checkpoint.save(state, os.path.join(root, "c"))
    except dist.checkpoint.CheckpointError as exc:
        return str(exc)
    return "saved"


def test_a_value_one_rank_cannot_save_fails_every_rank(tmp_path):
    for msg in run_workers(_unsavable_on_rank_1, 2, str(tmp_path), timeout=60):
        assert "rank 1: dist.checkpoint.save: cannot store builtins.object at 'note'" in msg
    assert not os.path.exists(tmp_path / "c" / "index.json")


def test_a_stream_loader_in_the_state_is_refused_with_the_reason(tmp_path):
    class Numbers(StreamDataset):
        def __iter__(self):
            yield from (np.array([float(i)]) for i in range(4))

    with pytest.raises(dist.checkpoint.CheckpointError,
                       match=r"DataLoader.state_dict: a StreamDataset has no position.*"
                             r"Leave this loader out of the checkpoint's state"):
        dist.checkpoint.save({"data": DataLoader(Numbers()), "step": 1}, str(tmp_path / "c"))
    assert not os.path.exists(tmp_path / "c" / "index.json")
