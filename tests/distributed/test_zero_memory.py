"""``dist.estimate_zero_memory`` against the bytes of the arrays each rank really holds."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

WIDTH, B = 32, 4


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.blocks = [M.Linear(WIDTH, WIDTH) for _ in range(3)]

    def forward(self, x):
        for block in self.blocks:
            x = F.tanh(block(x))
        return x


def _array_bytes(arrays) -> int:
    return int(sum(a.nbytes for a in arrays))


def _measure(stage):
    """Bytes of parameters, gradients and Adam state this rank holds after one step."""
    n = dist.get_world_size()
    net = Net()
    cbs = []
    if stage >= 2:
        for block in net.blocks:
            dist.fully_shard(block, reshard_after_forward=stage == 3)
        dist.fully_shard(net, reshard_after_forward=stage == 3)
    else:
        cbs = [dist.make_allreduce_cb("mean")]
    params = list(net.parameters())
    gm = ad.GradManager().attach(params, callbacks=cbs)
    if stage == 1:
        opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, lr=1e-3)
    else:
        opt = optim.Adam(params, lr=1e-3)
    x = mg.tensor(np.random.default_rng(dist.get_rank()).standard_normal((B, WIDTH)),
                  dtype="float32")
    with gm:
        gm.backward((net(x) ** 2).mean())
    grads = _array_bytes(p.grad.data for p in params)
    opt.step()
    if stage == 1:
        state = opt.local_state_bytes()
    else:
        state = _array_bytes(v for st in opt.state_dict()["state"].values()
                             for v in st.values() if getattr(v, "ndim", 0) > 0)
    measured = {"params": _array_bytes(p.data for p in params), "grads": grads,
                "optimizer_state": state}
    estimate = dist.estimate_zero_memory(Net(), stage, n, "adam", verbose=False)
    return measured, estimate


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_estimate_matches_the_live_arrays_within_5_percent(stage, n):
    for measured, estimate in run_workers(_measure, n, stage):
        for key, got in measured.items():
            assert abs(got - estimate[key]) <= 0.05 * estimate[key], (key, got, estimate[key])


def test_estimate_formula_and_printout(capsys):
    net = Net()
    p = 3 * (WIDTH * WIDTH + WIDTH) * 4
    s3 = dist.estimate_zero_memory(net, 3, 4, "adam")
    assert s3 == {"params": p // 4, "grads": p // 4, "optimizer_state": 2 * p // 4,
                  "total": p, "working_set": p // 3}
    assert "activations not included" in capsys.readouterr().out
    s0 = dist.estimate_zero_memory(net, 0, 4, "sgd", verbose=False)
    assert (s0["params"], s0["grads"], s0["optimizer_state"]) == (p, p, p)
    with pytest.raises(ValueError, match="stage must be 0, 1, 2 or 3, got 4"):
        dist.estimate_zero_memory(net, 4, 2)
