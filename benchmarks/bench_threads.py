"""BLAS thread count and waiting policy: an MLP training step idle and next to a busy process.

Usage: python benchmarks/bench_threads.py [--rounds 4] [--steps 100] [--spins 4 12]

Each configuration runs in a fresh interpreter (OpenBLAS reads its waiting policy when it loads):

* threads: 1, or every core (``mg.set_num_threads``);
* spin: how long OpenBLAS's idle workers spin after a product before they sleep, as
  ``OPENBLAS_THREAD_TIMEOUT`` (2**value cycles): minigrad's default (see
  ``minigrad.backend.threads``), OpenBLAS's own (28, about 0.1 s) and those given with ``--spins``;
* load: idle; a busy-loop process pinned to the last core (``taskset``), like a data-loading
  worker; or another training job using every core with the same spin setting, like a second
  experiment started on the same machine.

Configurations alternate over ``--rounds`` rounds; the median and p10 of the per-step times of each
are reported with the CPU model. Results go to stdout and ``benchmarks/results/threads.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from machine import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = r"""
import json, os, sys, time
import minigrad as mg
import numpy as np
import minigrad.functional as F
from minigrad.optimizer import SGD
mg.set_num_threads(int(sys.argv[1]))
rng = np.random.default_rng(0)
shapes = [(512, 784), (512,), (512, 512), (512,), (10, 512), (10,)]
ps = [mg.Parameter((rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)) for s in shapes]
x = mg.tensor(rng.standard_normal((128, 784)).astype(np.float32))
y = mg.tensor(rng.integers(0, 10, 128).astype(np.int32))
gm, opt = mg.GradManager().attach(ps), SGD(ps, lr=0.01, momentum=0.9)
def step():
    with gm:
        h = F.relu(F.linear(x, ps[0], ps[1]))
        h = F.relu(F.linear(h, ps[2], ps[3]))
        gm.backward(F.cross_entropy(F.linear(h, ps[4], ps[5]), y))
    opt.step()
    opt.clear_grad()
for _ in range(10):
    step()
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "threads": mg.get_num_threads(),
                  "spin": os.environ.get("OPENBLAS_THREAD_TIMEOUT")}))
"""


def _env(spin: str) -> dict:
    """This repository's minigrad, no inherited thread settings, the given OpenBLAS spin."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE),
                                                                    os.environ.get("PYTHONPATH")])))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(var, None)
    if spin == "minigrad":
        env.pop("OPENBLAS_THREAD_TIMEOUT", None)  # minigrad's setting applies at import
    else:
        env["OPENBLAS_THREAD_TIMEOUT"] = spin
    return env


def run(threads: int, spin: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, str(threads), str(steps)], env=_env(spin),
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _competitor(load: str, cores: int, spin: str):
    """Start the competing process of ``load`` (None when idle) and let it warm up."""
    if load == "idle":
        return None
    if load.startswith("busy"):
        cmd = ["taskset", "-c", str(cores - 1), sys.executable, "-c", "while True: pass"]
        env = None
    else:  # the same training step, forever, on every core
        cmd = [sys.executable, "-c", WORKER.replace("int(sys.argv[2])", "10**9"), str(cores), "0"]
        env = _env(spin)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    time.sleep(1.5)
    return proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--spins", nargs="*", default=[],
                   help="more OPENBLAS_THREAD_TIMEOUT values to try (4..30)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "threads.json"))
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    spins = ["minigrad", "28"] + [s for s in args.spins if s != "28"]
    configs = [(t, s) for t in sorted({1, cores}) for s in spins]
    results: dict = {}
    for load in ("idle", "busy loop on one core", "another job on all cores"):
        samples: dict = {c: [] for c in configs}
        for _ in range(args.rounds):
            for c in configs:
                other = _competitor(load, cores, c[1])
                try:
                    r = run(*c, args.steps)
                finally:
                    if other is not None:
                        other.kill()
                        other.wait()
                assert r["threads"] == c[0], r["threads"]
                samples[c] += r["times"]
        for (t, s), times in samples.items():
            times = sorted(times)
            results[f"{load}, {t} thread(s), spin: {s}"] = {
                "median_ms": statistics.median(times) * 1e3,
                "p10_ms": times[len(times) // 10] * 1e3,
            }
    print(f"MLP 784-512-512-10 b128 training step, {cpu_name()}, "
          f"1-min load average at the start: {load_before:.2f}")
    for name, r in results.items():
        print(f"  {name:<64} median {r['median_ms']:7.2f} ms   p10 {r['p10_ms']:7.2f} ms")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"cpu": cpu_name(), "cores": cores, "load_average_at_start": load_before,
                   "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
