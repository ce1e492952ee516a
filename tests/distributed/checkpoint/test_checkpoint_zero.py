"""A sharded optimizer state (ZeRO) is just another sharding of the logical tensors: an optimizer
that keeps momentum only for its range of each flattened parameter (``state_shard``) saves flat
shards that load into another number of ranks, or into a plain optimizer, and the reverse.

``RangeMomentumSGD`` is ZeRO-1 in miniature (written here, as a stand-in until the project's
ZeroRedundancyOptimizer lands): the same arithmetic as ``optim.SGD(momentum=...)`` element by
element, each rank updating its range and all-gathering the parameters."""

import os

import numpy as np
import pytest
from ckpt_helpers import batch, manager, mlp

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

LR, MU, K, N = 0.1, 0.9, 2, 4


class RangeMomentumSGD(optim.SGD):
    """Momentum SGD whose momentum buffers are sharded over the ranks by flat ranges."""

    def __init__(self, params):
        super().__init__(params, lr=LR, momentum=MU)
        self.buffers = {}

    def in_order(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_shard(self, p):
        n, r, w = p.size, dist.get_rank(), dist.get_world_size()
        return n * r // w, n * (r + 1) // w

    def step(self):
        for p in self.in_order():
            lo, hi = self.state_shard(p)
            g = p.grad.numpy().reshape(-1)[lo:hi]
            buf = self.buffers.get(id(p))
            if buf is None:
                buf = g.copy()
            else:
                buf *= MU
                buf += g
            self.buffers[id(p)] = buf
            mine = p.numpy().reshape(-1)[lo:hi] - LR * buf
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, mine)
            p.set_value(np.concatenate(parts).reshape(p.shape))
        return self

    def state_dict(self):
        out = super().state_dict()
        out["state"] = {i: {"momentum_buffer": self.buffers[id(p)].copy()}
                        for i, p in enumerate(self.in_order()) if id(p) in self.buffers}
        return out

    def load_state_dict(self, state):
        super().load_state_dict({"param_groups": state["param_groups"], "state": {}})
        params = self.in_order()
        self.buffers = {id(params[int(i)]): np.array(st["momentum_buffer"])
                        for i, st in state["state"].items()}
        return self


def _train(sharded, stop, root=None, save_at=None, resume=False):
    model = mlp(0)
    opt = RangeMomentumSGD(model.parameters()) if sharded else optim.SGD(
        model.parameters(), lr=LR, momentum=MU)
    gm = manager(model)
    state = {"model": model, "optim": opt, "step": 0}
    if resume:
        dist.checkpoint.load(state, dist.checkpoint.latest(root))
    for step in range(state["step"], stop):
        x, y = batch(step)  # every rank the whole batch: only the optimizer state is sharded
        with gm:
            gm.backward(F.mean((model(mg.tensor(x)) - mg.tensor(y)) ** 2))
        opt.step().clear_grad()
        state["step"] = step + 1
        if save_at == step + 1:
            dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


def _run(world, *args, **kwargs):
    if world == 1:
        return _train(False, *args, **kwargs)
    return run_workers(_train, world, True, *args, timeout=120, **kwargs)[0]


@pytest.mark.parametrize("saved, loaded", [(2, 3), (2, 1), (1, 2), (3, 3)])
def test_sharded_optimizer_state_reshards(tmp_path, saved, loaded):
    root = str(tmp_path)
    _run(saved, K, root, save_at=K)
    index = dist.checkpoint.read_index(os.path.join(root, f"step-{K}"))
    buf = index["tensors"]["optim/state/model/0.weight/momentum_buffer"]
    assert buf["shape"] == [8, 4]  # logical, whatever the sharding
    assert len({p["file"] for p in buf["pieces"]}) == saved  # each rank wrote its range
    got = _run(loaded, N, root, resume=True)
    ref = _run(loaded, N)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-10, err_msg=name)
        if saved == loaded:
            assert np.array_equal(got[name], value), name


# -- the project's ZeRO: ZeroRedundancyOptimizer (stage 1) and fully_shard (stages 2 and 3) -------
GLOBAL_BATCH = 12  # divisible by 1, 2 and 3 ranks: every layout trains on the same global batch


