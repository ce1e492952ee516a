"""Training steps and NCCL all-reduce on one GPU: minigrad (CuPy) vs PyTorch CUDA in one process.

Usage: python benchmarks/bench_gpu.py [--rounds 15] [--steps 20] [--only mlp lenet transformer
allreduce] [--out benchmarks/results/gpu.json]

Training step (forward, backward, SGD with momentum; same float32 weights and batch in both
frameworks): MLP 784-512-512-10 batch 128, a LeNet-style CNN batch 64 on 28x28, and one pre-norm
Transformer block (d_model 128, 4 heads, seq 64, batch 16, MLP 512, GELU, causal attention; target:
minigrad <= 1.5x PyTorch). Each round times ``--steps`` steps of one framework, then of the other
(the first to go alternates), with the device synchronised before and after the block and nothing
read back in between - a step must not wait for the GPU, so the block's time over its steps is the
step time. The table gives the median and the 10th percentile over the rounds.

All-reduce: float32 arrays from 4 KiB to 256 MiB at world size 1 over NCCL, minigrad's
``comm.all_reduce`` against ``torch.distributed.all_reduce``; each round times a block of calls of
each (device synchronised around it). Reported: time per call and the algorithm bandwidth (bytes /
time). The bus bandwidth of nccl-tests (algorithm bandwidth times 2(n-1)/n) is 0 at n = 1, so it is
not shown; at world size 1 NCCL copies the buffer in place, so the numbers measure per-call cost and
memory bandwidth, not a network.

TF32 is off on both sides, so that both frameworks do the same float32 arithmetic: PyTorch's
``allow_tf32`` flags (matmul and cuDNN) are set to False, and ``CUPY_TF32`` is removed from the
environment before CuPy is imported (CuPy uses TF32 only when it is set to 1). The output says so.

Without a CUDA GPU (or without CuPy or a CUDA build of PyTorch) it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import numpy as np
from machine import cpu_name

import minigrad as mg
import minigrad.backend.device
import minigrad.distributed as dist
import minigrad.optimizer
from minigrad.distributed import comm

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu.json")
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
LR, MOMENTUM = 0.01, 0.9
TORCH_DEVICE, TORCH_BACKEND = "cuda:0", "nccl"  # (what PyTorch is measured on)


def _parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20, help="training steps per timed block")
    p.add_argument("--only", nargs="*", default=None,
                   help="subset of: mlp lenet transformer allreduce")
    p.add_argument("--out", default=RESULTS)
    return p.parse_args(argv)


def _tf32_off_before_cupy() -> str | None:
    """Remove ``CUPY_TF32`` from the environment (CuPy reads it when imported); returns the value
    it had, to report it. Fails when CuPy was already imported with TF32 enabled."""
    value = os.environ.pop("CUPY_TF32", None)
    if value not in (None, "0") and "cupy" in sys.modules:
        raise RuntimeError("bench_gpu: CuPy was imported with CUPY_TF32 set; unset it and rerun")
    return value


def _tf32_off_in_torch(torch) -> str:
    """Full float32 matmuls and convolutions in PyTorch (no TF32); returns the line to print."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return ("TF32: off on both sides (PyTorch: backends.cuda.matmul.allow_tf32="
            f"{torch.backends.cuda.matmul.allow_tf32}, backends.cudnn.allow_tf32="
            f"{torch.backends.cudnn.allow_tf32}; CuPy: CUPY_TF32 unset)")


def _gpu_or_exit():
    """(cupy, torch) when both can use a GPU here; else print why not and exit with status 2."""
    reasons = []
    if not mg.is_cuda_available():
        reasons.append(f"minigrad sees no GPU ({mg.backend.device.probe_gpus().reason})")
    try:
        import torch  # noqa: PLC0415  (the comparison needs it, the package does not)
    except ImportError as exc:
        torch = None
        reasons.append(f"PyTorch is not installed ({exc})")
    if torch is not None and not torch.cuda.is_available():
        reasons.append(f"PyTorch {torch.__version__} cannot use CUDA (a CPU-only build, or no "
                       "GPU)")
    if reasons:
        print("bench_gpu: nothing measured: " + "; ".join(reasons), file=sys.stderr)
        sys.exit(2)
    return mg.backend.cupy_or_none(), torch


# ---------------------------------------------------------------------------------------------
# the models, written once over a functional vocabulary (minigrad.functional or torch's)


