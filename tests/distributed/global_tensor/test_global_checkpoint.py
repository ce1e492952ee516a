"""Logical checkpoints: saved at 2 ranks with split(0), loaded at 3 ranks as split(1) (and into a
module), the logical values are equal; saving a global tensor needs global_dst_rank."""

import numpy as np
import pytest
from global_tensor_helpers import assemble

import minigrad as mg
import minigrad.distributed as dist
import minigrad.module as M
from minigrad.testing.distributed import run_workers

W = np.random.default_rng(0).standard_normal((7, 5))
B = np.random.default_rng(1).standard_normal((7,))


def _model():
    layer = M.Linear(5, 7)
    layer.weight = mg.Parameter(W.copy())
    layer.bias = mg.Parameter(B.copy())
    return layer


def _save(path):
    P = mg.placement("cpu", [0, 1])
    layer = _model().to_global(P, mg.sbp.broadcast)
    layer.weight = mg.Parameter(layer.weight.to_global(sbp=mg.sbp.split(0)))
    extra = mg.tensor(W, dtype="float64", placement=P, sbp=mg.sbp.split(1))
    try:
        mg.save({"w": extra}, path + ".refused")
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    mg.save({"model": layer.state_dict(), "extra": extra, "step": 3}, path, global_dst_rank=0)
    return refused


def _load(path):
    P = mg.placement("cpu", [0, 1, 2])
    state = mg.load(path, global_src_rank=0)
    w = state["model"]["weight"].to_global(P, mg.sbp.broadcast).to_global(sbp=mg.sbp.split(1))
    layer = _model()
    layer.weight.set_value(np.zeros_like(W))
    layer.to_global(P, mg.sbp.broadcast).to_global(P, mg.sbp.split(0))  # a zeroed model's rows
    layer.load_state_dict(state["model"])
    return dict(rank=dist.get_rank(), w=w.to_local().numpy(), step=state["step"],
                extra=state["extra"].numpy(), is_global=state["extra"].is_global,
                layer_w=layer.weight.to_local().numpy(), layer_b=layer.bias.to_local().numpy())


def test_save_at_two_ranks_load_at_three(tmp_path):
    path = str(tmp_path / "ckpt.mgc")
    refused = run_workers(_save, 2, path)
    for msg in refused:
        assert "Please set global_dst_rank in `mg.save` to save global tensor" in msg
    assert not (tmp_path / "ckpt.mgc.refused").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.mgc"]  # one writer
    plain = mg.load(path)
    np.testing.assert_array_equal(plain["model"]["weight"].numpy(), W)  # logical, not a piece
    out = run_workers(_load, 3, path)
    for o in out:
        assert o["step"] == 3 and not o["is_global"]
        np.testing.assert_array_equal(o["extra"], W)
    pieces = {o["rank"]: o["w"] for o in out}
    np.testing.assert_array_equal(assemble(pieces, ("S1",), [0, 1, 2], W.shape), W)
    rows = {o["rank"]: o["layer_w"] for o in out}
    np.testing.assert_array_equal(assemble(rows, ("S0",), [0, 1, 2], W.shape), W)
    bias = {o["rank"]: o["layer_b"] for o in out}
    np.testing.assert_array_equal(assemble(bias, ("S0",), [0, 1, 2], B.shape), B)


def test_save_without_distributed_is_unchanged(tmp_path):
    mg.save({"a": mg.tensor([1.0, 2.0])}, str(tmp_path / "a.mgc"), global_dst_rank=0)
    assert mg.load(str(tmp_path / "a.mgc"), global_src_rank=0)["a"].tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="local tensor, only global tensors have a placement"):
        mg.tensor([1.0]).placement  # noqa: B018


def _save_shared(path):
    P = mg.placement("cpu", [0, 1])
    w = mg.tensor(W, dtype="float64", placement=P, sbp=mg.sbp.split(0))
    mg.save({"a": w, "b": w, "c": [w]}, path, global_dst_rank=0)  # one gather, on every rank
    comm_after = mg.tensor(B, dtype="float64", placement=P, sbp=mg.sbp.split(0))
    return comm_after.to_global(sbp=mg.sbp.broadcast).to_local().numpy()


def test_a_global_tensor_saved_twice_is_gathered_once_on_every_rank(tmp_path):
    path = str(tmp_path / "shared.mgc")
    for after in run_workers(_save_shared, 2, path, timeout=60):
        np.testing.assert_array_equal(after, B)  # the ranks are still in step afterwards
    state = mg.load(path)
    for value in (state["a"], state["b"], state["c"][0]):
        np.testing.assert_array_equal(value.numpy(), W)
