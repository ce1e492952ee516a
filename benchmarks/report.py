"""Run every benchmark (minigrad and, when installed, PyTorch side by side), then render the
results in ``benchmarks/results/``: the JSON of each run, ``summary.md`` (all tables),
``readme_table.md`` (the README's "Benchmarks" table, also printed) and PNG plots (step time per
model, all-reduce bandwidth vs message size, DP scaling).

    python benchmarks/report.py            # run everything, then plot
    python benchmarks/report.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from machine import blas_name, env_with_cpu_kernels

NAMES = {"mlp": "MLP 784-512-512-10, batch 128", "lenet": "LeNet-style CNN, batch 64",
         "transformer": "Transformer block (d 128, 4 heads, seq 64, batch 16)"}

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OWN_KERNELS = "training_cpu_kernels.json"  # bench_training.py with OpenBLAS choosing its kernels
BENCHES = [
    "bench_training.py",
    "bench_blas.py",
    "bench_collectives.py",
    "bench_dp_scaling.py",
    "bench_dataloader.py",
    "bench_threads.py",
]


def run_all() -> None:
    for script in BENCHES:
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
    env = env_with_cpu_kernels()
    if env is not None:  # the environment chose OpenBLAS's kernels
        print("== bench_training.py without OPENBLAS_CORETYPE (the CPU's own kernels)", flush=True)
        subprocess.run([sys.executable, str(HERE / "bench_training.py"), "--out",
                        str(RESULTS / OWN_KERNELS)], check=True, cwd=HERE.parent, env=env)


def _load(name: str):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _blas(meta) -> str:
    """NumPy's BLAS and its kernels (runs before that was recorded: unknown)."""
    return blas_name(meta["blas"]) if "blas" in meta else "not recorded"


def _cpu_line(tr) -> str:
    meta = tr["meta"]
    cpu, threads = meta["cpu"], meta["threads"]
    products = f"; minigrad's products: {meta['products']}" if "products" in meta else ""
    return (f"{cpu['model']} ({', '.join(cpu['simd']) or 'no AVX'}), {cpu['cores']} cores; threads "
            f"{', '.join(f'{k} {v}' for k, v in threads.items())}; NumPy {meta['numpy']}, "
            f"PyTorch {meta['torch']}; NumPy's BLAS {_blas(meta)}{products}; {meta['rounds']} "
            f"alternating rounds of {meta['steps_per_round']} steps; load average "
            f"{meta['load_average_start']:.2f} at the start, {meta['load_average_end']:.2f} at "
            "the end")


