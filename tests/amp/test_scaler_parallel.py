"""Dynamic loss scaling across parallel groups: an inf/nan gradient found on one rank only makes
every rank skip the same step and keep the same scale, with the pipeline engine (pipeline x data
parallel, ZeRO-1), ZeroRedundancyOptimizer, fully_shard and DDP; otherwise a scaled run trains
bitwise like an unscaled one (float64, power-of-two scales are exact).

(Data-parallel and tensor-parallel ranks: ``test_grad_scaler.py``.)"""

import numpy as np
import pytest

import minigrad as mg
import minigrad.amp as amp
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed.mesh.topology import PipeDataParallelTopology
from minigrad.distributed.pipeline import LayerSpec, PipelineEngine, PipelineModule
from minigrad.testing.distributed import run_workers

D, C, STEPS = 4, 3, 5
POISON = {1: 1, 3: 2}  # step -> the one rank whose gradient is set to inf at that step


# -- the pipeline engine ---------------------------------------------------------------------------
class Layer(M.Module):
    def __init__(self, seed, out=D):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = mg.Parameter(rng.standard_normal((D, out)) * 0.5)
        self.b = mg.Parameter(rng.standard_normal(out) * 0.1)

    def forward(self, x):
        return F.tanh(F.matmul(x, self.w) + self.b)


def _specs():
    return [LayerSpec(Layer, 1), LayerSpec(Layer, 2), LayerSpec(Layer, 3),
            LayerSpec(Layer, 4, C)]


def _items(steps, replica):
    rng = np.random.default_rng(20)
    out = []
    for _ in range(steps):
        batch = [(rng.standard_normal((2, D)), rng.integers(0, C, 2).astype("int32"))
                 for _ in range(8)]  # 4 micro-batches per replica
        out.extend(batch[replica * 4:(replica + 1) * 4])
    return out


def _pipeline_worker(use_scaler, zero_stage):
    rank = dist.get_rank()
    net = PipelineModule(_specs(), topology=PipeDataParallelTopology(2, 2),
                         loss_fn=F.nn.cross_entropy)
    replica = net.topology.get_coord(rank).data
    scaler = amp.GradScaler(module=net, growth_interval=2, warn=False) if use_scaler else None
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.2, momentum=0.9), 4,
                            "1f1b", zero_stage=zero_stage, scaler=scaler)

    def poison(engine, action):
        if (type(action).__name__ == "Backward" and POISON.get(engine.global_steps) == rank):
            p = next(iter(net.parameters()))
            p.grad.data.reshape(-1)[0] = np.inf

    data = _items(STEPS, replica)
    if use_scaler:
        engine.register_action_hook(poison)
    else:  # the reference never sees the batches of the skipped steps
        data = [x for s in range(STEPS) if s not in POISON for x in data[4 * s:4 * s + 4]]
    it = iter(data)
    scales, moved, reports = [], [], []
    for _ in range(STEPS if use_scaler else STEPS - len(POISON)):
        before = [p.numpy().copy() for p in net.parameters()]
        engine.train_batch(it)
        moved.append(any(not np.array_equal(b, p.numpy())
                         for b, p in zip(before, net.parameters())))
        if use_scaler:
            scales.append(scaler.get_scale())
            last = scaler.last_overflow
            reports.append(None if last is None else dict(last.tensors))
    return dict(params={n: p.numpy() for n, p in net.named_parameters()}, scales=scales,
                moved=moved, reports=reports, stage=net.stage_id)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_pipeline_engine_with_a_scaler_skips_on_every_stage_and_replica(zero_stage):
    got = run_workers(_pipeline_worker, 4, True, zero_stage, timeout=120)
    ref = run_workers(_pipeline_worker, 4, False, zero_stage, timeout=120)
    for rank, (g, r) in enumerate(zip(got, ref)):
        # skip at steps 1 and 3 on all four ranks (the inf was on one rank of one stage);
        # growth_interval=2: 16, back off to 8, grow after 2 clean steps... identically
        assert g["scales"] == [16, 8, 8, 4, 4], rank
        assert g["moved"] == [True, False, True, False, True], rank
        # found where it was put and on that stage's other replica (the data-parallel
        # all-reduce spread it), never on the other stage: which still skipped
        assert g["reports"][1] == {0: ["0.w"], 1: ["0.w"]}, rank
        assert g["reports"][3] == {2: ["2.w"], 3: ["2.w"]}, rank
        # the steps taken equal an engine without a scaler that never saw the skipped batches
        assert sorted(g["params"]) == sorted(r["params"])
        for name, value in r["params"].items():
            np.testing.assert_array_equal(g["params"][name], value, err_msg=name)


