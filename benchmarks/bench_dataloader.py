"""DataLoader throughput on the bundled MNIST (8000 images), batch 128, Normalize + ToMode("CHW").

Usage: python benchmarks/bench_dataloader.py [--epochs 3] [--workers 0 2]

Prints samples/s per num_workers (best of the timed epochs; worker start-up is included because a
fresh set of workers is started every epoch) and writes ``benchmarks/results/dataloader.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from machine import cpu_name

from minigrad.data.dataloader import DataLoader
from minigrad.data.dataset.vision.mnist import MNIST
from minigrad.data.sampler import RandomSampler
from minigrad.data.transform import Compose, Normalize, ToMode


def measure(dataset: MNIST, num_workers: int, epochs: int, batch_size: int) -> tuple[float, float]:
    """(best, mean) samples/s over ``epochs`` full passes after one warm-up pass."""
    transform = Compose([Normalize(mean=33.32, std=78.57), ToMode("CHW")])
    sampler = RandomSampler(dataset, batch_size=batch_size, seed=0)
    loader = DataLoader(dataset, sampler, transform=transform, num_workers=num_workers)
    rates = []
    for epoch in range(epochs + 1):
        start, n = time.perf_counter(), 0
        for images, _labels in loader:
            n += len(images)
        if epoch > 0:
            rates.append(n / (time.perf_counter() - start))
    return max(rates), sum(rates) / len(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    dataset = MNIST(train=True, subset="bundled")
    print(f"bundled MNIST train: {len(dataset)} samples, batch {args.batch_size}, "
          f"Normalize+ToMode(CHW); {cpu_name()}")
    print(f"{'num_workers':>11} | {'best samples/s':>14} | {'mean samples/s':>14}")
    print(f"{'-' * 11}-+-{'-' * 14}-+-{'-' * 14}")
    results = {"batch_size": args.batch_size, "samples_per_s": {}}
    for workers in args.workers:
        best, mean = measure(dataset, workers, args.epochs, args.batch_size)
        print(f"{workers:>11} | {best:>14,.0f} | {mean:>14,.0f}")
        results["samples_per_s"][workers] = {"best": best, "mean": mean}
    out = Path(__file__).resolve().parent / "results" / "dataloader.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
