"""Save at layout A after k steps, resume at layout B, train to step n: the parameters equal an
uninterrupted run at layout B from the same initial state (1e-10 in float64; bitwise when A = B).
Adam's moments and step counts are resharded like their parameters (a wrong moment changes the
next steps)."""

import os

import numpy as np
import pytest
from ckpt_helpers import batch, mlp
from layouts import run

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

K, N = 2, 4


def _compare(got, ref, exact):
    assert sorted(got) == sorted(ref)
    for name, value in ref.items():
        if exact:
            assert np.array_equal(got[name], value), name
        else:
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("saved, loaded", [
    ("data2", "single"),
    ("data2", "data2"),
    ("data2", "tensor2_1d"),
    ("pipe2", "data2"),
    ("tensor2_1d", "tensor4_2d"),
])
def test_resume_in_another_layout_equals_uninterrupted_run(tmp_path, saved, loaded):
    root = str(tmp_path)
    run(saved, K, root, save_at=K)
    got = run(loaded, N, root, resume=True)
    ref = run(loaded, N)
    _compare(got, ref, exact=saved == loaded)
    moved = run(loaded, K)  # the checkpoint really carried the first k steps
    assert any(not np.allclose(moved[k], ref[k]) for k in ref)


# -- global tensors: a model split(0) over 2 ranks resumed as broadcast ---------------------------
def _global_train(sbp_name, stop, root=None, save_at=None, resume=False):
    P = mg.placement("cpu", [0, 1])
    sbp = mg.sbp.split(0) if sbp_name == "split0" else mg.sbp.broadcast
    layer = mlp(0)[0]  # Linear(4, 8): rows split over the two ranks
    layer.to_global(P, mg.sbp.broadcast)
    layer.weight = mg.Parameter(layer.weight.to_global(sbp=sbp))
    layer.bias = mg.Parameter(layer.bias.to_global(sbp=sbp))
    opt = optim.Adam(layer.parameters(), lr=0.05)
    gm = ad.GradManager().attach(layer.parameters())
    state = {"model": layer, "optim": opt, "step": 0}
    if resume:
        dist.checkpoint.load(state, dist.checkpoint.latest(root))
        assert layer.weight.sbp == (sbp,)
    for step in range(state["step"], stop):
        x, y = batch(step)
        with gm:
            out = layer(mg.tensor(x).to_global(P, mg.sbp.broadcast))
            target = mg.tensor(np.tanh(np.concatenate([y, y], axis=1)))
            loss = F.mean((out - target.to_global(P, mg.sbp.broadcast)) ** 2)
            gm.backward(loss)
        opt.step().clear_grad()
        state["step"] = step + 1
        if save_at == step + 1:
            dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    return {"weight": layer.weight.numpy(), "bias": layer.bias.numpy(),
            "local": layer.weight.to_local().numpy().shape}


@pytest.mark.parametrize("saved, loaded", [("split0", "broadcast"), ("broadcast", "split0")])
def test_global_tensor_model_resumes_in_another_sbp(tmp_path, saved, loaded):
    """Adam on global parameters: the moments are pieces of the same SBP as their parameter."""
    root = str(tmp_path)
    local = {"split0": (4, 4), "broadcast": (8, 4)}
    first = run_workers(_global_train, 2, saved, K, root, save_at=K)
    assert first[0]["local"] == local[saved]  # split: each rank held half of the rows
    got = run_workers(_global_train, 2, loaded, N, root, resume=True)
    ref = run_workers(_global_train, 2, loaded, N)
    assert got[0]["local"] == local[loaded]
    for r in range(2):
        for name in ("weight", "bias"):
            np.testing.assert_allclose(got[r][name], ref[r][name], rtol=0, atol=1e-10)
    moved = run_workers(_global_train, 2, loaded, K)
    assert not np.allclose(moved[0]["weight"], ref[0]["weight"])
