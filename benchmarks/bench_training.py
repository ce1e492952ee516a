"""Training steps in minigrad vs PyTorch (CPU): same models, weights and threads, in one process.

Usage: python benchmarks/bench_training.py [--threads N] [--rounds 16] [--steps 12] [--only mlp ...]

A step is forward, backward (``GradManager`` / ``loss.backward()``) and an SGD update with momentum.
Models, written twice with the same functional vocabulary:

* MLP 784-512-512-10, batch 128;
* LeNet-style CNN (conv 1->6 5x5, relu, maxpool 2, conv 6->16 5x5, relu, maxpool 2,
  fc 256-120-84-10), batch 64 on 28x28;
* one pre-norm Transformer block (d_model 128, 4 heads, seq 64, batch 16, MLP 512, exact GELU,
  causal attention, two layer norms);
* the recorded tiny op: one recorded add of two 4-element tensors (us per op), and the same op
  recorded and back-propagated (a chain of 200 adds, per op).

How it is timed, so that machine noise hits both frameworks alike: the two frameworks alternate in
``--rounds`` rounds (who goes first alternates too), each round times ``--steps`` steps of each
after a pause that lets the other framework's idle worker threads stop spinning, and the ratio
minigrad/PyTorch is taken *per round* (median step of each). Reported: the median and p10 of those
per-round ratios, with each framework's median step time.

The GEMM floor: the matrix products a model's step issues (the same shapes and layouts), timed
alone with NumPy (minigrad's BLAS) and with PyTorch, in the same alternating rounds. A model cannot
get closer to PyTorch than its floor ratio without a faster BLAS; the table shows both.

The CPU (model and SIMD flags), thread counts and the machine's load average go with the results,
to stdout and ``benchmarks/results/training.json``. ``benchmarks/report.py`` renders them.
"""

from __future__ import annotations  # noqa: I001  (minigrad is imported before NumPy on purpose)

import argparse
import json
import os
import statistics
import sys
import time

import minigrad as mg  # first: its BLAS waiting policy applies before NumPy loads OpenBLAS

import numpy as np
import torch

import minigrad.functional as F
from minigrad.backend import blas
from minigrad.optimizer import SGD

import gemms
from machine import blas_info, blas_name, cpu_info

tF = torch.nn.functional
LR, MOMENTUM = 0.01, 0.9
TARGETS = {"mlp": "floor + 5%", "lenet": 1.10, "transformer": "floor + 10%",
           "record": "2.5 us"}  # issue 29's: a float is a ratio, "floor + N%" the GEMM floor's
NAMES = {"mlp": "MLP 784-512-512-10, batch 128", "lenet": "LeNet CNN, batch 64, 28x28",
         "transformer": "Transformer block d128 h4 s64 b16"}


def _parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads for both frameworks (default: every available core)")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--steps", type=int, default=12, help="timed steps per framework per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--only", nargs="*", default=None,
                   help="subset of: mlp lenet transformer overhead")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results", "training.json"))
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# the machine


# ---------------------------------------------------------------------------------------------
# the models


