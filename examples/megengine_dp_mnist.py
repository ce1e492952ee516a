"""MegEngine's data-parallel tutorial program, on minigrad: only the imports differ.

A zero-initialised single-layer linear classifier on MNIST, trained on every rank with a
``SequentialSampler`` shard, weights synchronised by ``bcast_list_``, gradients summed by
``make_allreduce_cb("sum")``, the loss averaged with ``all_reduce_sum(loss) / world_size`` and a
``{"net": ..., "acc": ...}`` checkpoint saved and reloaded by rank 0. ``--single`` runs the same
computation in one process with the whole batch, for comparison.

    python examples/megengine_dp_mnist.py [--epochs 2] [--single]

The checkpoint goes to ``runs/megengine_dp_mnist/checkpoint.mgc`` (``--save``), named on screen.
"""

import argparse
import os

import numpy as np

import minigrad as mge
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.data import DataLoader, SequentialSampler
from minigrad.data.dataset.vision import load_mnist

BATCH_PER_RANK = 64
N_RANKS = 2
RUN_DIR = os.path.join("runs", "megengine_dp_mnist")


class Linear(M.Module):
    def __init__(self):  # no super().__init__(): MegEngine's tutorial does this and it must work
        self.w = mge.Parameter(np.zeros((28 * 28, 10), dtype=np.float32))
        self.b = mge.Parameter(np.zeros((10,), dtype=np.float32))

    def forward(self, data):
        return F.matmul(data.reshape(data.shape[0], -1), self.w) + self.b


def run(epochs: int, lr: float, save_path: str, max_steps: int | None = None):
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set = load_mnist(train=True, quiet=rank != 0)
    test_set = load_mnist(train=False, quiet=True)
    batch = BATCH_PER_RANK if world > 1 else BATCH_PER_RANK * N_RANKS  # --single: both ranks' batch
    loader = DataLoader(train_set, SequentialSampler(train_set, batch_size=batch, drop_last=True))

    model = Linear()
    dist.bcast_list_(model.tensors())
    gm = ad.GradManager()
    gm.attach(model.parameters(), callbacks=[dist.make_allreduce_cb("sum")])
    opt = optim.SGD(model.parameters(), lr=lr)

    losses = []
    for epoch in range(epochs):
        for step, (data, label) in enumerate(loader):
            if max_steps is not None and step >= max_steps:
                break
            data = mge.tensor(data / 255.0, dtype="float32")
            label = mge.tensor(label)
            with gm:
                logits = model(data)
                loss = F.nn.cross_entropy(logits, label)
                # "sum" adds the ranks' mean-loss gradients; one process takes the same step by
                # scaling its mean over the whole batch by the number of ranks
                gm.backward(loss if world > 1 else loss * N_RANKS)
            opt.step().clear_grad()
            if world > 1:
                loss = dist.functional.all_reduce_sum(loss) / dist.get_world_size()
            losses.append(loss.item())
            if rank == 0 and step % 50 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")

    images = mge.tensor(test_set.images / 255.0, dtype="float32")
    acc = float((model(images).numpy().argmax(1) == test_set.labels).mean())
    if rank == 0:
        print(f"test accuracy {acc:.4f}")
        mge.save({"net": model.state_dict(), "acc": acc}, save_path)
        ckpt = mge.load(save_path)
        restored = Linear()
        restored.load_state_dict(ckpt["net"])
        assert np.array_equal(restored.w.numpy(), model.w.numpy())
    return {"losses": losses, "acc": acc, "w": model.w.numpy()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--save", default=os.path.join(RUN_DIR, "checkpoint.mgc"))
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--single", action="store_true", help="one process, batch of both ranks")
    args = p.parse_args(argv)
    os.makedirs(os.path.dirname(args.save) or ".", exist_ok=True)
    print(f"writing outputs to {os.path.dirname(args.save) or '.'}{os.sep}", flush=True)
    if args.single:
        return run(args.epochs, args.lr, args.save, args.max_steps)
    return dist.launcher(run, n_gpus=N_RANKS, device_type="cpu")(
        args.epochs, args.lr, args.save, args.max_steps
    )[0]


if __name__ == "__main__":
    main()
