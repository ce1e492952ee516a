"""All-reduce latency and bandwidth: minigrad's cpu backend vs torch.distributed gloo (if any).

Run: ``python benchmarks/bench_collectives.py [--nproc 2] [--iters 30]``. Prints a table and writes
``benchmarks/results/collectives.json``. Algorithm bandwidth = bytes of the array / time per call.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.launcher import launcher

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]


def _iters_for(nbytes: int, iters: int) -> int:
    return iters * 10 if nbytes <= (64 << 10) else iters


def _time_calls(fn, n: int) -> float:
    """Median seconds per call over ``n`` calls, after warm-up (first-touch page faults)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _minigrad_body(sizes, iters, transport):
    out = {}
    for nbytes in sizes:
        x = np.random.default_rng(dist.get_rank()).random(nbytes // 4).astype(np.float32)
        comm.barrier()
        out[nbytes] = _time_calls(lambda x=x: comm.all_reduce(x), _iters_for(nbytes, iters))
    return out


def _gloo_body(sizes, iters, port):
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
    )
    out = {}
    for nbytes in sizes:
        t = torch.rand(nbytes // 4)
        tdist.barrier()
        out[nbytes] = _time_calls(lambda t=t: tdist.all_reduce(t), _iters_for(nbytes, iters))
    tdist.destroy_process_group()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raw_copy_bandwidth(nbytes: int = 16 << 20) -> float:
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    return nbytes / _time_calls(lambda: np.copyto(b, a), 20) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "collectives.json"))
    args = ap.parse_args()
    run = launcher(_minigrad_body, n_gpus=args.nproc, device_type="cpu", job_timeout=600)
    rows = {"minigrad-shm": run(SIZES, args.iters, "shm")[0]}
    os.environ["MINIGRAD_DIST_TRANSPORT"] = "tcp"
    rows["minigrad-tcp"] = run(SIZES, args.iters, "tcp")[0]
    del os.environ["MINIGRAD_DIST_TRANSPORT"]
    try:
        import torch  # noqa: F401

        gloo = launcher(_gloo_body, n_gpus=args.nproc, device_type="cpu", job_timeout=600)
        rows["torch-gloo"] = gloo(SIZES, args.iters, _free_port())[0]
    except ImportError:
        pass
    print(f"all_reduce float32, {args.nproc} processes, {os.cpu_count()} cores "
          f"(raw memcpy {_raw_copy_bandwidth():.2f} GB/s)")
    print(f"{'size':>9} | " + " | ".join(f"{k:>22}" for k in rows))
    for nbytes in SIZES:
        cells = []
        for k in rows:
            t = rows[k][nbytes]
            cells.append(f"{t * 1e6:9.1f} us {nbytes / t / 1e9:6.2f} GB/s")
        print(f"{nbytes // 1024:>6} KiB | " + " | ".join(f"{c:>22}" for c in cells))
    result = {
        "nproc": args.nproc,
        "cpu_count": os.cpu_count(),
        "seconds_per_call": {k: {str(s): v for s, v in r.items()} for k, r in rows.items()},
    }
    if "torch-gloo" in rows:
        g, m = rows["torch-gloo"], rows["minigrad-shm"]
        result["bandwidth_ratio_16MiB_vs_gloo"] = g[16 << 20] / m[16 << 20]
        result["latency_ratio_4KiB_vs_gloo"] = m[4 << 10] / g[4 << 10]
        print(f"16 MiB bandwidth: {result['bandwidth_ratio_16MiB_vs_gloo']:.2f}x gloo "
              f"(target >= 2.5); 4 KiB latency: {result['latency_ratio_4KiB_vs_gloo']:.2f}x gloo "
              f"(target <= 0.5)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
