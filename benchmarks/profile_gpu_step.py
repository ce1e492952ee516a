"""Where a GPU training step's time goes, minigrad against PyTorch CUDA: the host's time to issue
one step (``dispatch``) against the step's wall time, the kernels each step launches and how long
the GPU is busy with them (torch.profiler's CUPTI trace sees CuPy's kernels as well as PyTorch's),
and minigrad's hottest Python functions (cProfile). The models are ``bench_gpu.py``'s.

    python benchmarks/profile_gpu_step.py [--models transformer mlp] [--steps 20]

When dispatch is close to wall time and the GPU is busy for a small part of it, the step is bound
by the host (Python and launch cost), and fewer kernel launches or less Python per op is what
speeds it up; when GPU busy time is close to wall time, the kernels are.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import bench_gpu


def _timings(fn, sync, steps: int) -> tuple[float, float]:
    """(dispatch, wall) milliseconds per step: host time to issue ``steps`` steps, and the time
    until the GPU finished them."""
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    issued = time.perf_counter()
    sync()
    done = time.perf_counter()
    return (issued - start) / steps * 1e3, (done - start) / steps * 1e3


def _kernels(torch, fn, sync, steps: int) -> tuple[float, float, list]:
    """GPU activities per step, GPU busy milliseconds per step, and the top kernels as
    ``(launches per step, microseconds per step, name)``."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    sync()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        sync()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    per_name: dict = {}
    for e in events:
        entry = per_name.setdefault(e.name[:90], [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    busy = sum(t for _, t in per_name.values())
    top = sorted(((n / steps, t / steps, name) for name, (n, t) in per_name.items()),
                 key=lambda row: -row[1])
    return len(events) / steps, busy / steps / 1e3, top


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["transformer"],
                   choices=["mlp", "lenet", "transformer"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25, help="kernels and functions listed")
    args = p.parse_args(argv)
    bench_gpu._tf32_off_before_cupy()  # the same TF32 setting as bench_gpu.py's table
    cp, torch = bench_gpu._gpu_or_exit()
    print(bench_gpu._tf32_off_in_torch(torch))

    def sync():
        cp.cuda.Device(0).synchronize()
        torch.cuda.synchronize()

    models = bench_gpu._models(torch)
    for key in args.models:
        name, spec_mg, spec_torch = models[key]
        steps = bench_gpu._Steps(torch, spec_mg, spec_torch)
        for _ in range(5):  # kernels compiled, pools warm
            steps.step_mg(), steps.step_torch()
        print(f"== {name}")
        for label, fn in (("minigrad", steps.step_mg), ("torch", steps.step_torch)):
            dispatch, wall = _timings(fn, sync, args.steps)
            launches, busy, top = _kernels(torch, fn, sync, min(args.steps, 10))
            print(f"{label}: dispatch {dispatch:.3f} ms/step, wall {wall:.3f} ms/step; "
                  f"{launches:.0f} GPU activities per step, GPU busy {busy:.3f} ms/step")
            for n, us, kernel in top[:args.top]:
                print(f"    {n:5.1f}x {us:9.1f} us  {kernel}")
        profiler = cProfile.Profile()
        sync()
        profiler.enable()
        for _ in range(args.steps):
            steps.step_mg()
        sync()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(f"minigrad's hottest functions over {args.steps} steps (cProfile):")
        print("\n".join(text.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
