"""What autocast costs: (1) the check that every op on autocast's lists now makes when autocast is
off, on tiny ops; (2) a training step under autocast against float32 on the CPU.

(1) The tree of git revision ``--before`` (without autocast) is exported to a temporary folder;
rounds alternate between a child process importing that tree and one importing this checkout,
each timing the same tiny ops (4x4 tensors, recorded by a GradManager and unrecorded), so both
see the same machine load; prints the median over rounds of each child's per-op time in ns.

The differences between two processes are dominated by noise of +-1 us (see the unchanged
control op), so the check itself is also timed directly (``autocast_check_ns``), and each changed
op function is timed against its source at ``--before`` in this process, interleaved
(``autocast_off_in_process``).

(2) One process: an MLP step (forward, backward, Adam) in float32, under ``autocast()``
(float16) with a GradScaler, and under ``autocast(low_prec_dtype="bfloat16")``, interleaved.

    python benchmarks/bench_autocast.py --before 16b5bb3 --rounds 15
"""

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
import minigrad as mg, minigrad.autodiff as ad, minigrad.functional as F
x = mg.tensor(np.ones((4, 4), np.float32)); w = mg.Parameter(np.ones((4, 4), np.float32))
gm = ad.GradManager().attach([w])
ops = {"linear": lambda: F.linear(x, w), "matmul": lambda: F.matmul(x, w),
       "exp": lambda: F.exp(w), "sum": lambda: F.sum(w), "softmax": lambda: F.softmax(w),
       "x * w (control, unchanged)": lambda: x * w}
n = int(sys.argv[1]); out = {}
for name, op in ops.items():
    for recorded in (False, True):
        for _ in range(200): op()
        if recorded: gm.record()
        t0 = time.perf_counter()
        for _ in range(n): op()
        out[f"{name}{' recorded' if recorded else ''}"] = (time.perf_counter() - t0) / n * 1e9
        if recorded: gm.release()
print(json.dumps(out))
"""


def export(revision: str, into: Path) -> Path:
    """The tree of ``revision`` as files under ``into`` (``git archive``)."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "minigrad"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    path = into / "tree.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into)  # noqa: S202 (our own repository's tree)
    return into


