"""Run every benchmark (minigrad and, when installed, PyTorch side by side), then render the
results in ``benchmarks/results/``: the JSON of each run, ``summary.md`` (the tables the README
quotes) and PNG plots (step time per model, all-reduce bandwidth vs message size, DP scaling).

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

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHES = [
    "bench_training.py",
    "bench_collectives.py",
    "bench_dp_scaling.py",
    "bench_dataloader.py",
]


def run_all() -> None:
    for script in BENCHES:
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)


def _load(name: str):
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def summary() -> str:
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "",
    ]
    tr = _load("training.json")
    for setting, block in _training_blocks(tr):
        lines += [
            f"| training step, {tr['meta']['threads']} threads, {setting} | minigrad ms "
            "| PyTorch ms | ratio | target |",
            "|---|---:|---:|---:|---:|",
        ]
        for key, r in block.items():
            if key == "overhead":
                continue
            lines.append(
                f"| {key} | {r['minigrad_ms']:.2f} | {r['torch_ms']:.2f} | {r['ratio']:.2f}x | "
                f"<= {r['target_ratio']}x |"
            )
        for key, r in block.get("overhead", {}).items():
            lines.append(
                f"| per-op {key} (us) | {r['minigrad_us']:.2f} | {r['torch_us']:.2f} | "
                f"{r['ratio']:.2f}x | {'<= 15 us' if key == 'record' else ''} |"
            )
        lines.append("")
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
            "| throughput ratio |",
            "|---|---:|---:|---:|",
        ]
        for name in ("minigrad", "torch"):
            r = dp.get(name)
            if r:
                lines.append(
                    f"| {name} | {r['single_s'] * 1e3:.2f} | {r['dp_s'] * 1e3:.2f} "
                    f"| {r['ratio']:.2f} |"
                )
        lines.append("")
    dl = _load("dataloader.json")
    if dl:
        lines += [f"| DataLoader, bundled MNIST, batch {dl['batch_size']} | samples/s (best) |",
                  "|---|---:|"]
        for workers, r in dl["samples_per_s"].items():
            lines.append(f"| num_workers={workers} | {r['best']:,.0f} |")
        lines.append("")
    return "\n".join(lines)


def _training_blocks(tr) -> list:
    """(allocator setting, {model: result}) pairs present in training.json."""
    if not tr:
        return []
    names = {"tuned_malloc": "malloc tuned", "default_malloc": "glibc malloc defaults"}
    return [(names[k], tr[k]) for k in ("tuned_malloc", "default_malloc") if k in tr]


def plots() -> list[Path]:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): skipping plots")
        return []
    out = []
    blocks = _training_blocks(_load("training.json"))
    if blocks:
        models = blocks[0][1]
        keys = [k for k in models if k != "overhead"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = range(len(keys))
        ax.bar(
            [x - 0.2 for x in xs],
            [models[k]["minigrad_ms"] for k in keys],
            0.4,
            label="minigrad",
        )
        ax.bar(
            [x + 0.2 for x in xs], [models[k]["torch_ms"] for k in keys], 0.4, label="PyTorch"
        )
        ax.set_xticks(list(xs), keys)
        ax.set_ylabel("ms per training step")
        ax.set_title(f"Training step time (CPU, {blocks[0][0]})")
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
    for path in plots():
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
