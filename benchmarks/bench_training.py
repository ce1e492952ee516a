"""Full training steps in minigrad vs PyTorch (CPU), same models, same weights, same thread count.

Usage: python benchmarks/bench_training.py [--threads 2] [--steps 90] [--warmup 5] [--only mlp]

A step is forward, backward (``GradManager`` / ``loss.backward()``) and an SGD update with momentum
(``minigrad.optimizer.SGD`` / ``torch.optim.SGD``). Both frameworks are timed in the same process,
alternating model by model; the median step time over ``--steps`` steps after ``--warmup`` is
reported with the ratio minigrad/PyTorch. Models are built from functional ops directly:

* MLP 784-512-512-10, batch 128 (target ratio <= 1.0)
* LeNet-style CNN (conv 1->6 5x5, relu, maxpool 2, conv 6->16 5x5, relu, maxpool 2,
  fc 256-120-84-10), batch 64 on 28x28 (target <= 1.5)
* one pre-norm Transformer block (d_model 128, 4 heads, seq 64, batch 16, MLP 512, GELU, causal
  attention, two layer norms) (target <= 1.3)
* per-op overhead: one recorded elementwise add on a 4-element tensor (target <= 15 us), and the
  same op recorded and then back-propagated (a chain of 200 adds, per op).

By default everything runs twice in the one process: with glibc's allocator defaults, then with
``minigrad.backend.allocator.tune_malloc()``, which ``import minigrad`` applies unless
``MINIGRAD_MALLOC=default`` (page faults of fresh NumPy temporaries otherwise dominate the CNN).
Results go to stdout and ``benchmarks/results/training.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="BLAS/intra-op threads for both frameworks (default: all cores)")
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None,
                        help="subset of: mlp lenet transformer overhead")
    parser.add_argument("--malloc", choices=["default", "tuned", "both"], default="both",
                        help="glibc allocator setting(s) to measure under (see tune_malloc)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "training.json"))
    return parser.parse_args()


ARGS = _parse_args()
# BLAS reads its thread count when NumPy loads, so it is pinned before the imports below.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)
os.environ["MINIGRAD_MALLOC"] = "default"  # importing minigrad must not tune: main() decides

import numpy as np  # noqa: E402
import torch  # noqa: E402

import minigrad as mg  # noqa: E402
import minigrad.functional as F  # noqa: E402
from minigrad.backend.allocator import tune_malloc  # noqa: E402
from minigrad.optimizer import SGD  # noqa: E402

tF = torch.nn.functional
LR, MOMENTUM = 0.01, 0.9


# ---------------------------------------------------------------------------------------------
# shared parameter initialisation (both frameworks start from the same float32 arrays)


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
    """One model in both frameworks: params, a batch, and a ``step()`` for each."""

    def __init__(self, shapes: dict, x: np.ndarray, y: np.ndarray, fwd_mg, fwd_torch, loss: str):
        arrays = _init(np.random.default_rng(0), shapes)
        self.mg_params = {k: mg.Parameter(v) for k, v in arrays.items()}
        self.t_params = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
        self.mg_x, self.t_x = mg.tensor(x), torch.tensor(x)
        int_y = y.dtype.kind in "iu"
        self.mg_y = mg.tensor(y, dtype="int32" if int_y else None)
        self.t_y = torch.tensor(y.astype(np.int64) if int_y else y)
        self.fwd_mg, self.fwd_torch, self.loss = fwd_mg, fwd_torch, loss
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


# ---------------------------------------------------------------------------------------------
# the models, written twice with the same functional vocabulary


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

    return Pair(shapes, x, y, make(F), make(tF), "ce")


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

    return Pair(shapes, x, y, make(F), make(tF), "ce")


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

    ln_mg = lambda x, g, b: F.layer_norm(x, d, True, g, b)  # noqa: E731
    ln_t = lambda x, g, b: tF.layer_norm(x, (d,), g, b)  # noqa: E731
    return Pair(shapes, x, y, make(F, attention_mg, ln_mg), make(tF, attention_torch, ln_t), "mse")


# ---------------------------------------------------------------------------------------------
# timing


def timed_steps(fn, steps: int) -> list:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_model(pair: Pair, steps: int, warmup: int, rounds: int = 9) -> dict:
    """Median step time of each framework; the steps are taken in ``rounds`` alternating blocks
    (each after ``_settle``) so that a change of machine load hits both frameworks alike."""
    l_mg, l_t = pair.step_mg(), pair.step_torch()  # same weights: the first losses agree
    if not np.isclose(l_mg, l_t, rtol=1e-3):
        raise RuntimeError(f"first-step losses differ: minigrad {l_mg} vs torch {l_t}")
    for _ in range(warmup):
        pair.step_mg()
        pair.step_torch()
    t_mg, t_t = [], []
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        _settle(pair.step_mg)
        t_mg += timed_steps(pair.step_mg, per_round)
        _settle(pair.step_torch)
        t_t += timed_steps(pair.step_torch, per_round)
    return _summary(t_mg, t_t, l_mg)


def _settle(step) -> None:
    """Let the other framework's idle worker threads stop spinning (OpenBLAS spins for ~0.1 s
    after a call, OpenMP briefly), then take one untimed step."""
    time.sleep(0.3)
    step()


def _summary(t_mg, t_t, l_mg) -> dict:
    mg_ms, t_ms = statistics.median(t_mg) * 1e3, statistics.median(t_t) * 1e3
    return {"minigrad_ms": mg_ms, "torch_ms": t_ms, "ratio": mg_ms / t_ms, "first_loss": l_mg}


def bench_overhead(n: int = 20000) -> dict:
    """Per-op cost of a recorded add on a 4-element tensor: forward only, and forward+backward."""
    a = mg.Parameter(np.ones(4, np.float32))
    b = mg.tensor(np.ones(4, np.float32))
    gm = mg.GradManager().attach(a)
    ta = torch.ones(4, requires_grad=True)
    tb = torch.ones(4)

    def per_op_mg():
        with gm:
            t0 = time.perf_counter()
            for _ in range(n):
                a + b
            return (time.perf_counter() - t0) / n * 1e6

    def per_op_torch():
        t0 = time.perf_counter()
        for _ in range(n):
            ta + tb
        return (time.perf_counter() - t0) / n * 1e6

    chain = 200

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
    for key, fn, reps in (("record", (per_op_mg, per_op_torch), 5),
                          ("record+backward", (chain_mg, chain_torch), 50)):
        fn[0](), fn[1]()
        mg_us = statistics.median(fn[0]() for _ in range(reps))
        t_us = statistics.median(fn[1]() for _ in range(reps))
        out[key] = {"minigrad_us": mg_us, "torch_us": t_us, "ratio": mg_us / t_us}
    return out


TARGETS = {"mlp": 1.0, "lenet": 1.5, "transformer": 1.3}
NAMES = {"mlp": "MLP 784-512-512-10, b128", "lenet": "LeNet CNN, b64 28x28",
         "transformer": "Transformer block d128 h4 s64 b16"}


def run_models(which: list, label: str) -> dict:
    out = {}
    print(f"\n[{label}]")
    header = f"{'model':<36} {'minigrad ms':>12} {'torch ms':>10} {'ratio':>7} {'target':>7}"
    print(header)
    print("-" * len(header))
    builders = {"mlp": mlp_pair, "lenet": lenet_pair, "transformer": transformer_pair}
    for key in ("mlp", "lenet", "transformer"):
        if key not in which:
            continue
        r = bench_model(builders[key](), ARGS.steps, ARGS.warmup)
        r["target_ratio"] = TARGETS[key]
        r["meets_target"] = r["ratio"] <= TARGETS[key]
        out[key] = r
        flag = "ok" if r["meets_target"] else "MISS"
        print(f"{NAMES[key]:<36} {r['minigrad_ms']:>12.2f} {r['torch_ms']:>10.2f} "
              f"{r['ratio']:>6.2f}x {TARGETS[key]:>5.1f}x  {flag}")
    if "overhead" in which:
        ov = bench_overhead()
        out["overhead"] = ov
        for key, r in ov.items():
            flag = ("ok" if r["minigrad_us"] <= 15 else "MISS") if key == "record" else ""
            target = "15us" if key == "record" else ""
            print(f"{'per-op ' + key + ' (us/op)':<36} {r['minigrad_us']:>12.2f} "
                  f"{r['torch_us']:>10.2f} {r['ratio']:>6.2f}x {target:>7}  {flag}")
    return out


def main() -> None:
    torch.set_num_threads(ARGS.threads)
    torch.manual_seed(0)
    which = ARGS.only or ["mlp", "lenet", "transformer", "overhead"]
    results: dict = {
        "meta": {
            "threads": ARGS.threads, "steps": ARGS.steps, "warmup": ARGS.warmup,
            "python": sys.version.split()[0], "numpy": np.__version__,
            "torch": torch.__version__, "machine": platform.machine(),
            "processor": platform.processor(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    }
    print(f"threads={ARGS.threads}  numpy {np.__version__}  torch {torch.__version__}  "
          f"median of {ARGS.steps} steps after {ARGS.warmup} warm-up")
    if ARGS.malloc in ("default", "both"):
        results["default_malloc"] = run_models(which, "glibc malloc defaults")
    if ARGS.malloc in ("tuned", "both"):
        results["tuned_malloc_applied"] = tune_malloc()
        results["tuned_malloc"] = run_models(which, "malloc tuned: no mmap < 32 MB, no trim")
    os.makedirs(os.path.dirname(ARGS.out), exist_ok=True)
    tmp = ARGS.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(results, fh, indent=2)
    os.replace(tmp, ARGS.out)
    print(f"wrote {ARGS.out}")


if __name__ == "__main__":
    main()