def training_table(tr) -> list[str]:
    """The training-step rows: each model's median step time in both frameworks, the median and
    p10 of the per-round ratio, and its GEMM floor (the same matrix products alone)."""
    lines = [
        "| training step | minigrad ms | PyTorch ms | ratio (median) | ratio p10 "
        "| GEMM floor ratio | target |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in tr.get("models", {}).items():
        target = r["target"]
        target = f"<= {target}x" if isinstance(target, (int, float)) else target
        lines.append(
            f"| {NAMES.get(key, key)} | {r['minigrad_ms']:.2f} | {r['torch_ms']:.2f} "
            f"| {r['ratio_median']:.2f}x | {r['ratio_p10']:.2f}x "
            f"| {r['gemm_floor']['ratio_median']:.2f}x | {target} |"
        )
    for key, r in tr.get("overhead", {}).items():
        lines.append(
            f"| recorded tiny op, {key} (us/op) | {r['minigrad_us']:.2f} | {r['torch_us']:.2f} "
            f"| {r['ratio_median']:.2f}x | {r['ratio_p10']:.2f}x |  "
            f"| {'<= 2.5 us' if key == 'record' else ''} |"
        )
    return lines


def summary() -> str:
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "",
    ]
    tr = _load("training.json")
    if tr and "models" in tr:
        lines += [_cpu_line(tr), ""] + training_table(tr) + [""]
    co = _load("collectives.json")
    if co:
        lines += [
            "| all-reduce, 2 processes | " + " | ".join(co["seconds_per_call"]) + " |",
            "|---|" + "---:|" * len(co["seconds_per_call"]),
        ]
        sizes = next(iter(co["seconds_per_call"].values())).keys()
        for size in sizes:
            cells = []
            for series in co["seconds_per_call"].values():
                t = series.get(size)
                cells.append(
                    "" if t is None else f"{t * 1e6:.0f} us, {int(size) / t / 1e9:.2f} GB/s"
                )
            lines.append(f"| {int(size) // 1024} KiB | " + " | ".join(cells) + " |")
        lines.append("")
    dp = _load("dp_scaling.json")
    if dp:
        lines += [
            "| DP MLP 784-512-512-10 | 1x128, 2 threads (ms) | 2x64, 1 thread each (ms) "
            "| throughput ratio (median) | p10 |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in ("minigrad", "torch"):
            r = dp.get(name)
            if r:
                lines.append(
                    f"| {name} | {r['single_s'] * 1e3:.2f} | {r['dp_s'] * 1e3:.2f} "
                    f"| {r['ratio']:.2f} | {r.get('ratio_p10', float('nan')):.2f} |"
                )
        r = dp.get("minigrad")
        if r and "no_comm_s" in r:
            rate = f", {r['allreduce_gb_s']:.1f} GB/s" if r.get("allreduce_gb_s") else ""
            lines.append(
                f"| minigrad without the gradient all-reduce (barrier only) | "
                f"{r['single_s'] * 1e3:.2f} | {r['no_comm_s'] * 1e3:.2f} "
                f"| {r['ratio_no_comm']:.2f} | the all-reduce of "
                f"{r['rounds'][0]['grad_bytes'] / 1e6:.1f} MB: {r['allreduce_s'] * 1e3:.2f} ms"
                f"{rate} |")
        lines.append("")
    th = _load("threads.json")
    if th:
        lines += [f"| MLP step, BLAS threads and waiting, {th['cpu']} | median ms | p10 ms |",
                  "|---|---:|---:|"]
        lines += [f"| {k} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} |"
                  for k, r in th["results"].items()]
        lines.append("")
    dl = _load("dataloader.json")
    if dl:
        lines += [f"| DataLoader, bundled MNIST, batch {dl['batch_size']} | samples/s (best) |",
                  "|---|---:|"]
        for workers, r in dl["samples_per_s"].items():
            lines.append(f"| num_workers={workers} | {r['best']:,.0f} |")
        lines.append("")
    return "\n".join(lines)


def _us(seconds: float) -> str:
    """A time per call in µs: one decimal under 100 µs (small calls differ by tenths)."""
    us = seconds * 1e6
    return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"


def _training_rows(tr, label: str) -> list[str]:
    """README rows of ``bench_training.py``'s models (``label`` ends each row's name)."""
    lines = []
    for key, r in (tr or {}).get("models", {}).items():
        target = r["target"]
        target = f"≤ {target}×" if isinstance(target, (int, float)) else target
        lines.append(f"| {NAMES.get(key, key)}, training step{label} | {r['minigrad_ms']:.2f} ms "
                     f"| {r['torch_ms']:.2f} ms | {r['ratio_median']:.2f}× "
                     f"| {r['ratio_p10']:.2f}× | {r['gemm_floor']['ratio_median']:.2f}× "
                     f"| {target} |")
    return lines


def _tiny_op_row(tr) -> list[str]:
    rec = (tr or {}).get("overhead", {}).get("record")
    if not rec:
        return []
    return [f"| recorded elementwise op on a tiny tensor | {rec['minigrad_us']:.2f} µs "
            f"| {rec['torch_us']:.2f} µs | {rec['ratio_median']:.2f}× "
            f"| {rec['ratio_p10']:.2f}× |  | ≤ 2.5 µs |"]


def _collective_rows(co) -> list[str]:
    """``bench_collectives.py``'s result as table rows (all-reduce against gloo and raw mpi4py,
    each with its target), or nothing without one."""
    if not co:
        return []
    lines = []
    big = co["seconds_per_call"]
    mine, gloo = big.get("minigrad-cpu", {}), big.get("torch-gloo", {})
    mpi, raw = big.get("minigrad-mpi", {}), big.get("mpi4py", {})
    size = str(16 << 20)
    if size in mine and size in gloo:
        lines.append(f"| all-reduce 16 MiB float32, 2 processes, bandwidth "
                     f"| {(16 << 20) / mine[size] / 1e9:.2f} GB/s "
                     f"| {(16 << 20) / gloo[size] / 1e9:.2f} GB/s (gloo) "
                     f"| {gloo[size] / mine[size]:.1f}× |  |  | ≥ 2.5× |")
    if "4096" in mine and "4096" in gloo:
        lines.append(f"| all-reduce 4 KiB, 2 processes, latency | {mine['4096'] * 1e6:.0f} µs "
                     f"| {gloo['4096'] * 1e6:.0f} µs (gloo) "
                     f"| {mine['4096'] / gloo['4096']:.2f}× |  |  | ≤ 0.5× |")
    if "4096" in mine and "4096" in raw:
        lines.append(f"| all-reduce 4 KiB, cpu backend vs raw mpi4py, time per call "
                     f"| {mine['4096'] * 1e6:.1f} µs | {raw['4096'] * 1e6:.1f} µs (mpi4py) "
                     f"| {mine['4096'] / raw['4096']:.2f}× |  |  | ≤ 2× |")
    if size in mine and size in raw:
        lines.append(f"| all-reduce 16 MiB, cpu backend vs raw mpi4py, bandwidth "
                     f"| {(16 << 20) / mine[size] / 1e9:.2f} GB/s "
                     f"| {(16 << 20) / raw[size] / 1e9:.2f} GB/s (mpi4py) "
                     f"| {raw[size] / mine[size]:.2f}× |  |  | ≥ 1× |")
    shared = big.get("minigrad-cpu shared", {})
    if size in shared and size in raw:
        lines.append(f"| all-reduce 16 MiB on shared buffers (`comm.shared_empty`), "
                     f"bandwidth | {(16 << 20) / shared[size] / 1e9:.2f} GB/s "
                     f"| {(16 << 20) / raw[size] / 1e9:.2f} GB/s (mpi4py) "
                     f"| {raw[size] / shared[size]:.2f}× |  |  |  |")
    for size, label in ((str(16 << 20), "16 MiB"), ("4096", "4 KiB")):
        if size in mpi and size in raw:
            lines.append(f"| all-reduce {label}, mpi backend vs raw mpi4py, time per call "
                         f"| {_us(mpi[size])} | {_us(raw[size])} (mpi4py) "
                         f"| {mpi[size] / raw[size]:.2f}× |  |  | ≤ 1.10× |")
    return lines


def _dp_row(dp) -> list[str]:
    """``bench_dp_scaling.py``'s result as a table row, or nothing without one."""
    if not (dp and dp.get("minigrad")):
        return []
    torch_dp = f"{dp['torch']['ratio']:.2f} (DDP)" if dp.get("torch") else ""
    return [f"| data-parallel MLP throughput, 2 ranks × 64 / 1 process × 128 "
            f"| {dp['minigrad']['ratio']:.2f} | {torch_dp} |  "
            f"| {dp['minigrad'].get('ratio_p10', float('nan')):.2f} |  | ≥ 0.9 |"]


def readme_table() -> str:
    """The README's "Benchmarks" table from the results at hand (the lead pastes it in)."""
    lines = ["| measurement | minigrad | PyTorch | ratio (median) | ratio p10 | GEMM floor "
             "| target |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    tr = _load("training.json")
    lines += _training_rows(tr, "")
    own = _load(OWN_KERNELS)
    if own:
        kernels = own["meta"].get("blas", {}).get("kernels")
        lines += _training_rows(own, f", OpenBLAS choosing its kernels ({kernels})")
    lines += _tiny_op_row(tr)
    lines += _collective_rows(_load("collectives.json")) + _dp_row(_load("dp_scaling.json"))
    dl = _load("dataloader.json")
    if dl:
        rates = " / ".join(f"{r['best']:,.0f}" for r in dl["samples_per_s"].values())
        workers = " / ".join(dl["samples_per_s"])
        lines.append(f"| DataLoader, bundled MNIST, batch {dl['batch_size']}, {workers} workers "
                     f"(samples/s) | {rates} |  |  |  |  |  |")
    if tr and "meta" in tr:
        lines += ["", _cpu_line(tr)]
    lines += blas_table()
    return "\n".join(lines)


def blas_table(name: str = "blas.json") -> list[str]:
    """``bench_blas.py``'s result (``results/<name>``) as README lines: each model's products
    under each BLAS (time, and ratio to OpenBLAS as NumPy loaded it), or nothing without
    results."""
    bl = _load(name)
    if not bl:
        return []
    names = list(next(iter(bl["models"].values())))
    lines = ["", "| matrix products of one training step (`bench_blas.py`) | "
             + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for model, row in bl["models"].items():
        cells = [f"{row[n]['ms']:.2f} ms" + ("" if n == "openblas" else
                                             f" ({row[n]['ratio_median']:.2f}×)") for n in names]
        lines.append(f"| {NAMES.get(model, model)} | " + " | ".join(cells) + " |")
    about = "; ".join(f"{n}: {a.get('library', a.get('unavailable'))}"
                      for n, a in bl["contenders"].items())
    meta = bl["meta"]
    return lines + ["", f"{meta['cpu']['model']}, {meta['threads']} threads, {meta['rounds']} "
                        f"alternating rounds; {about}"]


def gpu_host_table() -> str:
    """The README's table of the GPU machine's host CPU (an Intel Xeon), from the files
    ``gpu_check.py``'s ``cpu_bench_2_cores`` step writes (``training_cpu.json``,
    ``training_cpu_mkl.json`` when MKL was at hand, ``blas_cpu.json``, ``collectives_cpu.json`` and
    ``dp_scaling_cpu.json``, kept as ``results/gpu_host_training.json``,
    ``gpu_host_training_mkl.json``, ``gpu_host_blas.json``, ``gpu_host_collectives.json`` and
    ``gpu_host_dp_scaling.json``), or "" without them."""
    tr = _load("gpu_host_training.json")
    if not tr:
        return ""
    lines = ["| measurement | minigrad | PyTorch | ratio (median) | ratio p10 | GEMM floor "
             "| target |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += _training_rows(tr, "")
    mkl = _load("gpu_host_training_mkl.json")
    if mkl:
        lines += _training_rows(mkl, f", minigrad's products through {mkl['meta']['products']}")
    lines += _tiny_op_row(tr) + _collective_rows(_load("gpu_host_collectives.json"))
    lines += _dp_row(_load("gpu_host_dp_scaling.json")) + ["", _cpu_line(tr)]
    return "\n".join(lines + blas_table("gpu_host_blas.json"))


def gpu_table() -> str:
    """The README's GPU table from ``results/gpu.json`` (written by ``bench_gpu.py --out``), or ""
    when no GPU run is at hand."""
    g = _load("gpu.json")
    if not g:
        return ""
    cpu = f" (host CPU: {g['cpu']})" if g.get("cpu") else ""
    lines = [f"{g['gpu']}{cpu}; CuPy {g['cupy']}, PyTorch {g['torch']}, TF32 "
             f"{'on' if g['tf32'] else 'off'} on both sides; medians (p10) of {g['rounds']} "
             f"interleaved rounds of {g['steps_per_round']} steps.", "",
             "| measurement | minigrad | PyTorch CUDA | ratio |", "| --- | ---: | ---: | ---: |"]
    for r in g["training"].values():
        lines.append(f"| {r['name']}, training step | {r['minigrad_ms']:.2f} ms "
                     f"({r['minigrad_p10_ms']:.2f}) | {r['torch_ms']:.2f} ms "
                     f"({r['torch_p10_ms']:.2f}) | {r['ratio']:.2f}× |")
    for size, r in g["allreduce_world_size_1"].items():
        mine, torch = r["minigrad"], r["torch"]
        lines.append(f"| NCCL all-reduce {int(size):,} B float32, world size 1 | "
                     f"{mine['us']:.1f} µs | {torch['us']:.1f} µs | "
                     f"{mine['us'] / torch['us']:.2f}× |")
    return "\n".join(lines)


def plots() -> list[Path]:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): skipping plots")
        return []
    out = []
    tr = _load("training.json")
    if tr and tr.get("models"):
        models = tr["models"]
        keys = list(models)
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [models[k]["minigrad_ms"] for k in keys], 0.4,
               label="minigrad")
        ax.bar([x + 0.2 for x in xs], [models[k]["torch_ms"] for k in keys], 0.4, label="PyTorch")
        ax.set_xticks(list(xs), keys)
        ax.set_ylabel("ms per training step (median)")
        ax.set_title(f"Training step time, {tr['meta']['cpu']['model']}")
        ax.legend()
        out.append(_save(fig, "training.png"))
    co = _load("collectives.json")
    if co:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, series in co["seconds_per_call"].items():
            sizes = sorted(int(s) for s in series)
            ax.plot(sizes, [s / series[str(s)] / 1e9 for s in sizes], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("algorithm bandwidth (GB/s)")
        ax.set_title("all-reduce, 2 processes")
        ax.legend()
        out.append(_save(fig, "allreduce_bandwidth.png"))
    dp = _load("dp_scaling.json")
    if dp:
        names = [n for n in ("minigrad", "torch") if dp.get(n)]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(names, [dp[n]["ratio"] for n in names])
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.set_ylabel("throughput 2x64 DP / 1x128")
        ax.set_title("Data-parallel scaling, MLP on 2 cores")
        out.append(_save(fig, "dp_scaling.png"))
    return out


def _save(fig, name: str) -> Path:
    path = RESULTS / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--plot-only", action="store_true", help="do not run, only render existing results"
    )
    args = p.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    if not args.plot_only:
        run_all()
    text = summary()
    (RESULTS / "summary.md").write_text(text + "\n")
    print(text)
    print("README table (benchmarks/results/readme_table.md):\n")
    table = readme_table()
    (RESULTS / "readme_table.md").write_text(table + "\n")
    print(table)
    gpu = gpu_table()
    if gpu:
        (RESULTS / "gpu_table.md").write_text(gpu + "\n")
        print("\nGPU table (benchmarks/results/gpu_table.md):\n\n" + gpu)
    host = gpu_host_table()
    if host:
        (RESULTS / "gpu_host_table.md").write_text(host + "\n")
        print("\nGPU machine's host CPU (benchmarks/results/gpu_host_table.md):\n\n" + host)
    for path in plots():
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
