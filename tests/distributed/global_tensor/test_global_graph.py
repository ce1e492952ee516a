"""mg.Graph: OneFlow's pipeline tutorial program (examples/global_tensor_pipeline.py) gives the
losses of one process with the same gradient accumulation; each stage follows its schedule's
order; misconfigurations raise clear errors."""

import contextlib
import io
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed.global_tensor import graph as graph_module
from minigrad.distributed.pipeline import get_schedule
from minigrad.testing.distributed import run_workers

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "global_tensor_pipeline.py"
SEED = 123


def _run_tutorial():
    mg.random.seed(SEED)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    return out.getvalue()


def _tutorial_in_one_process(steps=20, micro=2):
    """The tutorial's model and data drawn in the same order, trained with plain gradient
    accumulation over ``micro`` micro-batches (mean loss) in this process."""
    mg.random.seed(SEED)
    stage0 = M.Sequential(M.Flatten(), M.Linear(28 * 28, 512), M.ReLU())
    stage1 = M.Sequential(M.Linear(512, 512), M.ReLU(), M.Linear(512, 10), M.ReLU())
    x = mg.randn(16, 1, 28, 28)
    y = mg.randint(0, 10, (16,))
    params = list(stage0.parameters()) + list(stage1.parameters())
    gm = ad.GradManager().attach(params)
    opt = optim.SGD(params, lr=0.001)
    losses = []
    for _ in range(steps):
        step = []
        with gm:
            for m in range(micro):
                sl = slice(m * 16 // micro, (m + 1) * 16 // micro)
                loss = M.CrossEntropyLoss()(stage1(stage0(x[sl])), y[sl])
                gm.backward(loss, mg.tensor(np.float32(1.0 / micro)), release=False)
                step.append(loss)
        opt.step().clear_grad()
        losses.append(((step[0] + step[1]) * (1.0 / micro)).item())
    return losses


def test_tutorial_program_runs_under_the_launcher():
    """The README's command: the program starts the process group itself (no init call)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "minigrad.distributed.launch", "--nproc_per_node", "2",
         str(EXAMPLE)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(re.findall(r"Tensor\([-0-9.e]+, dtype=float32", done.stdout)) == 20, done.stdout


def test_tutorial_program_matches_one_process():
    printed = run_workers(_run_tutorial, 2, timeout=120)
    numbers = [float(v) for v in re.findall(r"Tensor\(([-0-9.e]+),", printed[1])]
    assert len(numbers) == 20, printed[1]
    assert "Tensor([]" in printed[0] and not re.findall(r"Tensor\([-0-9]", printed[0])
    ref = _tutorial_in_one_process()
    np.testing.assert_allclose(numbers, ref, rtol=1e-6)
    assert ref[-1] < ref[0]


DIMS = (6, 5, 4)


def _weights():
    rng = np.random.default_rng(5)
    return [rng.standard_normal((DIMS[1], DIMS[0])), rng.standard_normal((DIMS[2], DIMS[1]))]


def _batch():
    rng = np.random.default_rng(6)
    return rng.standard_normal((8, DIMS[0])), rng.integers(0, DIMS[2], 8).astype("int32")


class _Stage(M.Module):
    def __init__(self, w, last):
        super().__init__()
        self.w = mg.Parameter(w)
        self.last = last

    def forward(self, x):
        h = F.matmul(x, self.w, transpose_b=True)
        return h if self.last else F.tanh(h)


def _run_graph(schedule, micro):
    """Two stages on ranks 0 and 1; records each rank's order of forwards and backwards."""
    P0, P1 = mg.placement("cpu", [0]), mg.placement("cpu", [1])
    w0, w1 = _weights()
    s0 = _Stage(w0, False).to_global(P0, mg.sbp.broadcast)
    s1 = _Stage(w1, True).to_global(P1, mg.sbp.broadcast)
    opt = optim.SGD(list(s0.parameters()) + list(s1.parameters()), lr=0.1)
    events = []

    class G(mg.Graph):
        def __init__(self):
            super().__init__()
            self.set_stage(s0, stage_id=0, placement=P0)
            self.set_stage(s1, stage_id=1, placement=P1)
            self.config.set_gradient_accumulation_steps(micro)
            self.config.set_pipeline_schedule(schedule)
            self.add_optimizer(opt)

        def build(self, x, y):
            events.append("F")
            loss = F.nn.cross_entropy(s1(s0(x).to_global(placement=P1)), y)
            loss.backward()
            return loss

    original = graph_module._DeferringGradManager.backward

    def logged(gm, y=None, dy=None, *, release=True):
        if gm.deferred is None:
            events.append("B")
        return original(gm, y, dy, release=release)

    graph_module._DeferringGradManager.backward = logged
    try:
        x, y = _batch()
        xg = mg.tensor(x, dtype="float64").to_global(P0, mg.sbp.broadcast)
        yg = mg.tensor(y).to_global(P1, mg.sbp.broadcast)
        losses = [G()(xg, yg).to_local().numpy() for _ in range(2)]
    finally:
        graph_module._DeferringGradManager.backward = original
    return dict(events=events, losses=losses, w=[p.to_local().numpy() for p in opt.param_groups[0]
                                                  ["params"]])


def _graph_in_one_process(micro):
    ws = [mg.Parameter(w) for w in _weights()]
    opt = optim.SGD(ws, lr=0.1)
    gm = ad.GradManager().attach(ws)
    x, y = _batch()
    losses = []
    for _ in range(2):
        with gm:
            total = 0.0
            for m in range(micro):
                sl = slice(m * 8 // micro, (m + 1) * 8 // micro)
                h = F.tanh(F.matmul(mg.tensor(x[sl]), ws[0], transpose_b=True))
                loss = F.nn.cross_entropy(F.matmul(h, ws[1], transpose_b=True), mg.tensor(y[sl]))
                gm.backward(loss * (1.0 / micro), release=False)
                total = total + loss.item() / micro
        opt.step().clear_grad()
        losses.append(total)
    return losses, [w.numpy() for w in ws]


@pytest.mark.parametrize("schedule, micro", [("1f1b", 4), ("gpipe", 2)])
def test_stages_follow_their_schedule_and_match_one_process(schedule, micro):
    res = run_workers(_run_graph, 2, schedule, micro, timeout=120)
    sched = get_schedule(schedule, 2, micro)
    for stage in (0, 1):
        expected = ["F" if type(a).__name__ == "Forward" else "B"
                    for a in sched.compute_order(stage)]
        assert res[stage]["events"] == expected * 2, stage
    losses, ws = _graph_in_one_process(micro)
    np.testing.assert_allclose([float(v) for v in res[1]["losses"]], losses, rtol=1e-10)
    np.testing.assert_allclose(res[0]["w"][0], ws[0], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(res[1]["w"][1], ws[1], rtol=1e-10, atol=1e-13)
    assert res[0]["w"][1].size == 0 and res[1]["w"][0].size == 0  # each rank holds its stage


def _graph_errors():
    P0 = mg.placement("cpu", [0])
    P01 = mg.placement("cpu", [0, 1])
    model = _Stage(_weights()[0], True).to_global(P0, mg.sbp.broadcast)
    errors = {}

    class NoBackward(mg.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(optim.SGD(model.parameters(), lr=0.1))
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            return model(x).sum()

    x = mg.tensor(np.ones((4, DIMS[0]))).to_global(P0, mg.sbp.broadcast)
    cases = {
        "local stage": lambda: mg.Graph().set_stage(_Stage(_weights()[0], True), 0, P0),
        "accumulation": lambda: mg.Graph().config.set_gradient_accumulation_steps(0),
        "no backward": lambda: NoBackward()(x),
        "indivisible": lambda: NoBackward()(x[:3]),
    }
    g = mg.Graph()
    g.set_stage(_Stage(_weights()[0], True).to_global(P01, mg.sbp.broadcast), 0, P01)
    other = _Stage(_weights()[0], True).to_global(P0, mg.sbp.broadcast)
    cases["overlap"] = lambda: g.set_stage(other, 1, P0)
    for name, fn in cases.items():
        try:
            fn()
        except (ValueError, RuntimeError) as exc:
            errors[name] = str(exc)
    return errors


def test_graph_errors_name_the_problem():
    errors = run_workers(_graph_errors, 2)[0]
    assert "call module.to_global(placement, sbp) first" in errors["local stage"]
    assert "expected an int >= 1, got 0" in errors["accumulation"]
    assert "must call loss.backward() exactly once" in errors["no backward"]
    assert "batch of 3, not divisible by the 2 micro-batches" in errors["indivisible"]
    assert "shares ranks with stage 0" in errors["overlap"]


def _run_dp_pp():
    """Two pipeline stages of two data-parallel ranks each: a batch split along axis 0."""
    P0, P1 = mg.placement("cpu", [0, 1]), mg.placement("cpu", [2, 3])
    w0, w1 = _weights()
    s0 = _Stage(w0, False).to_global(P0, mg.sbp.broadcast)
    s1 = _Stage(w1, True).to_global(P1, mg.sbp.broadcast)
    opt = optim.SGD(list(s0.parameters()) + list(s1.parameters()), lr=0.1)

    class G(mg.Graph):
        def __init__(self):
            super().__init__()
            self.set_stage(s0, stage_id=0, placement=P0)
            self.set_stage(s1, stage_id=1, placement=P1)
            self.config.set_gradient_accumulation_steps(2)
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = F.nn.cross_entropy(s1(s0(x).to_global(placement=P1)), y)
            loss.backward()
            return loss

    x, y = _batch()
    xg = mg.tensor(x, dtype="float64", placement=P0, sbp=mg.sbp.split(0))
    yg = mg.tensor(y, placement=P1, sbp=mg.sbp.split(0))
    graph = G()
    losses = [graph(xg, yg).numpy() for _ in range(2)]
    return dict(losses=losses, w=[p.numpy() for p in opt.param_groups[0]["params"]])


def test_data_parallel_stages_match_one_process():
    res = run_workers(_run_dp_pp, 4, timeout=120)
    losses, ws = _graph_in_one_process(1)  # equal micro-batches: the mean is the batch mean
    for rank in (2, 3):
        np.testing.assert_allclose([float(v) for v in res[rank]["losses"]], losses, rtol=1e-10)
    for rank in (0, 1):
        np.testing.assert_allclose(res[rank]["w"][0], ws[0], rtol=1e-10, atol=1e-13)
    for rank in (2, 3):
        np.testing.assert_allclose(res[rank]["w"][1], ws[1], rtol=1e-10, atol=1e-13)


def _run_graph_oneflow_spelling(micro):
    """The same two-stage graph, its stages marked OneFlow's way on modules the graph holds."""
    P0, P1 = mg.placement("cpu", [0]), mg.placement("cpu", [1])
    w0, w1 = _weights()

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.s0 = _Stage(w0, False).to_global(P0, mg.sbp.broadcast)
            self.s1 = _Stage(w1, True).to_global(P1, mg.sbp.broadcast)

    net = Net()
    opt = optim.SGD(net.parameters(), lr=0.1)

    class G(mg.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.s0.to(M.graph.GraphModule).set_stage(stage_id=0, placement=P0)
            self.net.s1.to(M.graph.GraphModule).set_stage(stage_id=1)  # placement inferred
            self.config.set_gradient_accumulation_steps(micro)
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = F.nn.cross_entropy(self.net.s1(self.net.s0(x).to_global(placement=P1)), y)
            loss.backward()
            return loss

    x, y = _batch()
    xg = mg.tensor(x, dtype="float64").to_global(P0, mg.sbp.broadcast)
    yg = mg.tensor(y).to_global(P1, mg.sbp.broadcast)
    graph = G()
    losses = [graph(xg, yg).to_local().numpy() for _ in range(2)]
    return dict(losses=losses, stages=sorted(graph._stages),
                w=[p.to_local().numpy() for p in net.parameters()])


def test_oneflow_set_stage_through_graph_module_matches_one_process():
    ref_losses, ref_w = _graph_in_one_process(2)
    res = run_workers(_run_graph_oneflow_spelling, 2, 2, timeout=120)
    assert res[0]["stages"] == [0, 1]
    np.testing.assert_allclose([float(v) for v in res[1]["losses"]], ref_losses, rtol=1e-10)
    np.testing.assert_allclose(res[0]["w"][0], ref_w[0], rtol=1e-10)
    np.testing.assert_allclose(res[1]["w"][1], ref_w[1], rtol=1e-10)
    with pytest.raises(TypeError, match="nn.graph.GraphModule"):
        M.Linear(2, 2).to(3)  # neither a device nor GraphModule
