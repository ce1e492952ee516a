"""dist.checkpoint throughput: save and load of a ~100 MB sharded state on 2 ranks, against the
machine's sequential write and read speed measured in the same run, with and without async_save,
and the step-time overhead while an async save is in flight.

Usage: python benchmarks/bench_checkpoint.py [--mb 100] [--dir /tmp/bench_ckpt]

The state is float32 global tensors split(0) over the 2 ranks, so each rank writes (and reads)
its half in parallel. "sequential" is one process writing the same number of bytes to one file
(write + fsync + rename, like every checkpoint file) and reading it back. Writes
``benchmarks/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
from machine import cpu_name

import minigrad as mg
import minigrad.distributed as dist
from minigrad.serialization import atomic_write
from minigrad.testing.distributed import run_workers

TENSORS = 8
STEP_N = 256  # the matrix size of one simulated training step


def _state(mb: float) -> dict:
    rows = int(mb * 2**20 / 4 / TENSORS / 1024)
    rows -= rows % 2
    pl = mg.placement("cpu", [0, 1])
    return {f"w{i}": mg.randn(rows, 1024, placement=pl, sbp=mg.sbp.split(0))
            for i in range(TENSORS)}


def _step(a: np.ndarray) -> float:
    """One simulated training step (compute only); its duration in seconds."""
    start = time.perf_counter()
    for _ in range(4):
        a = np.tanh(a @ a.T / STEP_N)
    return time.perf_counter() - start


def _rank_job(mb: float, root: str) -> dict:
    state = _state(mb)
    nbytes = sum(t.to_local().numpy().nbytes for t in state.values())
    out = {"local_bytes": nbytes}
    dist.barrier()
    start = time.perf_counter()
    dist.checkpoint.save(state, os.path.join(root, "sync"), rng=False)
    out["save_s"] = time.perf_counter() - start
    dist.barrier()
    start = time.perf_counter()
    dist.checkpoint.load(state, os.path.join(root, "sync"), rng=False)
    out["load_s"] = time.perf_counter() - start
    a = np.random.default_rng(0).standard_normal((STEP_N, STEP_N))
    out["step_s"] = float(np.median([_step(a) for _ in range(10)]))
    dist.barrier()
    start = time.perf_counter()
    future = dist.checkpoint.async_save(state, os.path.join(root, "async"), rng=False)
    out["async_call_s"] = time.perf_counter() - start
    steps = []
    while not future.done():
        steps.append(_step(a))
    future.result()
    out["async_commit_s"] = time.perf_counter() - start
    out["steps_during_async"] = len(steps)
    out["step_during_async_s"] = float(np.median(steps)) if steps else float("nan")
    return out


def _sequential(total: int, root: str) -> tuple[float, float]:
    payload = np.random.default_rng(1).integers(0, 255, total, dtype=np.uint8).tobytes()
    path = os.path.join(root, "sequential.bin")
    start = time.perf_counter()
    atomic_write(path, payload)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    return write_s, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--dir", default="/tmp/bench_ckpt")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    ranks = run_workers(_rank_job, 2, args.mb, args.dir, timeout=600)
    total = sum(r["local_bytes"] for r in ranks)
    write_s, read_s = _sequential(total, args.dir)
    mbs = total / 2**20

    def rate(seconds):
        return mbs / seconds

    slowest = {k: max(r[k] for r in ranks) for k in ("save_s", "load_s", "async_call_s",
                                                    "async_commit_s")}
    step = np.median([r["step_s"] for r in ranks])
    during = np.nanmedian([r["step_during_async_s"] for r in ranks])
    rows = [
        ("sequential write (1 process)", write_s),
        ("dist.checkpoint.save (2 ranks)", slowest["save_s"]),
        ("async_save: blocking part", slowest["async_call_s"]),
        ("async_save: until committed", slowest["async_commit_s"]),
        ("sequential read (1 process)", read_s),
        ("dist.checkpoint.load (2 ranks)", slowest["load_s"]),
    ]
    print(f"state {mbs:.1f} MiB (float32, split over 2 ranks); {cpu_name()}")
    print(f"{'':32} | {'seconds':>8} | {'MiB/s':>8}")
    print(f"{'-' * 32}-+-{'-' * 8}-+-{'-' * 8}")
    for name, seconds in rows:
        print(f"{name:32} | {seconds:8.3f} | {rate(seconds):8.0f}")
    print(f"step time {step * 1e3:.2f} ms alone, {during * 1e3:.2f} ms while an async save "
          f"is in flight ({during / step:.2f}x)")
    results = {"mib": mbs, "cpu": cpu_name(), "seconds": dict(rows),
               "step_ms": step * 1e3, "step_during_async_ms": during * 1e3}
    out = Path(__file__).resolve().parent / "results" / "checkpoint.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
