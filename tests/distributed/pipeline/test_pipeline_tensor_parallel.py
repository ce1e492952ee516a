"""Pipeline x tensor parallelism through the engine: two stages, each a 1D (Megatron) column/row
pair over two tensor ranks, driven by ``PipelineEngine`` on the parallel context's topology, equal
one process doing gradient accumulation over the same micro-batches (float64, 1e-10)."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp
from minigrad.distributed.pipeline import PipelineEngine, PipelineModule
from minigrad.testing.distributed import run_workers

DIM, BATCH, MICRO, STEPS = 8, 3, 4, 3


def _half(seed: int) -> M.Sequential:
    """Linear -> GELU -> Linear in float64; under a 1D context the pair is column- then
    row-parallel (each rank keeps its slice of the full, seeded weights)."""
    mg.random.seed(seed)
    tp.reset_layout()
    half = M.Sequential(tp.Linear(DIM, 2 * DIM), M.GELU(), tp.Linear(2 * DIM, DIM))
    for t in half.tensors():
        t._data = t._data.astype(np.float64)
    return half


def _items():
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((BATCH, DIM)), rng.standard_normal((BATCH, DIM)))
            for _ in range(MICRO * STEPS)]


def _loss(out, target):
    return ((out - mg.tensor(target)) ** 2).mean()


def _pipeline_x_tensor(schedule):
    ctx = dist.init_parallel(dict(pipeline=2, tensor=dict(size=2, mode="1d")))
    halves = [_half(1), _half(2)]
    net = PipelineModule(layers=halves, topology=ctx.topology, loss_fn=_loss,
                         partition_method="uniform")
    engine = PipelineEngine(net, optim.SGD(list(net.parameters()), lr=0.1, momentum=0.9), MICRO,
                            schedule)
    data = iter(_items())
    losses = [engine.train_batch(data) for _ in range(STEPS)]
    mine = halves[ctx.rank("pipeline")]
    return losses, mine.state_dict()  # collective over this stage's tensor group: full tensors


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_pipeline_engine_over_tensor_parallel_stages_equals_one_process(schedule):
    halves = [_half(1), _half(2)]
    params = [p for h in halves for p in h.parameters()]
    opt, gm = optim.SGD(params, lr=0.1, momentum=0.9), ad.GradManager().attach(params)
    data, ref_losses = _items(), []
    for step in range(STEPS):
        with gm:
            total = 0.0
            for x, y in data[step * MICRO:(step + 1) * MICRO]:
                total = total + _loss(halves[1](halves[0](mg.tensor(x))), y)
            gm.backward(total / MICRO)
        opt.step().clear_grad()
        ref_losses.append((total / MICRO).item())
    for rank, (losses, state) in enumerate(run_workers(_pipeline_x_tensor, 4, schedule)):
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
        ref = halves[rank // 2].state_dict()  # ranks 0, 1: stage 0; ranks 2, 3: stage 1
        assert sorted(state) == sorted(ref)
        for name, value in ref.items():
            np.testing.assert_allclose(state[name], value, rtol=1e-10, atol=1e-14,
                                       err_msg=f"rank {rank} {name}")
