"""A 4-stage pipeline-parallel MLP over ``remote_send``/``remote_recv`` with micro-batches
(GPipe-style: every micro-batch goes forward, then one backward drains them in mirrored order).

Rank r owns layer r of 784-256-128-64-10 and trains it with SGD on MNIST; the last rank computes the
loss. ``--check`` also runs the same training in one process and reports the largest difference of
the final weights (it should be at rounding level).

    python examples/pipeline_mlp.py --steps 30 --micro-batches 4 --check
"""

import argparse

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.data.dataset.vision import load_mnist

SIZES = [784, 256, 128, 64, 10]
BATCH, LR = 64, 0.2


def make_layers():
    mg.random.seed(1)
    return [M.Linear(a, b) for a, b in zip(SIZES[:-1], SIZES[1:])]


def batches(steps: int):
    data = load_mnist(train=True, quiet=True)
    x = data.images.reshape(len(data), -1).astype(np.float32) / 255.0
    for step in range(steps):
        sl = slice(step * BATCH % len(data), step * BATCH % len(data) + BATCH)
        yield x[sl], data.labels[sl]


def stage(rank: int, steps: int, n_micro: int):
    n = dist.get_world_size()
    layer = make_layers()[rank]
    gm = ad.GradManager().attach(layer.parameters())
    opt = optim.SGD(layer.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        with gm:
            total = None
            for xm, ym in zip(np.split(x, n_micro), np.split(y, n_micro)):
                h = mg.tensor(xm) if rank == 0 else dist.functional.remote_recv(src_rank=rank - 1)
                h = layer(h)
                if rank < n - 1:
                    dist.functional.remote_send(F.relu(h), dest_rank=rank + 1)
                else:
                    mb_loss = F.nn.cross_entropy(h, mg.tensor(ym), reduction="sum") / len(y)
                    total = mb_loss if total is None else total + mb_loss
            gm.backward(total)  # None on inner stages: the sends pull their gradients back
        opt.step().clear_grad()
        if total is not None:
            losses.append(total.item())
    return {"losses": losses, "weights": [p.numpy() for p in layer.parameters()]}


def run_pipeline(steps: int, n_micro: int):
    return dist.launcher(
        lambda: stage(dist.get_rank(), steps, n_micro), n_gpus=4, device_type="cpu"
    )()


def run_single(steps: int):
    layers = make_layers()
    params = [p for layer in layers for p in layer.parameters()]
    gm = ad.GradManager().attach(params)
    opt = optim.SGD(params, lr=LR)
    losses = []
    for x, y in batches(steps):
        with gm:
            h = mg.tensor(x)
            for i, layer in enumerate(layers):
                h = layer(h) if i == len(layers) - 1 else F.relu(layer(h))
            loss = F.nn.cross_entropy(h, mg.tensor(y))
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    return {
        "losses": losses,
        "weights": [[p.numpy() for p in layer.parameters()] for layer in layers],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--check", action="store_true", help="compare with a single-process run")
    args = p.parse_args(argv)
    stages = run_pipeline(args.steps, args.micro_batches)
    losses = stages[-1]["losses"]
    print(f"pipeline loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
    result = {"losses": losses, "weights": [s["weights"] for s in stages]}
    if args.check:
        ref = run_single(args.steps)
        diff = max(
            float(np.abs(a - b).max())
            for s, r in zip(result["weights"], ref["weights"])
            for a, b in zip(s, r)
        )
        print(f"max |pipeline - single process| over all weights: {diff:.3g}")
        result["reference"], result["max_diff"] = ref, diff
    return result


if __name__ == "__main__":
    main()
