"""Tensor parallelism: bytes each rank sends per training step of a transformer block, against the
formulas, in every mode; step time at tensor size 2 against one process.

Run: ``python benchmarks/bench_tensor_parallel.py [--rounds 7] [--steps 10]``. Prints two tables and
writes ``benchmarks/results/tensor_parallel.json``.

**Bytes.** One training step (forward and backward, input gradient included) of a pre-LN block
(``dim`` h, 4h MLP) on ``B = batch × seq`` tokens in float32 (``e`` = 4 bytes), under
``tp.log_collectives``: every collective of the tensor-parallel code goes through the region
functions, which count the bytes this rank sends with the bandwidth-optimal algorithm of each kind
(ring all-reduce ``2(P-1)/P·n``, all-gather ``(P-1)·n``, reduce-scatter ``(P-1)/P·n``, broadcast
``(P-1)·n`` from the root; see ``collective_log``). The formulas are per rank, summed over the four
Linears ``K -> N`` of the block (h->3h, h->h, h->4h, 4h->h):

* 1D (P): 2 all-reduces forward + 2 backward of the ``B × h`` activation:
  ``4 · 2(P-1)/P · B·h·e`` (exact: LayerNorms and the row biases are replicated).
* 2D (q² ranks), SUMMA per Linear: forward q row broadcasts of the ``X`` block and q column
  broadcasts of the ``W`` block (each rank is the root once: ``(q-1)(|X|+|W|)/q²``); backward the
  same broadcasts again plus q reduces of ``dX`` and of ``dW`` blocks: in all
  ``3(q-1)(B·K + K·N)/q² · e``.
* 2.5D (d·q² ranks): the 2D cost on ``B/d`` rows, plus the depth all-reduce of ``dW``:
  ``[3(q-1)(B·K/d + K·N)/q² + 2(d-1)/d · K·N/q²] · e``.
* 3D (q³): all-gathers of X (input group) and W (weight group), reduce-scatter of Y (output group)
  forward; their adjoints backward: ``2(q-1)(B·K + K·N + B·N)/q³ · e``.

These are the papers' terms (Megatron, Optimus/SUMMA, Tesseract, 3D). The "exact" column adds
what this implementation also sends in 2D/2.5D/3D — biases and LayerNorm parameters as feature
blocks (all-gather forward, reduce-scatter backward over the batch group of G ranks:
``2(G-1)·n/(q·G)`` per vector of n features) and the LayerNorm statistics (4 all-reduces of
``B_local`` values over the feature group) — and must match the measurement to rounding; the
paper terms within 5%. The "wire" column is measured independently below the collectives: the
bytes the CPU backend hands its transport for other ranks (its all-reduce sends the whole array
to each peer below 64 KiB or with 2 ranks, a reduce-scatter + all-gather above: for the shapes
here both equal the ring's ``2(P-1)/P·n``).

**Time.** Median and p10 over interleaved rounds of the per-step time of the same block (float32):
one process with one BLAS thread and with one per core, tensor size 2 (1D: two processes, one
thread each), and PyTorch's block in one process with the same thread counts when PyTorch is
installed. Needs threadpoolctl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from machine import cpu_name
from threadpoolctl import threadpool_limits

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp
from minigrad.distributed.comm.providers.cpu.shm import ShmTransport
from minigrad.distributed.comm.providers.cpu.tcp import TcpTransport
from minigrad.distributed.runtime.launcher import launcher

MODES = [
    ("1d", 2, dict(tensor=dict(size=2, mode="1d"))),
    ("1d", 4, dict(tensor=dict(size=4, mode="1d"))),
    ("2d", 4, dict(tensor=dict(size=4, mode="2d"))),
    ("2.5d", 8, dict(tensor=dict(size=8, mode="2.5d", depth=2))),
    ("3d", 8, dict(tensor=dict(size=8, mode="3d"))),
]
E = 4  # float32


def linears(h: int):
    """``(K, N)`` of the block's Linears: q/k/v, output projection, MLP in and out."""
    return [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)]


