"""Kernel launches per training step of the GPU benchmark's models, counted without a GPU.

Usage: ``python benchmarks/count_gpu_launches.py [mlp lenet transformer]`` (needs g++).

A small model's GPU step is bound by the host's cost per kernel launch, so the launches per step
are the figure to watch between GPU runs. This runs ``bench_gpu.py``'s models (their shapes,
float32, SGD with momentum) on the fake CuPy of ``tests/fakes`` with ``minigrad/backend/kernels/
gpu.py`` itself as the kernels, its CUDA C running on the CPU (``tests/fakes/cuda_on_cpu.py``),
and counts the launches of the third step: CuPy's own kernels by function name, minigrad's by
kernel name. Calls that launch nothing on a GPU are left out and counted apart: views
(``reshape``, ``swapaxes``, ``broadcast_to``), allocations (``empty``) and ``ascontiguousarray``
of an array that already is contiguous. PyTorch's count on a GPU comes from
``benchmarks/profile_gpu_step.py``.
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests"), HERE]

import bench_gpu as models  # noqa: E402
from fakes import cuda_on_cpu, fake_cupy  # noqa: E402

import minigrad as mg  # noqa: E402

F = mg.functional


def _model(name: str):
    if name == "mlp":
        return models._mlp(F)
    if name == "lenet":
        return models._lenet(F)

    def attention(p, h):
        return F.multi_head_attention(h, h, h, models.HEADS, p["w_qkv"], p["b_qkv"], p["w_o"],
                                      p["b_o"], is_causal=True)

    return models._transformer(F, attention,
                               lambda x, g, b: F.layer_norm(x, models.D, True, g, b))


def count(name: str, fake) -> collections.Counter:
    """The launches of one training step of model ``name`` on ``fake`` (after two steps)."""
    shapes, forward, x_shape, loss_kind = _model(name)
    params = {k: mg.Parameter(v, device="gpu0") for k, v in models._init(shapes).items()}
    rng = np.random.default_rng(1)
    x = mg.tensor(rng.standard_normal(x_shape).astype(np.float32), device="gpu0")
    y = (rng.integers(0, 10, x_shape[0]).astype(np.int32) if loss_kind == "ce"
         else rng.standard_normal(x_shape).astype(np.float32))
    y = mg.tensor(y, device="gpu0")
    gm = mg.GradManager().attach(list(params.values()))
    opt = mg.optimizer.SGD(list(params.values()), lr=models.LR, momentum=models.MOMENTUM)
    for step in range(3):
        if step == 2:
            fake.clear()
        with gm:
            out = forward(params, x)
            loss = F.cross_entropy(out, y) if loss_kind == "ce" else F.square_loss(out, y)
            gm.backward(loss)
        opt.step().clear_grad()
    return collections.Counter(e.split(" on ")[0].removeprefix("launch ") for e in fake.events
                               if e.startswith("launch "))


def main(names: list[str]) -> None:
    with fake_cupy.installed(1) as fake, cuda_on_cpu.gpu_kernels_counted(
            fake, cuda_on_cpu.load_gpu_module(fake)):
        for name in names:
            counts = count(name, fake)
            launches = {k: n for k, n in counts.items() if k not in cuda_on_cpu.NO_LAUNCH}
            other = sum(n for k, n in counts.items() if k in cuda_on_cpu.NO_LAUNCH)
            print(f"{name}: {sum(launches.values())} kernel launches per step "
                  f"({other} calls that launch nothing)")
            for k, n in sorted(launches.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"  {n:3d}  {k}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["mlp", "lenet", "transformer"])
