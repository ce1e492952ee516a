"""The profiler: a valid Chrome trace per rank and merged, module events that follow the module
tree with their ops inside, backward and data-loading events, pipeline actions, and nothing left
swapped in once it stops."""

from __future__ import annotations

import json

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
from minigrad import seams
from minigrad.autodiff import engine, function
from minigrad.data import DataLoader, SequentialSampler
from minigrad.data.dataset import ArrayDataset
from minigrad.module import module as module_module
from minigrad.testing.distributed import run_workers
from minigrad.utils.profiler import Profiler, scope


def load(path):
    with open(path) as fh:
        return json.load(fh)


def check_trace_format(trace: dict, pids: set[int]) -> list[dict]:
    """The trace-event format's required fields; returns the complete ("X") events."""
    assert isinstance(trace["traceEvents"], list)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for e in trace["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= set(e), e
        assert e["pid"] in pids
    for e in spans:
        assert isinstance(e["ts"], float) and e["dur"] >= 0 and "cat" in e
    return spans


def test_module_events_follow_the_tree_with_their_ops_inside(tmp_path):
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    x = mg.tensor(np.ones((5, 3), np.float32))
    gm = ad.GradManager().attach(net.parameters())
    with Profiler(str(tmp_path), model=net) as prof:
        with gm:
            gm.backward(net(x).sum())
    trace = load(tmp_path / "rank0.chrome_timeline.json")
    spans = check_trace_format(trace, {0})
    ts = [e["ts"] for e in spans]
    assert ts == sorted(ts)
    modules = [e for e in spans if e["cat"] == "module"]
    assert [e["name"] for e in modules] == ["Sequential", "0", "1", "2"]
    outer, children = modules[0], modules[1:]
    for child in children:  # each layer runs inside the Sequential, one after the other
        assert outer["ts"] <= child["ts"] and child["ts"] + child["dur"] <= outer["ts"] + outer[
            "dur"] + 1e-3
    assert [c["args"]["class"] for c in children] == ["Linear", "ReLU", "Linear"]
    ops = [e for e in spans if e["cat"] == "op"]
    first = children[0]
    inside = [o for o in ops if first["ts"] <= o["ts"] <= first["ts"] + first["dur"]]
    assert inside and inside[0]["args"]["inputs"][0] == [5, 3]
    backward = [e for e in spans if e["cat"] == "backward"]
    assert backward and min(b["ts"] for b in backward) > outer["ts"] + outer["dur"]
    assert prof.summary().splitlines()[0].startswith("name")


def test_nothing_stays_swapped_in_after_the_profiler(tmp_path):
    plain = (function.Function.__call__, engine._Walk.call_backward, M.Module.__call__)
    with Profiler(str(tmp_path)):
        assert function.Function.__call__ is not plain[0]
        assert seams.TRACER.value is not None
    assert (function.Function.__call__, engine._Walk.call_backward, M.Module.__call__) == plain
    assert function.Function.__call__ is function._untraced_call
    assert M.Module.__call__ is module_module._untraced_module_call
    assert seams.TRACER.value is None
    with pytest.raises(RuntimeError, match="another profiler is already running"):
        with Profiler(str(tmp_path)):
            Profiler(str(tmp_path)).start()
    assert seams.TRACER.value is None


def test_data_loading_and_scopes_and_the_decorator(tmp_path):
    data = ArrayDataset(np.arange(20, dtype=np.float32).reshape(10, 2))
    loader = DataLoader(data, sampler=SequentialSampler(data, batch_size=3))
    prof = Profiler(str(tmp_path))

    @prof
    def epoch():
        with scope("my block"):
            return sum(1 for _ in loader)

    assert epoch() == 4
    spans = check_trace_format(load(tmp_path / "rank0.chrome_timeline.json"), {0})
    data_events = [e for e in spans if e["cat"] == "data"]
    assert [e["args"]["index"] for e in data_events] == [0, 1, 2, 3]
    assert [e["name"] for e in spans if e["cat"] == "scope"] == ["my block"]


def _two_ranks(path):
    x = np.ones(4) * (dist.get_rank() + 1)
    with Profiler(path):
        with scope(f"rank {dist.get_rank()} work"):
            dist.all_reduce(x)
    return x.tolist()


def test_every_rank_writes_its_trace_and_rank0_merges_them(tmp_path):
    assert run_workers(_two_ranks, 2, str(tmp_path)) == [[3.0] * 4] * 2
    for rank in (0, 1):
        spans = check_trace_format(load(tmp_path / f"rank{rank}.chrome_timeline.json"), {rank})
        assert [e["name"] for e in spans if e["cat"] == "scope"] == [f"rank {rank} work"]
    merged = load(tmp_path / "merged.chrome_timeline.json")
    spans = check_trace_format(merged, {0, 1})
    assert {e["pid"] for e in spans} == {0, 1}
    assert "otherData" not in merged


def _pipeline_step(path):
    import minigrad.functional as F
    import minigrad.optimizer as optim
    from minigrad.distributed.pipeline import LayerSpec, PipelineEngine, PipelineModule

    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((2, 3)).astype("float32"), rng.integers(0, 3, 2).astype("int32"))
            for _ in range(2)]
    net = PipelineModule([LayerSpec(M.Linear, 3, 3), LayerSpec(M.Linear, 3, 3)], num_stages=2,
                         loss_fn=F.nn.cross_entropy, partition_method="uniform")
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), 2, "1f1b")
    with Profiler(path):
        engine.train_batch(iter(data))
    mine = [e for e in engine.timeline().events if e.rank == dist.get_rank()]
    return [(e.action, e.micro_batch) for e in sorted(mine, key=lambda e: e.start)]


