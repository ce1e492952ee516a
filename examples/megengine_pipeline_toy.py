"""MegEngine's two-rank pipeline toy on minigrad: rank 0 runs the first layer and ``remote_send``s
its features; rank 1 ``remote_recv``s them (shape and dtype discovered), runs the second layer
and the loss. Rank 0 calls ``gm.backward()`` with no loss: the recorded send pulls its gradient
back. ``--single`` computes the same thing in one process; the gradients must be identical.

    python examples/megengine_pipeline_toy.py
"""

import argparse

import numpy as np

import minigrad as mge
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim

IN, HIDDEN, CLASSES, BATCH = 16, 32, 4, 8


TEACHER = np.random.default_rng(1234).standard_normal((IN, CLASSES))


def make_data(step: int):
    """A learnable toy task: the label is the argmax of a fixed random linear map of x."""
    x = np.random.default_rng(step).standard_normal((BATCH, IN)).astype("float32")
    return x, (x @ TEACHER).argmax(axis=1).astype("int32")


def make_layers():
    mge.random.seed(0)
    return M.Linear(IN, HIDDEN), M.Linear(HIDDEN, CLASSES)


def pipeline(steps: int):
    rank = dist.get_rank()
    layer1, layer2 = make_layers()
    layer = layer1 if rank == 0 else layer2
    gm = ad.GradManager().attach(layer.parameters())
    opt = optim.SGD(layer.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        x, y = make_data(step)
        with gm:
            if rank == 0:
                feat = F.relu(layer1(mge.tensor(x)))
                dist.functional.remote_send(feat, dest_rank=1)
                gm.backward()
            else:
                feat = dist.functional.remote_recv(src_rank=0)
                loss = F.nn.cross_entropy(layer2(feat), mge.tensor(y))
                gm.backward(loss)
                losses.append(loss.item())
        grads.append([p.grad.numpy() for p in layer.parameters()])
        opt.step().clear_grad()
    return {"losses": losses, "grads": grads}


def single(steps: int):
    layer1, layer2 = make_layers()
    params = list(layer1.parameters()) + list(layer2.parameters())
    gm = ad.GradManager().attach(params)
    opt = optim.SGD(params, lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        x, y = make_data(step)
        with gm:
            loss = F.nn.cross_entropy(layer2(F.relu(layer1(mge.tensor(x)))), mge.tensor(y))
            gm.backward(loss)
        losses.append(loss.item())
        grads.append([p.grad.numpy() for p in params])
        opt.step().clear_grad()
    return {"losses": losses, "grads": grads}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--single", action="store_true")
    args = p.parse_args(argv)
    if args.single:
        out = single(args.steps)
    else:
        stage0, stage1 = dist.launcher(pipeline, n_gpus=2, device_type="cpu")(args.steps)
        out = {
            "losses": stage1["losses"],
            "grads": [g0 + g1 for g0, g1 in zip(stage0["grads"], stage1["grads"])],
        }
    print(f"loss: first {out['losses'][0]:.4f}, last {out['losses'][-1]:.4f}")
    return out


if __name__ == "__main__":
    main()
