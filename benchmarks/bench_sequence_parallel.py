"""Sequence parallelism on CPU ranks: per-rank memory of one attention layer (forward + backward)
against the sequence length for N = 1, 2, 4 ranks, and the step time of ring attention with and
without overlapping the ring transfer.

Memory is measured per rank with tracemalloc (NumPy reports its buffers to it): the peak of
everything allocated during forward + backward, over the memory held before (q, k, v, dout). For
ring attention the kernel's own log (``record_score_blocks``) gives the largest score block too.
Timings: forward + backward of one attention layer, overlap on and off interleaved round by round,
the step time of a round being the slowest rank's; medians and p10. Through shared memory a K/V hop
costs a fraction of a percent of the block's compute, so the timings are also taken over a
*simulated* slow link (``--link-gbps``: every send first sleeps ``bytes / bandwidth``, releasing
the GIL as a socket send would), where the transfer is a sizeable part of a step and overlap has
something to hide. A single-process reference
compares minigrad's dense attention with PyTorch's ``scaled_dot_product_attention`` (when
installed), interleaved in one process.

    python benchmarks/bench_sequence_parallel.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np
from machine import cpu_name

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.distributed import sequence_parallel as sp
from minigrad.distributed.comm import arrays as comm
from minigrad.testing.distributed import run_workers

B, H, D = 1, 4, 32
MIB = 2.0**20


def _inputs(shard_len: int, seed: int):
    rng = np.random.default_rng(seed)
    return [mg.Tensor(rng.standard_normal((B, H, shard_len, D)).astype(np.float32))
            for _ in range(4)]


def _attention(impl: str, causal: bool, overlap: bool = True):
    if impl == "ring":
        return lambda q, k, v: sp.ring_attention(q, k, v, causal, causal, overlap=overlap)
    if impl == "ulysses":
        return sp.UlyssesAttention(causal)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _step(attn, q, k, v, dout) -> None:
    gm = ad.GradManager().attach([q, k, v])
    with gm:
        gm.backward((attn(q, k, v) * dout).sum())


def _memory_body(seq_len: int, impl: str, causal: bool) -> dict:
    world = dist.get_world_size()
    q, k, v, dout = _inputs(seq_len // world, dist.get_rank())
    attn = _attention(impl, causal)
    _step(attn, q, k, v, dout)  # warm up (channels, caches) before measuring
    comm.barrier()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    with sp.record_score_blocks() as blocks:
        _step(attn, q, k, v, dout)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {"peak": peak, "block": max((b.nbytes for b in blocks), default=0)}


def _simulate_link(gbps: float) -> None:
    """Make every point-to-point send of this process first wait as long as ``gbps`` would need.

    The wait goes where a slow link would put it: into the transfer itself, which ``comm.isend``
    runs on the peer's worker thread (so an overlapped ring hides it, a blocking one does not).
    This patches ``comm``'s private transfer factory: a benchmark-only instrument."""
    real_send_now = comm._send_now

    def slow_send_now(x, dst, world):
        transfer = real_send_now(x, dst, world)

        def slow_transfer():
            time.sleep(x.nbytes / (gbps * 1e9))  # releases the GIL, as a socket send would
            return transfer()

        return slow_transfer

    comm._send_now = slow_send_now