def _zero_model(kind):
    """The float64 MLP, its Adam and GradManager in layout ``kind``: ``plain`` (one process or
    all-reduce data parallelism), ``zero1`` (ZeroRedundancyOptimizer), ``zero2`` (fully_shard on
    the root, parameters kept until backward), ``zero3`` (each Linear, then the root)."""
    model = mlp(0)
    if kind in ("zero2", "zero3"):
        if kind == "zero3":
            for layer in (model[0], model[2]):
                dist.fully_shard(layer)
        dist.fully_shard(model, reshard_after_forward=kind == "zero3")
    if kind == "zero1":
        opt = dist.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam,
                                           lr=0.01)
    else:
        opt = optim.Adam(model.parameters(), lr=0.01)
    callbacks = [dist.make_allreduce_cb("mean")] if kind in ("plain", "zero1") and \
        dist.is_initialized() and dist.get_world_size() > 1 else []
    gm = ad.GradManager().attach(model.parameters(), callbacks=callbacks)
    return model, opt, gm


def _zero_train(kind, stop, root=None, save_at=None, resume=False):
    model, opt, gm = _zero_model(kind)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    state = {"model": model, "optim": opt, "step": 0}
    if resume:
        dist.checkpoint.load(state, dist.checkpoint.latest(root))
    for step in range(state["step"], stop):
        x, y = batch(step, GLOBAL_BATCH)
        rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        with gm:
            gm.backward(F.mean((model(mg.tensor(x[rows])) - mg.tensor(y[rows])) ** 2))
        opt.step().clear_grad()
        state["step"] = step + 1
        if save_at == step + 1:
            dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    full = dist.full_state_dict(model) if kind in ("zero2", "zero3") else model.state_dict()
    return {k: np.array(v) for k, v in full.items()}


def _zero_run(layout, *args, **kwargs):
    kind, world = layout
    if world == 1:
        return _zero_train(kind, *args, **kwargs)
    return run_workers(_zero_train, world, kind, *args, timeout=120, **kwargs)[0]


@pytest.mark.parametrize("saved, loaded", [
    (("zero2", 2), ("zero3", 3)),   # the pair
    (("zero3", 3), ("zero3", 2)),   # fully_shard 3 -> 2
    (("zero1", 2), ("plain", 1)),   # ZeRO-1 -> one process
    (("zero3", 2), ("zero1", 3)),
    (("plain", 1), ("zero2", 2)),
    (("zero2", 3), ("plain", 2)),   # into all-reduce data parallelism
    (("zero3", 3), ("zero3", 3)),   # the same layout: bitwise
    (("zero1", 2), ("zero1", 2)),
])
def test_zero_checkpoint_resumes_in_another_layout(tmp_path, saved, loaded):
    """Save after K steps in layout A, resume in layout B to step N: the parameters equal an
    uninterrupted run in layout B from the same initial state (float64, 1e-10; bitwise when
    A = B); every rank of A wrote its own shard of the parameters and the Adam moments."""
    root = str(tmp_path)
    _zero_run(saved, K, root, save_at=K)
    index = dist.checkpoint.read_index(os.path.join(root, f"step-{K}"))
    for key in ("model/0.weight", "optim/state/model/0.weight/exp_avg"):
        assert index["tensors"][key]["shape"] == [8, 4]  # logical, whatever the sharding
    files = {p["file"] for meta in index["tensors"].values() for p in meta["pieces"]}
    assert len(files) == saved[1]
    for part in ("model/", "optim/state/"):  # each rank wrote its share of both, not all
        tensors = {k: m for k, m in index["tensors"].items() if k.startswith(part)}
        total = sum(int(np.prod(m["shape"])) for m in tensors.values())
        for name in files:
            mine = sum(int(np.prod(p["sizes"])) for m in tensors.values()
                       for p in m["pieces"] if p["file"] == name)
            assert mine == total if saved[1] == 1 else 0 < mine <= total * 0.6, (part, name)
    got = _zero_run(loaded, N, root, resume=True)
    ref = _zero_run(loaded, N)
    assert set(got) == set(ref) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    moved = _zero_run(loaded, K)
    for name, value in ref.items():
        assert not np.allclose(moved[name], value)  # training after the resume changed it
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-10, err_msg=name)
        if saved == loaded:
            assert np.array_equal(got[name], value), name


def test_a_sharded_optimizer_over_sharded_parameters_is_refused(tmp_path):
    """A ZeRO-1 range of a fully_shard piece is a range of the piece, not of the parameter: the
    save refuses it (naming the parameter) instead of writing a wrong layout."""
    model = dist.fully_shard(mlp(0))
    opt = dist.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam, lr=0.01)
    with pytest.raises(dist.checkpoint.CheckpointError,
                       match=r"ZeroRedundancyOptimizer keeps a flat range of 'model/0.weight', "
                             r"which is itself a shard"):
        dist.checkpoint.save({"model": model, "optim": opt}, str(tmp_path / "c"))