def _init(rng: np.random.Generator, shapes: dict) -> dict:
    out = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        if name.endswith("_g"):  # layer-norm gains
            out[name] = np.ones(shape, np.float32)
        elif len(shape) == 1:
            out[name] = np.zeros(shape, np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


class Pair:
    """One model in both frameworks (same float32 weights and batch) with a ``step_*`` each, and
    the list of matrix products its step issues (``products``, from ``gemms.py``)."""

    def __init__(self, shapes, x, y, fwd_mg, fwd_torch, loss, products):
        arrays = _init(np.random.default_rng(0), shapes)
        self.mg_params = {k: mg.Parameter(v) for k, v in arrays.items()}
        self.t_params = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
        self.mg_x, self.t_x = mg.tensor(x), torch.tensor(x)
        int_y = y.dtype.kind in "iu"
        self.mg_y = mg.tensor(y, dtype="int32" if int_y else None)
        self.t_y = torch.tensor(y.astype(np.int64) if int_y else y)
        self.fwd_mg, self.fwd_torch, self.loss = fwd_mg, fwd_torch, loss
        self.products = products
        self.gm = mg.GradManager().attach(list(self.mg_params.values()))
        self.mg_opt = SGD(list(self.mg_params.values()), lr=LR, momentum=MOMENTUM)
        self.t_opt = torch.optim.SGD(list(self.t_params.values()), lr=LR, momentum=MOMENTUM)

    def step_mg(self) -> float:
        with self.gm:
            out = self.fwd_mg(self.mg_params, self.mg_x)
            if self.loss == "ce":
                loss = F.cross_entropy(out, self.mg_y)
            else:
                loss = F.square_loss(out, self.mg_y)
            self.gm.backward(loss)
        self.mg_opt.step()
        self.mg_opt.clear_grad()
        return loss.item()

    def step_torch(self) -> float:
        out = self.fwd_torch(self.t_params, self.t_x)
        loss = tF.cross_entropy(out, self.t_y) if self.loss == "ce" else tF.mse_loss(out, self.t_y)
        loss.backward()
        self.t_opt.step()
        self.t_opt.zero_grad(set_to_none=True)
        return loss.item()


def mlp_pair() -> Pair:
    shapes = {"w1": (512, 784), "b1": (512,), "w2": (512, 512), "b2": (512,),
              "w3": (10, 512), "b3": (10,)}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    y = rng.integers(0, 10, 128).astype(np.int32)

    def make(f):
        def fwd(p, x):
            h = f.relu(f.linear(x, p["w1"], p["b1"]))
            h = f.relu(f.linear(h, p["w2"], p["b2"]))
            return f.linear(h, p["w3"], p["b3"])
        return fwd

    return Pair(shapes, x, y, make(F), make(tF), "ce", gemms.mlp())


def lenet_pair() -> Pair:
    shapes = {"c1": (6, 1, 5, 5), "cb1": (6,), "c2": (16, 6, 5, 5), "cb2": (16,),
              "w1": (120, 256), "b1": (120,), "w2": (84, 120), "b2": (84,),
              "w3": (10, 84), "b3": (10,)}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)

    def make(f):
        def fwd(p, x):
            h = f.max_pool2d(f.relu(f.conv2d(x, p["c1"], p["cb1"])), 2)
            h = f.max_pool2d(f.relu(f.conv2d(h, p["c2"], p["cb2"])), 2)
            h = h.reshape(h.shape[0], -1)
            h = f.relu(f.linear(h, p["w1"], p["b1"]))
            h = f.relu(f.linear(h, p["w2"], p["b2"]))
            return f.linear(h, p["w3"], p["b3"])
        return fwd

    return Pair(shapes, x, y, make(F), make(tF), "ce", gemms.lenet())