def _timing_body(seq_len: int, causal: bool, rounds: int, link_gbps: float | None) -> dict:
    if link_gbps:
        _simulate_link(link_gbps)
    world = dist.get_world_size()
    q, k, v, dout = _inputs(seq_len // world, dist.get_rank())
    times = {True: [], False: []}
    for r in range(rounds + 1):
        for overlap in ((True, False) if r % 2 == 0 else (False, True)):
            attn = _attention("ring", causal, overlap)
            comm.barrier()
            t0 = time.perf_counter()
            _step(attn, q, k, v, dout)
            if r:  # round 0 warms up
                times[overlap].append(time.perf_counter() - t0)
    return times


def _stats(per_rank: list) -> tuple:
    """Median and p10 of the per-round maximum over ranks (ms)."""
    step = np.max(np.array(per_rank), axis=0) * 1e3
    return float(np.median(step)), float(np.percentile(step, 10))


def memory_table(lengths, causal: bool) -> list:
    rows = []
    configs = [("dense", 1), ("ring", 1), ("ring", 2), ("ring", 4), ("ulysses", 2),
               ("ulysses", 4)]
    for seq_len in lengths:
        for impl, n in configs:
            res = run_workers(_memory_body, n, seq_len, impl, causal, timeout=600)
            rows.append({"L": seq_len, "impl": impl, "N": n,
                         "peak_mib": max(r["peak"] for r in res) / MIB,
                         "block_mib": max(r["block"] for r in res) / MIB})
            print(f"  L={seq_len:5d} {impl:8s} N={n}: peak {rows[-1]['peak_mib']:8.2f} MiB"
                  + (f", largest score block {rows[-1]['block_mib']:7.2f} MiB"
                     if impl == "ring" else ""), flush=True)
    return rows


def timing_table(seq_len: int, worlds, rounds: int, links) -> list:
    rows = []
    for link in links:
        for n in worlds:
            for causal in (False, True):
                res = run_workers(_timing_body, n, seq_len, causal, rounds, link, timeout=600)
                on = _stats([r[True] for r in res])
                off = _stats([r[False] for r in res])
                rows.append({"L": seq_len, "N": n, "causal": causal, "link_gbps": link,
                             "overlap_ms": on, "no_overlap_ms": off})
                where = f"{link:g} GB/s link" if link else "shared memory"
                print(f"  {where:14s} L={seq_len} N={n} causal={causal!s:5}: overlap "
                      f"{on[0]:7.1f} ms (p10 {on[1]:6.1f}), no overlap {off[0]:7.1f} ms "
                      f"(p10 {off[1]:6.1f})", flush=True)
    return rows


def reference_table(seq_len: int, rounds: int) -> dict:
    """One process, full sequence: minigrad dense attention vs PyTorch SDPA, interleaved."""
    q, k, v, dout = _inputs(seq_len, 0)
    attn = _attention("dense", True)
    try:
        import torch  # noqa: PLC0415  (optional)
    except ImportError:
        torch = None
    if torch is not None:
        tq, tk, tv = (torch.tensor(t.numpy(), requires_grad=True) for t in (q, k, v))
        tdout = torch.tensor(dout.numpy())
    times = {"minigrad": [], "torch": []}
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        _step(attn, q, k, v, dout)
        t1 = time.perf_counter()
        if torch is not None:
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            (out * tdout).sum().backward()
        t2 = time.perf_counter()
        if r:
            times["minigrad"].append(t1 - t0)
            times["torch"].append(t2 - t1)
    res = {name: (float(np.median(t) * 1e3), float(np.percentile(t, 10) * 1e3))
           for name, t in times.items() if t and (name == "minigrad" or torch is not None)}
    for name, (med, p10) in res.items():
        print(f"  L={seq_len} causal, one process, {name:8s}: {med:7.1f} ms (p10 {p10:6.1f})")
    return res


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--link-gbps", type=float, default=0.05,
                   help="bandwidth of the simulated slow link (0: shared memory only)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    lengths = (256, 512) if args.quick else (512, 1024, 2048)
    rounds = args.rounds or (3 if args.quick else 10)
    time_len = 1024 if args.quick else 2048
    print(f"CPU: {cpu_name()}, batch {B}, {H} heads, head dim {D},"
          f" float32")
    print("per-rank peak memory of one attention layer, forward + backward (causal):")
    memory = memory_table(lengths, causal=True)
    print("ring attention step time (forward + backward), overlap on/off:")
    links = (None, args.link_gbps) if args.link_gbps else (None,)
    timing = timing_table(time_len, (2, 4), rounds, links)
    print("single-process reference:")
    reference = reference_table(time_len, rounds)
    result = {"memory": memory, "timing": timing, "reference": reference,
              "shape": {"batch": B, "heads": H, "head_dim": D, "dtype": "float32"}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
