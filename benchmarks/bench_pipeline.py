"""Pipeline schedules, measured: step times against their formulas, bubble fractions, timelines,
and the activation memory of the first stage under GPipe and 1F1B.

Step times. Every layer is one ``SleepLayer`` whose forward sleeps ``tF`` and whose backward
sleeps ``tI`` for the input gradient and ``tW`` for the weight gradient (``tB = tI + tW``): the
stages cost wall time but almost no CPU, so 2 cores can host 4 stages and the schedule alone
decides the step time. With ``tF = tI = tW = u``:

* GPipe and 1F1B: ``(M + S - 1)(tF + tB)``;
* interleaved 1F1B with v chunks (each chunk ``1 / v`` of a stage): ``M (tF + tB) +
  (S - 1)(tF + tB) / v`` (Megatron's bubble ``(S - 1)/v`` micro-batch slots);
* ZB-H1: ``M (tF + tB) + (S - 1)(tF + tI - tW)``; at S = 4, M = 8 that is 27 u against 1F1B's
  33 u (18 % less time, the floor for a flushed schedule; the 25 % once hoped for is impossible).

The first stage has no input gradient to compute; its layer still pays ``tI`` (in its full
backward, or in its weight pass when the backward is split), so every stage costs the same.

Memory. On the example language model (``examples/pipeline_lm.py``, 4 stages, 8 micro-batches)
rank 0 runs ``tracemalloc`` and samples the traced bytes after every action; net of what was
held at the start of the step (parameters, optimizer state) and of the gradients, that is the
memory of the activations kept alive for backward.

Writes ``benchmarks/results/pipeline.json`` and the timeline PNGs for 4 stages x 8 micro-batches.

    python benchmarks/bench_pipeline.py            # about a minute
    python benchmarks/bench_pipeline.py --unit 0.02 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from machine import cpu_name

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed.pipeline import (
    PipelineEngine,
    PipelineModule,
    bubble_fraction,
    get_schedule,
    plot_timeline,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


# ------------------------------------------------------------------------------------------------
# Sleeping layers
# ------------------------------------------------------------------------------------------------
class Sleep(ad.Function):
    """``y = x * w``, sleeping ``tF`` in forward, ``tI`` for the input gradient and ``tW`` for
    the weight gradient (each only in the backward pass that computes it)."""

    def __init__(self, times: tuple[float, float, float], first: bool):
        self.times, self.first = times, first

    def forward(self, x, w):
        time.sleep(self.times[0])
        self.x, self.w = x.data, w.data
        return self.x * self.w

    def backward(self, dy):
        wants_x, wants_w = self.needs_input_grad(0), self.needs_input_grad(1)
        # the first layer's input needs no gradient; it pays tI with its weights anyway
        pays_input = wants_x or (self.first and wants_w)
        time.sleep(self.times[1] * pays_input + self.times[2] * wants_w)
        return (dy.data * self.w if wants_x else None, dy.data * self.x if wants_w else None)


class SleepLayer(M.Module):
    def __init__(self, tF: float, tI: float, tW: float, first: bool = False):
        super().__init__()
        self.times, self.first = (tF, tI, tW), first
        self.w = mg.Parameter(np.ones(4))

    def forward(self, x):
        return Sleep(self.times, self.first)(x, self.w)


def square_loss(out, _labels):
    return (out * out).mean()


def ideal_time(schedule: str, S: int, M: int, v: int, u: float) -> float:
    """The formula of the module docstring (tF = tI = tW = u)."""
    if schedule in ("gpipe", "1f1b"):
        return (M + S - 1) * 3 * u
    if schedule == "interleaved":
        return M * 3 * u + (S - 1) * 3 * u / v
    if schedule == "zb-h1":
        return M * 3 * u + (S - 1) * u
    raise ValueError(schedule)


# ------------------------------------------------------------------------------------------------
# Step-time runs
# ------------------------------------------------------------------------------------------------
def _timed_rank(schedule: str, M: int, v: int, u: float, steps: int):
    S = dist.get_world_size()
    layers = [SleepLayer(u / v, u / v, u / v, first=(i == 0)) for i in range(S * v)]
    net = PipelineModule(layers, num_stages=S, loss_fn=square_loss, partition_method="uniform",
                         chunks=v)
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=1e-3), M, schedule)
    data = iter([(np.ones((1, 4)), None)] * (M * (steps + 1)))
    engine.train_batch(data)  # warm-up (channels, first allocations)
    times, bubbles = [], []
    for _ in range(steps):
        dist.comm.barrier()
        start = time.perf_counter()
        engine.train_batch(data)
        times.append(time.perf_counter() - start)
        timeline = engine.timeline()
        bubbles.append(bubble_fraction(timeline))
    return times, bubbles, timeline


def time_schedule(schedule: str, S: int, M: int, u: float, steps: int) -> dict:
    v = 2 if schedule == "interleaved" else 1
    results = dist.launcher(_timed_rank, n_gpus=S, device_type="cpu")(schedule, M, v, u, steps)
    times = np.max([r[0] for r in results], axis=0)  # a step ends when its last rank is done
    sched = get_schedule(schedule, S, M, v)
    simulated = sched.simulate(tF=u, tB=2 * u, tI=u, tW=u)
    ideal = ideal_time(schedule, S, M, v, u)
    return {
        "schedule": schedule, "stages": S, "micro_batches": M, "chunks": v, "unit_s": u,
        "step_s_median": float(np.median(times)), "step_s_all": times.tolist(),
        "ideal_s": ideal, "simulated_s": simulated.span(),
        "ratio": float(np.median(times)) / ideal,
        "bubble_measured": float(statistics.median(results[0][1])),
        "bubble_theory": bubble_fraction(simulated),
        "timeline": results[0][2],
    }


# ------------------------------------------------------------------------------------------------
# Activation memory of stage 0 on the example model
# ------------------------------------------------------------------------------------------------
def _example():
    """``examples/pipeline_lm.py`` as a module (its model and loss)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import pipeline_lm  # noqa: PLC0415 - the example is not a package

    return pipeline_lm