def paper_bytes(mode: str, size: int, tokens: int, h: int) -> float:
    """The papers' communication per rank per training step of one block (see module doc)."""
    b = tokens
    if mode == "1d":
        return 4 * 2 * (size - 1) / size * b * h * E
    if mode in ("2d", "2.5d"):
        d = 2 if mode == "2.5d" else 1
        q = round((size // d) ** 0.5)
        return E * sum(3 * (q - 1) * (b * k / d + k * n) / q**2 + 2 * (d - 1) / d * k * n / q**2
                       for k, n in linears(h))
    q = round(size ** (1 / 3))
    return E * sum(2 * (q - 1) * (b * k + k * n + b * n) / q**3 for k, n in linears(h))


def exact_bytes(mode: str, size: int, tokens: int, h: int) -> float:
    """``paper_bytes`` plus the feature parameters and LayerNorm statistics of this
    implementation (see module doc)."""
    if mode == "1d":
        return paper_bytes(mode, size, tokens, h)
    d = 2 if mode == "2.5d" else 1
    q = round((size // d) ** 0.5) if mode != "3d" else round(size ** (1 / 3))
    group = size // q  # the batch group: the ranks sharing my feature block
    rows = tokens // group
    vectors = [n for _, n in linears(h)] + [h] * 4  # 4 biases, 2 LayerNorms × (weight, bias)
    extra = sum(2 * (group - 1) * n / (q * group) for n in vectors)
    extra += 2 * 4 * 2 * (q - 1) / q * rows  # 2 LayerNorms × 4 all-reduces of `rows` values
    return paper_bytes(mode, size, tokens, h) + E * extra


def _block(h, heads):
    mg.random.seed(0)
    tp.reset_layout()
    return tp.TransformerBlock(h, heads)


def _count_wire_bytes() -> list:
    """Count the bytes the CPU backend hands its transport for other ranks (an independent check
    of the log's per-collective model; this worker process only). Returns a one-item counter."""
    counter = [0]
    for cls in (ShmTransport, TcpTransport):
        def exchange(self, header, sends, *rest, _orig=cls.exchange):
            counter[0] += sum(a.nbytes for j, a in enumerate(sends)
                              if a is not None and j != self.index)
            return _orig(self, header, sends, *rest)
        cls.exchange = exchange
    return counter


def _bytes_job(parallel, batch, seq, h, heads):
    dist.init_parallel(parallel)
    block = _block(h, heads)
    x = tp.split_input(mg.tensor(np.random.default_rng(0).standard_normal((batch, seq, h)),
                                 dtype="float32"))
    gm = ad.GradManager().attach(list(block.parameters()) + [x])
    wire = _count_wire_bytes()
    with tp.log_collectives() as log:
        with gm:
            gm.backward(block(x).sum())
    return log.bytes_sent(), wire[0]


def _time_steps(block, x, steps):
    opt = optim.SGD(block.parameters(), lr=1e-3)
    gm = ad.GradManager().attach(block.parameters())
    times = []
    for _ in range(steps + 2):  # two warm-up steps
        t = time.perf_counter()
        with gm:
            gm.backward(block(x).mean())
        opt.step().clear_grad()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def _tp_time_job(batch, seq, h, heads, steps):
    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    block = _block(h, heads)
    x = tp.split_input(mg.tensor(np.random.default_rng(0).standard_normal((batch, seq, h)),
                                 dtype="float32"))
    dist.group_barrier()
    return _time_steps(block, x, steps)


def _torch_step_time(batch, seq, h, heads, steps, threads):
    try:
        import torch  # noqa: PLC0415  (optional baseline)
    except ImportError:
        return None
    nn = torch.nn
    torch.set_num_threads(threads)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    block = Block()
    x = torch.randn(batch, seq, h)
    opt = torch.optim.SGD(block.parameters(), lr=1e-3)
    times = []
    for _ in range(steps + 2):
        t = time.perf_counter()
        block(x).mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def _pct(samples, p):
    return float(np.percentile(samples, p))


def main(argv=None) -> dict:
    """Run both measurements, print the tables and write the JSON results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "tensor_parallel.json"))
    args = ap.parse_args(argv)
    b, s, h, heads = args.batch, args.seq, args.dim, args.heads
    tokens = b * s
    print(f"CPU: {cpu_name()}; block dim {h}, {heads} heads, "
          f"batch {b} × seq {s} = {tokens} tokens, float32")

    rows = []
    print(f"\n{'mode':>6} {'P':>3} {'logged MB':>10} {'wire MB':>9} {'exact MB':>9} {'diff':>8} "
          f"{'paper MB':>9} {'diff':>7}")
    for mode, size, parallel in MODES:
        per_rank = launcher(_bytes_job, n_gpus=size, device_type="cpu")(parallel, b, s, h, heads)
        logged = [r[0] for r in per_rank]
        wire = [r[1] for r in per_rank]
        exact, paper = exact_bytes(mode, size, tokens, h), paper_bytes(mode, size, tokens, h)
        rows.append(dict(mode=mode, size=size, logged=logged, wire=wire, exact=exact, paper=paper))
        print(f"{mode:>6} {size:>3} {max(logged) / 1e6:10.4f} {max(wire) / 1e6:9.4f} "
              f"{exact / 1e6:9.4f} "
              f"{(max(logged) - exact) / exact:8.1e} {paper / 1e6:9.4f} "
              f"{(max(logged) - paper) / paper:7.2%}")

    cores = os.cpu_count()
    timing: dict[str, list] = {}
    mg_x = mg.tensor(np.random.default_rng(0).standard_normal((b, s, h)), dtype="float32")
    tp_job = launcher(_tp_time_job, n_gpus=2, device_type="cpu")
    for _ in range(args.rounds):
        for threads in sorted({1, cores}):
            with threadpool_limits(threads):
                t = _time_steps(_block(h, heads), mg_x, args.steps)
            timing.setdefault(f"minigrad, 1 process × {threads} thread(s)", []).append(t)
        t = max(tp_job(b, s, h, heads, args.steps))
        timing.setdefault("minigrad, tensor size 2 (1D), 2 × 1", []).append(t)
        for threads in sorted({1, cores}):
            t = _torch_step_time(b, s, h, heads, args.steps, threads)
            if t is not None:
                timing.setdefault(f"PyTorch, 1 process × {threads} thread(s)", []).append(t)
    print(f"\nstep time of the block over {args.rounds} interleaved rounds of {args.steps} steps")
    print(f"{'':40} {'median ms':>10} {'p10 ms':>8}")
    for name, samples in timing.items():
        print(f"{name:40} {statistics.median(samples) * 1e3:10.2f} {_pct(samples, 10) * 1e3:8.2f}")
    result = dict(cpu=cpu_name(), cores=os.cpu_count(), batch=b, seq=s, dim=h, heads=heads,
                  bytes=rows, step_seconds=timing)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
