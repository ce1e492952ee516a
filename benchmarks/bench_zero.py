"""Sharded data parallelism on the CPU: step time and model-state bytes per rank of DDP and ZeRO
stages 1-3 (``make_allreduce_cb`` + Adam, ``ZeroRedundancyOptimizer``, ``fully_shard`` with and
without ``reshard_after_forward``), 2 ranks, an MLP of ``--depth`` square layers of ``--width``
(the default, 4 x 2240, is about 20M parameters). The modes alternate within each round (same run,
interleaved), so a busy shared machine slows them alike; the table gives median step times, the
ratio to DDP, and the bytes of parameters, gradients and optimizer state one rank holds (counted
from the live arrays) next to ``dist.estimate_zero_memory``. Writes benchmarks/results/zero.json
and, with matplotlib, zero_bytes.png (bytes per rank by stage and world size, from the estimator).

    python benchmarks/bench_zero.py [--width 2240] [--depth 4] [--rounds 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from machine import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("ddp", "zero1", "zero2", "zero3")


def _model(width: int, depth: int):
    import minigrad as mg  # noqa: PLC0415
    import minigrad.module as M  # noqa: PLC0415

    mg.random.seed(0)
    return M.Sequential(*[M.Linear(width, width) for _ in range(depth)])


def _bytes(arrays) -> int:
    return int(sum(a.nbytes for a in arrays))


def rank_steps(mode: str, width: int, depth: int, batch: int, steps: int, warmup: int = 2):
    """One rank: median seconds per step of ``mode`` and the bytes of model state it holds."""
    import minigrad as mg  # noqa: PLC0415
    import minigrad.autodiff as ad  # noqa: PLC0415
    import minigrad.distributed as dist  # noqa: PLC0415
    import minigrad.functional as F  # noqa: PLC0415
    import minigrad.optimizer as optim  # noqa: PLC0415

    mg.set_num_threads(1)
    net = _model(width, depth)
    cbs = []
    if mode in ("zero2", "zero3"):
        for layer in list(net.children()):
            dist.fully_shard(layer, reshard_after_forward=mode == "zero3")
        dist.fully_shard(net, reshard_after_forward=mode == "zero3")
    else:
        cbs = [dist.make_allreduce_cb("mean")]
    params = list(net.parameters())
    gm = ad.GradManager().attach(params, callbacks=cbs)
    if mode == "zero1":
        opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, lr=1e-4)
    else:
        opt = optim.Adam(params, lr=1e-4)
    rng = np.random.default_rng(dist.get_rank())
    x = mg.tensor(rng.standard_normal((batch, width)).astype(np.float32))
    times, grads = [], 0
    for i in range(warmup + steps):
        if i == warmup:
            dist.comm.barrier()
        t0 = time.perf_counter()
        with gm:
            gm.backward(F.tanh(net(x)).mean())
        grads = _bytes(p.grad.data for p in params)
        opt.step().clear_grad()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if mode == "zero1":
        state = opt.local_state_bytes()
    else:
        state = _bytes(v for st in opt.state_dict()["state"].values() for v in st.values()
                       if getattr(v, "ndim", 0) > 0)
    held = _bytes(p.data for p in params)
    peak = held + grads + state  # DDP and ZeRO-1 hold all of it throughout the step
    if mode in ("zero2", "zero3"):  # one more (untimed) step, counting the live arrays
        with dist.ModelStateMeter(net, opt) as meter:
            with gm:
                gm.backward(F.tanh(net(x)).mean())
            opt.step().clear_grad()
        peak = meter.peak
    return {"step_s": float(np.median(times)), "params": held, "grads": grads,
            "optimizer_state": state, "peak": peak}


def plot(width: int, depth: int, path: Path) -> bool:
    """Bytes per rank by stage and world size (the estimator's), if matplotlib is installed."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    import minigrad.distributed as dist  # noqa: PLC0415

    net = _model(width, depth)
    worlds = [1, 2, 4, 8, 16]
    fig, ax = plt.subplots(figsize=(6, 4))
    for stage in range(4):
        totals = [dist.estimate_zero_memory(net, stage, n, verbose=False)["total"] / 2**20
                  for n in worlds]
        ax.plot(worlds, totals, marker="o", label=f"stage {stage}" + (" (DDP)" if not stage
                                                                        else ""))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("MiB per rank (params + grads + Adam state)")
    ax.set_title(f"model state per rank, MLP {depth} x {width} (activations not included)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return True


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2240)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    import minigrad.distributed as dist  # noqa: PLC0415

    runs: dict = {m: [] for m in MODES}
    for i in range(args.rounds):
        order = MODES if i % 2 == 0 else MODES[::-1]
        for mode in order:
            job = dist.launcher(rank_steps, n_gpus=2, device_type="cpu")
            per_rank = job(mode, args.width, args.depth, args.batch, args.steps)
            runs[mode].append(max(r["step_s"] for r in per_rank))
            last = per_rank[0]
            runs.setdefault(f"{mode}_bytes", last)
    est_net = _model(args.width, args.depth)
    table = {}
    base = float(np.median(runs["ddp"]))
    for stage, mode in enumerate(MODES):
        est = dist.estimate_zero_memory(est_net, stage, 2, verbose=False)
        step = float(np.median(runs[mode]))
        table[mode] = {"step_s": step, "vs_ddp": step / base, "measured": runs[f"{mode}_bytes"],
                       "estimate": est}
    params = sum(p.size for p in est_net.parameters())
    print(f"ZeRO on {cpu_name()}: MLP {args.depth} x {args.width} ({params / 1e6:.1f}M "
          f"parameters), batch {args.batch} per rank, 2 ranks, Adam float32")
    print(f"{'mode':6} {'step ms':>8} {'x DDP':>6} {'params MiB':>11} {'grads MiB':>10} "
          f"{'state MiB':>10} {'estimate MiB':>13} {'peak MiB':>9}")
    for mode, row in table.items():
        m, e = row["measured"], row["estimate"]
        print(f"{mode:6} {row['step_s'] * 1e3:8.1f} {row['vs_ddp']:6.2f} "
              f"{m['params'] / 2**20:11.2f} {m['grads'] / 2**20:10.2f} "
              f"{m['optimizer_state'] / 2**20:10.2f} {e['total'] / 2**20:13.2f} "
              f"{m['peak'] / 2**20:9.2f}")
    target = table["ddp"]["estimate"]["total"] / 2 + table["zero3"]["estimate"]["working_set"]
    table["zero3"]["peak_target"] = target
    print(f"peak: live model-state bytes during a step (dist.ModelStateMeter for zero2/zero3: "
          f"gathered parameters and full gradients included; activations not counted); zero3 "
          f"target <= DDP/2 + largest layer = {target / 2**20:.2f} MiB: "
          f"{'met' if table['zero3']['measured']['peak'] <= target else 'NOT met'}")
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": cpu_name(), "args": vars(args), "table": table}
    (RESULTS / "zero.json").write_text(json.dumps(out, indent=1))
    if plot(args.width, args.depth, RESULTS / "zero_bytes.png"):
        print(f"wrote {RESULTS / 'zero_bytes.png'}")
    return out


if __name__ == "__main__":
    main()
