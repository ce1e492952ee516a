"""Data-parallel scaling on the CPU: MLP 784-512-512-10, 2 ranks x batch 64 (one BLAS thread each)
against 1 process x batch 128 (two BLAS threads), for minigrad and, when installed, PyTorch DDP over
gloo. The two frameworks alternate over ``--rounds`` rounds (each round: one process, then two
ranks), because two processes on a small shared VM vary a lot from one minute to the next; the
table gives the median step times and the median and p10 of the per-round throughput ratio
(1x128 time / 2x64 time: 1.0 is perfect scaling of the work over the two cores, 0.5 no gain).
For minigrad it also times the two ranks without the gradient all-reduce (a barrier after each
backward keeps them in step): the ratio communication-free data parallelism would reach, and what
the all-reduce of the 2.7 MB of gradients costs per step (its rate is the cores' rate of reading
each other's memory, which bounds the ratio from below 1 on a small machine).
Prints the table and writes benchmarks/results/dp_scaling.json (or ``--out``).

    python benchmarks/bench_dp_scaling.py [--rounds 7] [--steps 40] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import numpy as np
from machine import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = [784, 512, 512, 10]


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def minigrad_steps(batch: int, steps: int, allreduce: bool = True, warmup: int = 5) -> float:
    """Seconds per training step of this process (inside a launcher rank or standalone);
    ``allreduce=False``: ranks keep their own gradients and only meet at a barrier."""
    import minigrad as mg  # noqa: PLC0415
    import minigrad.autodiff as ad  # noqa: PLC0415
    import minigrad.distributed as dist  # noqa: PLC0415
    import minigrad.functional as F  # noqa: PLC0415
    import minigrad.module as M  # noqa: PLC0415
    import minigrad.optimizer as optim  # noqa: PLC0415

    mg.random.seed(0)
    model = M.Sequential(
        M.Linear(784, 512), M.ReLU(), M.Linear(512, 512), M.ReLU(), M.Linear(512, 10)
    )
    world = dist.get_world_size() if dist.is_distributed() else 1
    cbs = [dist.make_allreduce_cb("mean")] if world > 1 and allreduce else None
    gm = ad.GradManager().attach(model.parameters(), callbacks=cbs)
    opt = optim.SGD(model.parameters(), lr=0.01)
    x, y = _batch(batch, seed=dist.get_rank() if world > 1 else 0)
    x, y = mg.tensor(x), mg.tensor(y)
    times = []
    for i in range(warmup + steps):
        if world > 1 and i == warmup:
            dist.comm.barrier()  # start timing together; the all-reduce keeps ranks in step
        t0 = time.perf_counter()
        with gm:
            gm.backward(F.nn.cross_entropy(model(x), y))
        if world > 1 and not allreduce:
            dist.comm.barrier()
        opt.step().clear_grad()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_minigrad(steps: int) -> dict:
    import minigrad as mg  # noqa: PLC0415
    import minigrad.distributed as dist  # noqa: PLC0415

    mg.set_num_threads(2)  # the single process gets both cores; launcher ranks get one each
    single = minigrad_steps(128, steps)
    launch = dist.launcher(minigrad_steps, n_gpus=2, device_type="cpu")
    dp = max(launch(64, steps))
    no_comm = max(launch(64, steps, allreduce=False))
    grad_bytes = 4 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))
    return {"single_s": single, "dp_s": dp, "ratio": single / dp, "no_comm_s": no_comm,
            "ratio_no_comm": single / no_comm, "grad_bytes": grad_bytes}


def _torch_worker(rank, port, steps, out):
    import torch  # noqa: PLC0415
    import torch.distributed as tdist  # noqa: PLC0415

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out.put((rank, torch_steps(64, steps, ddp=True)))
    tdist.destroy_process_group()


def torch_steps(batch: int, steps: int, ddp: bool = False, warmup: int = 5) -> float:
    import torch  # noqa: PLC0415

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _batch(batch)
    x, y = torch.from_numpy(x), torch.from_numpy(y).long()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_torch(steps: int) -> dict | None:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    import multiprocessing as mp  # noqa: PLC0415

    torch.set_num_threads(2)
    single = torch_steps(128, steps)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_torch_worker, args=(r, port, steps, q)) for r in range(2)]
    for p in procs:
        p.start()
    dp = max(q.get(timeout=600)[1] for _ in procs)
    for p in procs:
        p.join(60)
    return {"single_s": single, "dp_s": dp, "ratio": single / dp}


def _summary(rounds: list[dict]) -> dict:
    ratios = [r["ratio"] for r in rounds]
    out = {"single_s": float(np.median([r["single_s"] for r in rounds])),
           "dp_s": float(np.median([r["dp_s"] for r in rounds])),
           "ratio": float(np.median(ratios)), "ratio_p10": float(np.percentile(ratios, 10)),
           "rounds": rounds}
    if "no_comm_s" in rounds[0]:
        out["no_comm_s"] = float(np.median([r["no_comm_s"] for r in rounds]))
        out["ratio_no_comm"] = float(np.median([r["ratio_no_comm"] for r in rounds]))
        # the all-reduce's share of a step: paired within each round, the median of the rounds
        comm_s = float(np.median([r["dp_s"] - r["no_comm_s"] for r in rounds]))
        out["allreduce_s"] = comm_s
        out["allreduce_gb_s"] = rounds[0]["grad_bytes"] / comm_s / 1e9 if comm_s > 0 else None
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=RESULTS / "dp_scaling.json")
    args = p.parse_args(argv)
    runs = {"minigrad": [], "torch": []}
    for i in range(args.rounds):
        order = ("minigrad", "torch") if i % 2 == 0 else ("torch", "minigrad")
        for name in order:
            r = run_minigrad(args.steps) if name == "minigrad" else run_torch(args.steps)
            if r is not None:
                runs[name].append(r)
    results = {
        "machine": cpu_name(),
        **{name: _summary(rs) if rs else None for name, rs in runs.items()},
    }
    print(f"{'framework':<10} {'1x128 (2 thr) ms':>17} {'2x64 DP ms':>11} "
          f"{'ratio median':>13} {'ratio p10':>10}   ({args.rounds} rounds)")
    for name in ("minigrad", "torch"):
        r = results[name]
        if r is not None:
            print(
                f"{name:<10} {r['single_s'] * 1e3:>17.2f} {r['dp_s'] * 1e3:>11.2f} "
                f"{r['ratio']:>13.2f} {r['ratio_p10']:>10.2f}"
            )
    r = results["minigrad"]
    if r is not None and "no_comm_s" in r:
        rate = f"{r['allreduce_gb_s']:.1f} GB/s" if r["allreduce_gb_s"] else "n/a"
        print(f"minigrad without the gradient all-reduce: 2x64 {r['no_comm_s'] * 1e3:.2f} ms, "
              f"ratio {r['ratio_no_comm']:.2f}; the all-reduce of {r['rounds'][0]['grad_bytes']} B "
              f"adds {r['allreduce_s'] * 1e3:.2f} ms per step ({rate})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
