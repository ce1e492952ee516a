"""All-reduce latency and bandwidth on 2 processes: minigrad's cpu and mpi backends, raw mpi4py and
torch.distributed's gloo, measured in the same processes, interleaved round by round; the cpu
backend both on ordinary arrays and on shared buffers (``comm.shared_empty``, read in place).

Run: ``python benchmarks/bench_collectives.py [--rounds 15]``. It restarts itself under
``mpiexec -n 2`` (from the ``[mpi]`` extra) so that all four run in one job; without mpiexec it
measures the cpu backend and gloo through ``@dist.launcher``. Each round times a block of calls per
implementation (the order rotates between rounds); the table gives the median and the 10th
percentile of the rounds' time per call, and the algorithm bandwidth (array bytes / time) of the
median. Writes ``benchmarks/results/collectives.json`` (medians in ``seconds_per_call``).

A block lasts at least :data:`BLOCK_SECONDS` (its number of calls is calibrated once, after the
warm-up, and agreed by all ranks): what is measured is the steady-state latency of repeated calls.
Blocks of a fixed 50 calls of 4 KiB lasted a fraction of a millisecond, and after a gloo block
(whose calls sleep in the kernel for milliseconds) the first calls of the next block ran on cold
cores: that transient alone made both minigrad and mpi4py 25-55% slower per call (measured on a
2-core AMD EPYC, 2026-11-27).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
from machine import cpu_name

import minigrad.distributed as dist
from minigrad.distributed import comm

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
WORKER_FLAG = "--worker"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "collectives.json")


BLOCK_SECONDS = 0.004  # shortest timed block; see the module docstring
SHARED = "minigrad-cpu shared"  # the cpu backend on shared buffers (comm.shared_empty)
MIN_CALLS = 3


def _calibrate(fn, x, barrier) -> int:
    """Calls of ``fn(x)`` that take at least BLOCK_SECONDS on rank 0, twice in a row (doubling
    from MIN_CALLS); rank 0 tells the others what comes next, so every rank makes the same calls.

    Twice, because one slow block (a core waking from idle, the other rank late) would otherwise
    fix a count whose blocks then last a fraction of BLOCK_SECONDS for the whole run: a suite run
    on 2026-11-28 read 24.5 us per 4 KiB call on the cpu backend in all 15 rounds where reruns read
    7.1-7.2 us, and blocks held to 24 calls read 12.6 us per call against 5.8 us (AMD EPYC)."""
    calls, long_before = MIN_CALLS, False
    while True:
        barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn(x)
        long = time.perf_counter() - t >= BLOCK_SECONDS
        # rank 0's verdict: 0 = done, 1 = the same count once more, 2 = double it
        verdict = [0 if (long and long_before) or calls >= (1 << 16) else 1 if long else 2]
        dist.broadcast_object_list(verdict)
        if verdict[0] == 0:
            return calls
        long_before = verdict[0] == 1
        if verdict[0] == 2:
            calls *= 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _implementations(use_mpi: bool) -> tuple[dict, callable, callable, callable]:
    """``name -> fn(array)`` for every all-reduce to compare, a barrier that syncs them all, a
    function that closes what was opened, and ``shared(count)``: a shared buffer of the cpu
    backend's group."""
    impls = {}
    cpu_group = dist.new_group(None, backend="cpu") if use_mpi else None
    impls["minigrad-cpu"] = lambda x: dist.all_reduce(x, group=cpu_group)
    impls[SHARED] = impls["minigrad-cpu"]  # on arrays from comm.shared_empty (see measure)
    shared = lambda count: comm.shared_empty(count, np.float32, cpu_group)
    barrier = dist.barrier
    if use_mpi:
        from mpi4py import MPI

        raw = MPI.COMM_WORLD.Dup()
        impls["minigrad-mpi"] = lambda x: dist.all_reduce(x)
        impls["mpi4py"] = lambda x: raw.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        barrier = raw.Barrier
    try:
        import torch
        import torch.distributed as tdist
    except ImportError:
        return impls, barrier, lambda: None, shared
    torch.set_num_threads(1)
    port = [_free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port[0]}",
                             rank=dist.get_rank(), world_size=dist.get_world_size())
    impls["torch-gloo"] = lambda x: tdist.all_reduce(torch.from_numpy(x))
    return impls, barrier, tdist.destroy_process_group, shared