def test_pipeline_actions_are_the_engines_own_timeline(tmp_path):
    timelines = run_workers(_pipeline_step, 2, str(tmp_path), timeout=120)
    for rank, timeline in enumerate(timelines):
        spans = check_trace_format(load(tmp_path / f"rank{rank}.chrome_timeline.json"), {rank})
        names = [e["name"] for e in spans if e["cat"] == "pipeline"]
        assert names == [a if mb is None else f"{a} mb{mb}" for a, mb in timeline]
        assert any(n.startswith("F mb") for n in names)


class Grow(M.Module):
    """Makes an 8 MiB temporary: the memory counter must see it."""

    def forward(self, x):
        big = mg.tensor(np.ones((1 << 20,), np.float64))
        return x + big.sum()


def test_memory_counters_and_the_host_peak(tmp_path):
    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    net = M.Sequential(M.Linear(3, 3), Grow())
    with Profiler(str(tmp_path), profile_memory=True) as prof:
        net(mg.tensor(np.ones((2, 3), np.float32)))
    assert prof.peak_host_bytes >= 8 << 20
    assert tracemalloc.is_tracing() == was_tracing  # put back as it was
    trace = load(tmp_path / "rank0.chrome_timeline.json")
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 3 and all(e["args"]["host"] >= 0 for e in counters)  # 3 modules


def _collectives_on_the_timeline(path):
    x = np.ones(5, np.float32)
    with Profiler(path):
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
    return x.tolist()


def test_collectives_are_on_the_timeline(tmp_path):
    run_workers(_collectives_on_the_timeline, 2, str(tmp_path))
    for rank in (0, 1):
        spans = check_trace_format(load(tmp_path / f"rank{rank}.chrome_timeline.json"), {rank})
        coll = [e for e in spans if e["cat"] == "collective"]
        assert [e["name"] for e in coll] == ["all_reduce", "broadcast"]
        assert coll[0]["args"]["bytes"] == 20 and coll[0]["args"]["group"] == [0, 1]
        assert coll[0]["args"]["seq"] < coll[1]["args"]["seq"]