def child_times(tree: Path, n: int) -> dict:
    env = {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def off_cost(before: str, rounds: int, n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        old = export(before, Path(tmp))
        samples: dict = {"before": [], "after": []}
        for _ in range(rounds):
            samples["before"].append(child_times(old, n))
            samples["after"].append(child_times(ROOT, n))
    table = {}
    for op in samples["before"][0]:
        b = statistics.median(s[op] for s in samples["before"])
        a = statistics.median(s[op] for s in samples["after"])
        table[op] = {"before_ns": round(b), "after_ns": round(a), "delta_ns": round(a - b)}
    return table


_READ_LOOP = """
t0 = time.perf_counter()
for _ in range(n):
    if AUTOCAST.enabled:
        pass
elapsed = time.perf_counter() - t0
"""


def old_function(revision: str, module: str, name: str):
    """Function ``name`` of ``module`` as it was at ``revision`` (its source run in a fresh
    namespace, importing today's other modules): the same op without the autocast check."""
    path = "minigrad/" + module.split(".", 1)[1].replace(".", "/") + ".py"
    source = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    namespace: dict = {"__name__": module + "_before"}
    exec(compile(source, f"{module}_before.py", "exec"), namespace)  # noqa: S102
    return namespace[name]


def in_process(before: str, rounds: int, n: int) -> dict:
    """Old and new op interleaved in this process: medians over rounds, ns per call."""
    import numpy as np

    import minigrad as mg
    import minigrad.autodiff as ad
    import minigrad.functional as F
    from minigrad.functional._util import compute_mode_inputs

    x = mg.tensor(np.ones((4, 4), np.float32))
    w = mg.Parameter(np.ones((4, 4), np.float32))
    gm = ad.GradManager().attach([w])
    pairs = {
        "linear": (old_function(before, "minigrad.functional.linalg", "linear"), F.linear, (x, w)),
        "matmul": (old_function(before, "minigrad.functional.linalg", "matmul"), F.matmul, (x, w)),
        "sum": (old_function(before, "minigrad.functional.reduction", "sum"), F.sum, (w,)),
        "softmax": (old_function(before, "minigrad.functional.softmax_family", "softmax"),
                    F.softmax, (w,)),
        "exp": (old_function(before, "minigrad.functional.elementwise", "exp"), F.exp, (w,)),
        "compute_mode_inputs (bfloat16 test of the products)": (
            old_function(before, "minigrad.functional._util", "compute_mode_inputs"),
            compute_mode_inputs, ("matmul", "default", x, w)),
    }
    table = {}
    for name, (old, new, args) in pairs.items():
        for recorded in (False, True):
            times: dict = {"before": [], "after": []}
            if recorded:
                gm.record()
            for _ in range(rounds):
                for kind, fn in (("before", old), ("after", new)):
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn(*args)
                    times[kind].append((time.perf_counter() - t0) / n * 1e9)
            if recorded:
                gm.release()
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            table[name + (" recorded" if recorded else "")] = {
                "before_ns": round(b), "after_ns": round(a), "delta_ns": round(a - b)}
    return table


def check_ns(n: int = 2_000_000) -> float:
    """The check itself, as the ops make it: ``if AUTOCAST.enabled:`` (a module global, then a
    slot of a process-wide object), minus an empty loop's iteration."""
    import minigrad.functional.linalg as linalg

    def read():
        scope = {"AUTOCAST": linalg.AUTOCAST, "n": n, "time": time}
        exec(_READ_LOOP, scope)  # noqa: S102 (the loop with AUTOCAST as a module global)
        return scope["elapsed"]

    def empty():
        scope = {"AUTOCAST": None, "n": n, "time": time}
        exec(_READ_LOOP.replace("AUTOCAST.enabled", "False"), scope)  # noqa: S102
        return scope["elapsed"]

    reads, empties = [], []
    for _ in range(7):  # interleaved; the minimum of each is its least disturbed run
        reads.append(read())
        empties.append(empty())
    return round((min(reads) - min(empties)) / n * 1e9, 1)


def step_times(rounds: int) -> dict:
    import numpy as np

    import minigrad as mg
    import minigrad.amp as amp
    import minigrad.autodiff as ad
    import minigrad.functional as F
    import minigrad.module as M
    import minigrad.optimizer as optim

    mg.random.seed(0)
    net = M.Sequential(M.Linear(512, 1024), M.ReLU(), M.Linear(1024, 1024), M.ReLU(),
                       M.Linear(1024, 10))
    opt = optim.Adam(net.parameters(), lr=1e-4)
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler()
    x = mg.tensor(np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32))
    y = mg.tensor(np.arange(256) % 10)

    def step(mode):
        with gm:
            if mode == "float32":
                gm.backward(F.nn.cross_entropy(net(x), y))
            else:
                with amp.autocast(low_prec_dtype=mode):
                    loss = F.nn.cross_entropy(net(x), y)
                scaler.backward(gm, loss)
        opt.step().clear_grad()

    modes = ["float32", "float16", "bfloat16"]
    times = {m: [] for m in modes}
    for m in modes:
        step(m)  # warm up
    for _ in range(rounds):
        for m in modes:
            t0 = time.perf_counter()
            step(m)
            times[m].append(time.perf_counter() - t0)
    base = statistics.median(times["float32"])
    return {m: {"median_ms": round(statistics.median(t) * 1e3, 2),
                "vs_float32": round(statistics.median(t) / base, 2)} for m, t in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="16b5bb3", help="git revision without autocast")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--step-rounds", type=int, default=10)
    args = p.parse_args(argv)
    result = {"autocast_check_ns": check_ns(),
              "autocast_off_in_process": in_process(args.before, args.rounds * 4, args.ops // 3),
              "autocast_off_tiny_ops": off_cost(args.before, args.rounds, args.ops),
              "mlp_step_cpu": step_times(args.step_rounds)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