def transformer_pair() -> Pair:
    d, heads, seq, batch, hidden = 128, 4, 64, 16, 512
    shapes = {"ln1_g": (d,), "ln1_b": (d,), "w_qkv": (3 * d, d), "b_qkv": (3 * d,),
              "w_o": (d, d), "b_o": (d,), "ln2_g": (d,), "ln2_b": (d,),
              "w_fc1": (hidden, d), "b_fc1": (hidden,), "w_fc2": (d, hidden), "b_fc2": (d,)}
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, seq, d)).astype(np.float32)
    y = rng.standard_normal((batch, seq, d)).astype(np.float32)
    hd = d // heads

    def attention_mg(p, h):
        return F.multi_head_attention(h, h, h, heads, p["w_qkv"], p["b_qkv"], p["w_o"], p["b_o"],
                                      is_causal=True)

    def attention_torch(p, h):
        qkv = tF.linear(h, p["w_qkv"], p["b_qkv"]).reshape(batch, seq, 3, heads, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        o = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return tF.linear(o.transpose(1, 2).reshape(batch, seq, d), p["w_o"], p["b_o"])

    def make(f, attention, ln):
        def fwd(p, x):
            x = x + attention(p, ln(x, p["ln1_g"], p["ln1_b"]))
            h = f.gelu(f.linear(ln(x, p["ln2_g"], p["ln2_b"]), p["w_fc1"], p["b_fc1"]))
            return x + f.linear(h, p["w_fc2"], p["b_fc2"])
        return fwd

    ln_mg = lambda x, g_, b: F.layer_norm(x, d, True, g_, b)  # noqa: E731
    ln_t = lambda x, g_, b: tF.layer_norm(x, (d,), g_, b)  # noqa: E731
    return Pair(shapes, x, y, make(F, attention_mg, ln_mg), make(tF, attention_torch, ln_t), "mse",
                gemms.transformer(d, heads, seq, batch, hidden))


# ---------------------------------------------------------------------------------------------
# timing


def _settle() -> None:
    """Let the other framework's idle worker threads stop spinning before timing."""
    time.sleep(0.2)


def _median_step(fn, steps: int) -> float:
    fn()  # untimed: wakes this framework's threads
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _p(values: list, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def alternate(fn_mg, fn_torch, rounds: int, steps: int) -> dict:
    """Per-round median step of each framework (alternating who goes first) and the summary of
    the per-round ratios."""
    t_mg, t_t = [], []
    for r in range(rounds):
        order = ((fn_mg, t_mg), (fn_torch, t_t)) if r % 2 == 0 else ((fn_torch, t_t), (fn_mg, t_mg))
        for fn, acc in order:
            _settle()
            acc.append(_median_step(fn, steps))
    ratios = [a / b for a, b in zip(t_mg, t_t)]
    return {"minigrad_ms": statistics.median(t_mg) * 1e3, "torch_ms": statistics.median(t_t) * 1e3,
            "ratio_median": statistics.median(ratios), "ratio_p10": _p(ratios, 0.1),
            "ratio_p90": _p(ratios, 0.9), "rounds": rounds, "steps_per_round": steps}


def gemm_floor(products: list, rounds: int, steps: int) -> dict:
    """The model's matrix products alone, minigrad's (``blas.matmul``: NumPy's BLAS, or MKL where
    ``minigrad.backend.blas`` chose it) vs PyTorch's, alternating."""
    cases = [(a, b, torch.from_numpy(a), torch.from_numpy(b), trans_b)
             for a, b, trans_b in gemms.operands(products)]

    def run_numpy():
        for a, b, _, _, tb in cases:
            blas.matmul(a, np.swapaxes(b, -1, -2) if tb else b)

    def run_torch():
        for _, _, ta, tb_, tb in cases:
            torch.matmul(ta, tb_.transpose(-1, -2) if tb else tb_)

    r = alternate(run_numpy, run_torch, rounds, steps)
    return {"numpy_ms": r["minigrad_ms"], "torch_ms": r["torch_ms"],
            "ratio_median": r["ratio_median"], "ratio_p10": r["ratio_p10"],
            "ratio_p90": r["ratio_p90"]}


def bench_model(pair: Pair, args) -> dict:
    l_mg, l_t = pair.step_mg(), pair.step_torch()  # same weights: the first losses agree
    if not np.isclose(l_mg, l_t, rtol=1e-3):
        raise RuntimeError(f"first-step losses differ: minigrad {l_mg} vs torch {l_t}")
    for _ in range(args.warmup):
        pair.step_mg()
        pair.step_torch()
    out = alternate(pair.step_mg, pair.step_torch, args.rounds, args.steps)
    out["first_loss"] = l_mg
    out["gemm_floor"] = gemm_floor(pair.products, args.rounds, args.steps)
    return out


def bench_overhead(rounds: int) -> dict:
    """Per-op cost of a recorded add on a 4-element tensor: forward only, and forward+backward."""
    a = mg.Parameter(np.ones(4, np.float32))
    b = mg.tensor(np.ones(4, np.float32))
    gm = mg.GradManager().attach(a)
    ta, tb = torch.ones(4, requires_grad=True), torch.ones(4)
    n, chain = 5000, 200

    def record_mg():
        with gm:
            t0 = time.perf_counter()
            for _ in range(n):
                a + b
            return (time.perf_counter() - t0) / n * 1e6

    def record_torch():
        t0 = time.perf_counter()
        for _ in range(n):
            ta + tb
        return (time.perf_counter() - t0) / n * 1e6

    def chain_mg():
        t0 = time.perf_counter()
        with gm:
            y = a
            for _ in range(chain):
                y = y + b
            gm.backward(y.sum())
        a.grad = None
        return (time.perf_counter() - t0) / chain * 1e6

    def chain_torch():
        t0 = time.perf_counter()
        y = ta
        for _ in range(chain):
            y = y + tb
        y.sum().backward()
        ta.grad = None
        return (time.perf_counter() - t0) / chain * 1e6

    out = {}
    for key, fn_mg, fn_t in (("record", record_mg, record_torch),
                             ("record+backward", chain_mg, chain_torch)):
        fn_mg(), fn_t()
        us_mg, us_t = [], []
        for _ in range(rounds):
            us_mg.append(min(fn_mg() for _ in range(3)))
            us_t.append(min(fn_t() for _ in range(3)))
        ratios = [m / t for m, t in zip(us_mg, us_t)]
        out[key] = {"minigrad_us": statistics.median(us_mg), "torch_us": statistics.median(us_t),
                    "ratio_median": statistics.median(ratios), "ratio_p10": _p(ratios, 0.1)}
    return out


def main(argv=None) -> None:
    args = _parse_args(argv)
    mg.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    which = args.only or ["mlp", "lenet", "transformer", "overhead"]
    cpu = cpu_info()
    meta = {
        "cpu": cpu, "threads": {"minigrad (BLAS)": mg.get_num_threads(),
                                "torch (intra-op)": torch.get_num_threads()},
        "rounds": args.rounds, "steps_per_round": args.steps,
        "python": sys.version.split()[0], "numpy": np.__version__, "torch": torch.__version__,
        "blas": blas_info(), "products": blas.library(),
        "load_average_start": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"{cpu['model']} ({', '.join(cpu['simd'])}), {cpu['cores']} cores; threads: minigrad "
          f"{mg.get_num_threads()}, torch {torch.get_num_threads()}; numpy {np.__version__}, "
          f"torch {torch.__version__}; NumPy's BLAS {blas_name(meta['blas'])}; minigrad's "
          f"products: {meta['products']}; "
          f"{args.rounds} rounds x {args.steps} steps; "
          f"load average {meta['load_average_start']:.2f}")
    header = (f"{'model':<36} {'minigrad ms':>11} {'torch ms':>9} {'ratio':>6} {'p10':>6} "
              f"{'GEMM floor':>10} {'target':>11}")
    print(header + "\n" + "-" * len(header))
    results: dict = {"meta": meta, "models": {}}
    builders = {"mlp": mlp_pair, "lenet": lenet_pair, "transformer": transformer_pair}
    for key in ("mlp", "lenet", "transformer"):
        if key not in which:
            continue
        r = bench_model(builders[key](), args)
        r["target"] = TARGETS[key]
        results["models"][key] = r
        target = f"<= {r['target']}x" if isinstance(r["target"], float) else r["target"]
        print(f"{NAMES[key]:<36} {r['minigrad_ms']:>11.2f} {r['torch_ms']:>9.2f} "
              f"{r['ratio_median']:>5.2f}x {r['ratio_p10']:>5.2f}x "
              f"{r['gemm_floor']['ratio_median']:>9.2f}x {target:>11}")
    if "overhead" in which:
        results["overhead"] = bench_overhead(args.rounds)
        for key, r in results["overhead"].items():
            print(f"{'tiny op, ' + key + ' (us/op)':<36} {r['minigrad_us']:>11.2f} "
                  f"{r['torch_us']:>9.2f} {r['ratio_median']:>5.2f}x {r['ratio_p10']:>5.2f}x "
                  f"{'':>10} {'<= 2.5us' if key == 'record' else '':>8}")
    meta["load_average_end"] = os.getloadavg()[0]
    print(f"load average at the end: {meta['load_average_end']:.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(results, fh, indent=2)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
