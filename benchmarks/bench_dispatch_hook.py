"""Cost of the global-tensor dispatch hook in ``Function.__call__`` on tiny local ops.

``Function.__call__`` checks one class attribute (``__minigrad_dispatch__``) per tensor input so
that global tensors can take over the call. This measures a tiny op (``x * y`` on 4 floats, and
``relu``) recorded by a GradManager and unrecorded, with the hook (the current ``__call__``) and
without it (``__call__`` as it was before the hook, from git revision ``--before``), interleaved
in one process over many rounds; prints medians and 10th percentiles in nanoseconds per op.

    python benchmarks/bench_dispatch_hook.py --before 5e0c8be --rounds 60
"""

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
from minigrad.autodiff.function import Function

ROOT = Path(__file__).resolve().parents[1]


def old_call(revision: str):
    """``Function.__call__`` from ``revision`` (same module globals as the current one)."""
    source = subprocess.run(["git", "show", f"{revision}:minigrad/autodiff/function.py"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    namespace: dict = {"__name__": "minigrad.autodiff.function_before"}
    exec(compile(source, "function_before.py", "exec"), namespace)  # noqa: S102
    return namespace["Function"].__call__


def per_op_ns(op, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        op()
    return (time.perf_counter() - t0) / n * 1e9


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="5e0c8be", help="git revision without the hook")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--ops", type=int, default=2000)
    args = p.parse_args(argv)
    calls = {"without hook": old_call(args.before), "with hook": Function.__call__}
    x, y = mg.tensor(np.ones(4, np.float32)), mg.tensor(np.ones(4, np.float32))
    gm = ad.GradManager().attach([x])
    cases = {"x * y recorded": (True, lambda: x * y), "x * y unrecorded": (False, lambda: x * y),
             "relu recorded": (True, lambda: F.relu(x))}
    times = {(c, k): [] for c in cases for k in calls}
    for _ in range(args.rounds):
        for case, (record, op) in cases.items():
            for kind, call in calls.items():
                Function.__call__ = call
                if record:
                    with gm:
                        times[case, kind].append(per_op_ns(op, args.ops))
                else:
                    times[case, kind].append(per_op_ns(op, args.ops))
    Function.__call__ = calls["with hook"]
    for case in cases:
        row = []
        for kind in calls:
            v = sorted(times[case, kind])
            row.append(f"{kind}: median {statistics.median(v):6.0f} p10 {v[len(v) // 10]:6.0f}")
        base = statistics.median(times[case, "without hook"])
        change = statistics.median(times[case, "with hook"]) / base - 1
        print(f"{case:18s} {' | '.join(row)} | change {change:+.1%}")


if __name__ == "__main__":
    main()