def test_pipeline_engine_refuses_a_scaler_without_step():
    net = PipelineModule(_specs(), num_stages=1, loss_fn=F.nn.cross_entropy)
    with pytest.raises(TypeError, match="scaler must be a loss scaler such as amp.GradScaler"):
        PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), 2, scaler=16.0)


# -- sharded optimizers and DDP ------------------------------------------------------------------
def _net():
    mg.random.seed(0)
    return M.Sequential(M.Linear(3, 6), M.ReLU(), M.Linear(6, 2))


def _data_parallel_worker(mode):
    """``mode``: "zero" (ZeroRedundancyOptimizer + make_allreduce_cb), "fsdp" (fully_shard, the
    poisoned gradient element is in rank 1's shard only) or "ddp". PyTorch's spelling."""
    rank = dist.get_rank()
    net = _net()
    cbs = []
    if mode == "zero":
        cbs = [dist.make_allreduce_cb("mean")]
        opt = dist.ZeroRedundancyOptimizer(net.parameters(), optimizer_class=optim.Adam, lr=0.01)
        model = net
    elif mode == "fsdp":
        dist.fully_shard(net)
        opt = optim.Adam(net.parameters(), lr=0.01)
        model = net
    else:
        model = dist.DistributedDataParallel(net)
        opt = optim.Adam(net.parameters(), lr=0.01)
    gm = ad.GradManager().attach(net.parameters(), callbacks=cbs)
    scaler = amp.GradScaler(module=net, growth_interval=2, warn=False)
    named = dict(net.named_parameters())
    scales, moved, sizes = [], [], {}
    for step in range(4):
        x = np.random.default_rng(10 * step + rank).standard_normal((4, 3)).astype(np.float32)
        before = [p.numpy().copy() for p in net.parameters()]
        with gm:
            loss = F.nn.cross_entropy(model(mg.tensor(x)), mg.tensor([0, 1, 0, 1]))
            gm.backward(scaler.scale(loss))
        if step == 1 and rank == 1:  # after the gradient reduction: this rank's copy only
            g = named["2.weight"].grad
            sizes = g.size
            g.data.reshape(-1)[-1] = np.inf
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        moved.append(any(not np.array_equal(b, p.numpy())
                         for b, p in zip(before, net.parameters())))
        scales.append(scaler.get_scale())
    local = {n: p.size for n, p in net.named_parameters()}
    return scales, moved, dict(scaler.last_overflow.tensors), sizes, local


@pytest.mark.parametrize("mode", ["zero", "fsdp", "ddp"])
def test_sharded_and_ddp_ranks_skip_together_when_one_rank_overflows(mode):
    out = run_workers(_data_parallel_worker, 2, mode, timeout=120)
    for scales, moved, report, _, _ in out:
        assert scales == [16, 8, 8, 16]
        assert moved == [True, False, True, True]
        assert report == {1: ["2.weight"]}
    if mode == "fsdp":  # rank 0 holds none of the last layer's weight: only rank 1 saw the inf
        assert out[0][4]["2.weight"] == 0 and out[1][4]["2.weight"] == 12


def _one_warning_job():
    import warnings

    net = M.Linear(2, 1)
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net)  # warn=True: rank 0 warns for the job
    x = np.ones((1, 2), np.float32) * (np.inf if dist.get_rank() == 1 else 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gm:
            scaler.backward(gm, net(mg.tensor(x)).sum())
        scaler.update()
    messages = [str(w.message) for w in caught if issubclass(w.category, amp.OverflowWarning)]
    return messages, scaler.last_overflow.tensors, scaler.skipped_steps


def test_one_warning_on_rank_0_names_the_rank_that_found_the_overflow():
    (m0, t0, s0), (m1, t1, s1) = run_workers(_one_warning_job, 2)
    assert len(m0) == 1 and m1 == []  # one warning for the job
    assert "non-finite gradients of rank 1: weight;" in m0[0]
    assert t0 == t1 == {1: ["weight"]}  # the bias's gradient (1 per sample) stays finite
    assert s0 == s1 == 1  # both ranks skipped the step