def measure(sizes: list[int], rounds: int, use_mpi: bool) -> dict:
    """Per-call seconds of every implementation: ``{name: {size: [one sample per round]}}``."""
    impls, barrier, close, shared_empty = _implementations(use_mpi)
    names = list(impls)
    samples = {name: {n: [] for n in sizes} for name in names}
    private = {n: np.zeros(n // 4, np.float32) for n in sizes}  # zeros: sums stay 0 forever
    shared = {n: shared_empty(n // 4) for n in sizes}
    for x in shared.values():
        x[:] = 0
    arrays = {name: shared if name == SHARED else private for name in names}
    for name in names:  # warm up: first-touch page faults, connections, buffers
        for n in sizes:
            for _ in range(MIN_CALLS):
                impls[name](arrays[name][n])
    calls_per_block = {name: {n: _calibrate(impls[name], arrays[name][n], barrier)
                              for n in sizes} for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            for n in sizes:
                calls = calls_per_block[name][n]
                barrier()
                t = time.perf_counter()
                for _ in range(calls):
                    impls[name](arrays[name][n])
                samples[name][n].append((time.perf_counter() - t) / calls)
    barrier()
    close()  # gloo's threads must be joined before exit, or the process aborts
    return samples


def _report(samples: dict, sizes: list[int], rounds: int, launch: str) -> dict:
    stats = {name: {n: (float(np.median(s[n])), float(np.percentile(s[n], 10))) for n in sizes}
             for name, s in samples.items()}
    print(f"all_reduce float32 in place, 2 processes ({launch}), {os.cpu_count()} cores: "
          f"{cpu_name()}; {rounds} interleaved rounds; median / p10 per call")
    print(f"{'size':>9} | " + " | ".join(f"{name:>30}" for name in stats))
    for n in sizes:
        cells = []
        for name in stats:
            med, p10 = stats[name][n]
            cells.append(f"{med * 1e6:8.1f} / {p10 * 1e6:7.1f} us {n / med / 1e9:5.2f} GB/s")
        print(f"{n // 1024:>6} KiB | " + " | ".join(f"{c:>30}" for c in cells))
    result = {
        "nproc": 2,
        "cpu_count": os.cpu_count(),
        "cpu": cpu_name(),
        "launch": launch,
        "rounds": rounds,
        "seconds_per_call": {k: {str(n): v[n][0] for n in sizes} for k, v in stats.items()},
        "p10_seconds_per_call": {k: {str(n): v[n][1] for n in sizes} for k, v in stats.items()},
    }
    if "mpi4py" in stats:
        ratios = {str(n): stats["minigrad-mpi"][n][0] / stats["mpi4py"][n][0] for n in sizes}
        result["minigrad_mpi_time_vs_mpi4py"] = ratios
        print("minigrad mpi / raw mpi4py time per call: "
              + ", ".join(f"{int(n) // 1024} KiB {r:.2f}x" for n, r in ratios.items())
              + " (target: within 1.10x)")
    if "torch-gloo" in stats:
        big, small = max(sizes), min(sizes)
        gloo, cpu = stats["torch-gloo"], stats["minigrad-cpu"]
        result["bandwidth_ratio_16MiB_vs_gloo"] = gloo[big][0] / cpu[big][0]
        result["latency_ratio_4KiB_vs_gloo"] = cpu[small][0] / gloo[small][0]
    return result


def _worker(args) -> None:
    use_mpi = args.launch == "mpiexec"
    if use_mpi:
        dist.init_process_group(backend="mpi")
    samples = measure(args.sizes, args.rounds, use_mpi)
    if dist.get_rank() == 0:
        result = _report(samples, args.sizes, args.rounds, args.launch)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    dist.barrier()  # the others wait for the report: mpiexec ends the job when one rank leaves
    if use_mpi:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes per array")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument(WORKER_FLAG, dest="launch", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.launch is not None:
        _worker(args)
        return
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec")
    if mpiexec is not None:
        cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), *sys.argv[1:],
               WORKER_FLAG, "mpiexec"]
        sys.exit(subprocess.call(cmd))
    args.launch = "dist.launcher"
    dist.launcher(_worker, n_gpus=2, device_type="cpu", job_timeout=900)(args)


if __name__ == "__main__":
    main()