def _init(shapes: dict) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("_g"):
            out[name] = np.ones(shape, np.float32)
        elif len(shape) == 1:
            out[name] = np.zeros(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def _mlp(f):
    shapes = {"w1": (512, 784), "b1": (512,), "w2": (512, 512), "b2": (512,), "w3": (10, 512),
              "b3": (10,)}

    def fwd(p, x):
        h = f.relu(f.linear(x, p["w1"], p["b1"]))
        return f.linear(f.relu(f.linear(h, p["w2"], p["b2"])), p["w3"], p["b3"])

    return shapes, fwd, (128, 784), "ce"


def _lenet(f):
    shapes = {"c1": (6, 1, 5, 5), "cb1": (6,), "c2": (16, 6, 5, 5), "cb2": (16,),
              "w1": (120, 256), "b1": (120,), "w2": (84, 120), "b2": (84,), "w3": (10, 84),
              "b3": (10,)}

    def fwd(p, x):
        h = f.max_pool2d(f.relu(f.conv2d(x, p["c1"], p["cb1"])), 2)
        h = f.max_pool2d(f.relu(f.conv2d(h, p["c2"], p["cb2"])), 2)
        h = f.relu(f.linear(h.reshape(h.shape[0], -1), p["w1"], p["b1"]))
        return f.linear(f.relu(f.linear(h, p["w2"], p["b2"])), p["w3"], p["b3"])

    return shapes, fwd, (64, 1, 28, 28), "ce"


D, HEADS, SEQ, BATCH, HIDDEN = 128, 4, 64, 16, 512


def _transformer(f, attention, layer_norm):
    shapes = {"ln1_g": (D,), "ln1_b": (D,), "w_qkv": (3 * D, D), "b_qkv": (3 * D,), "w_o": (D, D),
              "b_o": (D,), "ln2_g": (D,), "ln2_b": (D,), "w_fc1": (HIDDEN, D),
              "b_fc1": (HIDDEN,), "w_fc2": (D, HIDDEN), "b_fc2": (D,)}

    def fwd(p, x):
        x = x + attention(p, layer_norm(x, p["ln1_g"], p["ln1_b"]))
        h = f.gelu(f.linear(layer_norm(x, p["ln2_g"], p["ln2_b"]), p["w_fc1"], p["b_fc1"]))
        return x + f.linear(h, p["w_fc2"], p["b_fc2"])

    return shapes, fwd, (BATCH, SEQ, D), "mse"


def _models(torch):
    F, tF = mg.functional, torch.nn.functional

    def attention_mg(p, h):
        return F.multi_head_attention(h, h, h, HEADS, p["w_qkv"], p["b_qkv"], p["w_o"], p["b_o"],
                                      is_causal=True)

    def attention_torch(p, h):
        qkv = tF.linear(h, p["w_qkv"], p["b_qkv"]).reshape(BATCH, SEQ, 3, HEADS, D // HEADS)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        o = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return tF.linear(o.transpose(1, 2).reshape(BATCH, SEQ, D), p["w_o"], p["b_o"])

    return {
        "mlp": ("MLP 784-512-512-10, b128", _mlp(F), _mlp(tF)),
        "lenet": ("LeNet CNN, b64 28x28", _lenet(F), _lenet(tF)),
        "transformer": ("Transformer block d128 h4 s64 b16",
                        _transformer(F, attention_mg,
                                     lambda x, g, b: F.layer_norm(x, D, True, g, b)),
                        _transformer(tF, attention_torch,
                                     lambda x, g, b: tF.layer_norm(x, (D,), g, b))),
    }


class _Steps:
    """One model in both frameworks on GPU 0: ``step_mg()``/``step_torch()`` return the loss
    tensor without reading it (reading would wait for the GPU)."""

    def __init__(self, torch, spec_mg, spec_torch):
        shapes, self.fwd_mg, x_shape, self.loss = spec_mg
        _, self.fwd_torch, _, _ = spec_torch
        arrays = _init(shapes)
        rng = np.random.default_rng(1)
        x = rng.standard_normal(x_shape).astype(np.float32)
        y = (rng.integers(0, 10, x_shape[0]).astype(np.int32) if self.loss == "ce"
             else rng.standard_normal(x_shape).astype(np.float32))
        dev = TORCH_DEVICE
        self.torch = torch
        self.mg_p = {k: mg.Parameter(v, device="gpu0") for k, v in arrays.items()}
        self.t_p = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in arrays.items()}
        self.mg_x, self.mg_y = mg.tensor(x, device="gpu0"), mg.tensor(y, device="gpu0")
        self.t_x = torch.tensor(x, device=dev)
        self.t_y = torch.tensor(y.astype(np.int64) if self.loss == "ce" else y, device=dev)
        self.gm = mg.GradManager().attach(list(self.mg_p.values()))
        self.mg_opt = mg.optimizer.SGD(list(self.mg_p.values()), lr=LR, momentum=MOMENTUM)
        self.t_opt = torch.optim.SGD(list(self.t_p.values()), lr=LR, momentum=MOMENTUM)

    def step_mg(self):
        F = mg.functional
        with self.gm:
            out = self.fwd_mg(self.mg_p, self.mg_x)
            loss = (F.nn.cross_entropy(out, self.mg_y) if self.loss == "ce"
                    else F.square_loss(out, self.mg_y))
            self.gm.backward(loss)
        self.mg_opt.step().clear_grad()
        return loss

    def step_torch(self):
        tF = self.torch.nn.functional
        out = self.fwd_torch(self.t_p, self.t_x)
        loss = tF.cross_entropy(out, self.t_y) if self.loss == "ce" else tF.mse_loss(out, self.t_y)
        loss.backward()
        self.t_opt.step()
        self.t_opt.zero_grad(set_to_none=True)
        return loss


def _timed_block(fn, calls: int, sync) -> float:
    """Seconds per call of ``calls`` calls, the device synchronised before and after."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def _interleaved(fns: dict, calls: int, rounds: int, sync) -> dict:
    """Per-call times of each function over ``rounds`` rounds (the order rotates every round):
    ``{name: (median, p10)}`` in seconds."""
    names = list(fns)
    times: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            times[n].append(_timed_block(fns[n], calls, sync))
    return {n: (statistics.median(t), float(np.percentile(t, 10))) for n, t in times.items()}


def bench_models(which, torch, cp, rounds: int, steps: int) -> dict:
    def sync():
        cp.cuda.Device(0).synchronize()
        torch.cuda.synchronize()

    out = {}
    print(f"{'model':<36} {'minigrad ms':>16} {'torch ms':>16} {'ratio':>6}")
    for key, (name, spec_mg, spec_t) in _models(torch).items():
        if key not in which:
            continue
        s = _Steps(torch, spec_mg, spec_t)
        first_mg, first_t = s.step_mg().item(), s.step_torch().item()
        if not np.isclose(first_mg, first_t, rtol=1e-3):
            raise RuntimeError(f"{key}: first losses differ: minigrad {first_mg}, torch {first_t}")
        for _ in range(3):  # warm-up: CuPy compiles its kernels, cuBLAS picks algorithms
            s.step_mg(), s.step_torch()
        t = _interleaved({"minigrad": s.step_mg, "torch": s.step_torch}, steps, rounds, sync)
        (m_med, m_p10), (t_med, t_p10) = t["minigrad"], t["torch"]
        out[key] = {"name": name, "minigrad_ms": m_med * 1e3, "minigrad_p10_ms": m_p10 * 1e3,
                    "torch_ms": t_med * 1e3, "torch_p10_ms": t_p10 * 1e3,
                    "ratio": m_med / t_med, "first_loss": first_mg}
        print(f"{name:<36} {m_med * 1e3:8.3f} (p10 {m_p10 * 1e3:6.3f}) "
              f"{t_med * 1e3:7.3f} (p10 {t_p10 * 1e3:6.3f}) {m_med / t_med:6.2f}", flush=True)
    return out


def bench_allreduce(torch, cp, rounds: int) -> dict:
    import torch.distributed as tdist  # noqa: PLC0415  (a CUDA build of torch)

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    dist.init_process_group("127.0.0.1", free_port(), 1, 0, device=0, backend="nccl")
    tdist.init_process_group(TORCH_BACKEND, init_method=f"tcp://127.0.0.1:{free_port()}",
                             world_size=1, rank=0)

    def sync():
        cp.cuda.Device(0).synchronize()
        torch.cuda.synchronize()

    out = {}
    print(f"\n{'all-reduce float32':<20} {'minigrad us':>12} {'GB/s':>7} {'torch us':>10} "
          f"{'GB/s':>7}")
    try:
        for nbytes in SIZES:
            x = cp.ones(nbytes // 4, np.float32)
            tx = torch.ones(nbytes // 4, dtype=torch.float32, device=TORCH_DEVICE)
            calls = 100 if nbytes <= (1 << 20) else 10
            comm.all_reduce(x), tdist.all_reduce(tx)  # communicators are made here
            t = _interleaved({"minigrad": lambda x=x: comm.all_reduce(x),
                              "torch": lambda tx=tx: tdist.all_reduce(tx)}, calls, rounds, sync)
            row = {}
            for name, (med, p10) in t.items():
                row[name] = {"us": med * 1e6, "p10_us": p10 * 1e6, "algbw_GBps": nbytes / med / 1e9}
            out[str(nbytes)] = row
            m, tt = row["minigrad"], row["torch"]
            print(f"{nbytes:>20,} {m['us']:12.1f} {m['algbw_GBps']:7.2f} {tt['us']:10.1f} "
                  f"{tt['algbw_GBps']:7.2f}", flush=True)
    finally:
        tdist.destroy_process_group()
        dist.destroy_process_group()
    return out


def main(argv=None) -> None:
    args = _parse_args(argv)
    cupy_tf32 = _tf32_off_before_cupy()
    cp, torch = _gpu_or_exit()
    tf32_line = _tf32_off_in_torch(torch)
    which = args.only or ["mlp", "lenet", "transformer", "allreduce"]
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}; CuPy {cp.__version__}, PyTorch {torch.__version__}, CPU: "
          f"{cpu_name()}")
    print(tf32_line + (f" (it was {cupy_tf32!r})" if cupy_tf32 is not None else ""))
    results = {"gpu": props.name, "cpu": cpu_name(), "cupy": cp.__version__,
               "torch": torch.__version__, "tf32": False, "rounds": args.rounds,
               "steps_per_round": args.steps}
    results["training"] = bench_models(which, torch, cp, args.rounds, args.steps)
    if "allreduce" in which:
        results["allreduce_world_size_1"] = bench_allreduce(torch, cp, args.rounds)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