def _memory_rank(schedule: str, M: int, interval: int, args):
    ex = _example()
    mg.random.seed(0)
    net = PipelineModule(ex.build_specs(args), num_stages=dist.get_world_size(),
                         loss_fn=ex.lm_loss, partition_method="type:block",
                         activation_checkpoint_interval=interval)
    engine = PipelineEngine(net, optim.Adam(net.parameters(), lr=1e-3), M, schedule)
    rng = np.random.default_rng(0)
    batch = (args.batch_size, args.seq_len)
    data = iter([(rng.integers(0, ex.VOCAB, batch).astype("int32"),
                  rng.integers(0, ex.VOCAB, batch).astype("int32")) for _ in range(3 * M)])
    engine.train_batch(data)  # optimizer state exists from here on
    if dist.get_rank() != 0:
        engine.train_batch(data)
        return None
    samples = []

    def probe(engine, action):
        grads = sum(p.grad.data.nbytes for p in net.parameters() if p.grad is not None)
        samples.append(tracemalloc.get_traced_memory()[0] - grads)

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    engine.register_action_hook(probe)
    engine.train_batch(data)
    tracemalloc.stop()
    return max(samples) - base


def activation_memory(args) -> dict:
    out = {}
    for name, schedule, interval in (("gpipe", "gpipe", 0), ("1f1b", "1f1b", 0),
                                     ("1f1b + checkpointing", "1f1b", 1)):
        launch = dist.launcher(_memory_rank, n_gpus=4, device_type="cpu")
        out[name] = launch(schedule, 8, interval, args)[0]
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--unit", type=float, default=0.04, help="tF = tI = tW, seconds")
    p.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    args = p.parse_args(argv)
    cpu = cpu_name()
    print(f"CPU: {cpu}; unit tF = tI = tW = {args.unit * 1e3:g} ms; "
          f"median of {args.steps} steps")
    configs = [("gpipe", 2, 4), ("1f1b", 2, 4), ("gpipe", 4, 8), ("1f1b", 4, 8),
               ("1f1b", 4, 4), ("interleaved", 2, 4), ("interleaved", 4, 8), ("zb-h1", 4, 8)]
    rows = []
    print(f"{'schedule':12} {'S':>2} {'M':>2} {'measured':>9} {'formula':>8} {'ratio':>6} "
          f"{'bubble':>7} {'theory':>7}")
    for schedule, stages, micro_batches in configs:
        r = time_schedule(schedule, stages, micro_batches, args.unit, args.steps)
        rows.append(r)
        print(f"{schedule:12} {stages:2d} {micro_batches:2d} {r['step_s_median']:8.3f}s "
              f"{r['ideal_s']:7.3f}s {r['ratio']:6.3f} {r['bubble_measured']:7.1%} "
              f"{r['bubble_theory']:7.1%}",
              flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for r in rows:
        if (r["stages"], r["micro_batches"]) == (4, 8) and r["schedule"] in ("1f1b", "zb-h1"):
            path = RESULTS / f"pipeline_timeline_{r['schedule']}_4x8.png"
            plot_timeline(r["timeline"], str(path),
                          title=f"{r['schedule']}, 4 stages x 8 micro-batches, sleeping layers")
    by = {(r["schedule"], r["stages"], r["micro_batches"]): r for r in rows}
    zb, ofob = by[("zb-h1", 4, 8)], by[("1f1b", 4, 8)]
    saving = 1 - zb["step_s_median"] / ofob["step_s_median"]
    print(f"ZB-H1 vs 1F1B at 4 x 8: {saving:.1%} less time (floor 1 - 27/33 = {1 - 27 / 33:.1%})")
    ex_args = argparse.Namespace(d_model=64, heads=4, layers=4, dropout=0.1, seq_len=32,
                                 batch_size=8)
    memory = activation_memory(ex_args)
    for name, nbytes in memory.items():
        print(f"stage 0 activation memory, {name}: {nbytes / 2**20:.2f} MiB")
    print(f"GPipe / 1F1B: {memory['gpipe'] / memory['1f1b']:.2f} (live micro-batches 8 / 4)")
    report = {"cpu": cpu, "cores": os.cpu_count(), "unit_s": args.unit, "steps": args.steps,
              "rows": [{k: v for k, v in r.items() if k != "timeline"} for r in rows],
              "zb_h1_saving_vs_1f1b": saving, "zb_h1_floor": 1 - 27 / 33,
              "stage0_activation_bytes": memory, "example_model": vars(ex_args)}
    with open(RESULTS / "pipeline.json", "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
