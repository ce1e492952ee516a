"""Train an MNIST classifier data-parallel with ``@dist.launcher`` (the main job).

Two CPU processes by default, one per GPU when GPUs are present. Uses the full MNIST set when it is
cached (or ``--download``), else the 8,000/2,000 split of the real MNIST test set bundled with
minigrad. Everything it writes goes into one folder, ``runs/train_mnist/`` (``--out-dir``), which
it names on screen; a relative ``--save``/``--resume`` path is looked up there.

    python examples/train_mnist.py                       # MLP, 2 CPU ranks
    python examples/train_mnist.py --model cnn --epochs 4 --save cnn.mgc
    python examples/train_mnist.py --resume cnn.mgc --epochs 6   # the model kind is in the file
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import OrderedDict

import numpy as np
from tqdm import tqdm

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.data import DataLoader, RandomSampler, SequentialSampler
from minigrad.data.dataset.vision import load_mnist

MEAN, STD = 0.1307, 0.3081
DEFAULT_EPOCHS = {"mlp": 10, "cnn": 10}
DEFAULT_MODEL = "mlp"
RUN_DIR = os.path.join("runs", "train_mnist")


def build_model(kind: str) -> M.Module:
    if kind == "mlp":
        return M.Sequential(
            OrderedDict(
                [
                    ("flatten", M.Flatten()),
                    ("fc1", M.Linear(784, 256)),
                    ("relu1", M.ReLU()),
                    ("fc2", M.Linear(256, 128)),
                    ("relu2", M.ReLU()),
                    ("out", M.Linear(128, 10)),
                ]
            )
        )
    if kind == "cnn":
        return M.Sequential(
            OrderedDict(
                [
                    ("conv1", M.Conv2d(1, 16, 5)),
                    ("relu1", M.ReLU()),
                    ("pool1", M.MaxPool2d(2)),
                    ("conv2", M.Conv2d(16, 32, 5)),
                    ("relu2", M.ReLU()),
                    ("pool2", M.MaxPool2d(2)),
                    ("flatten", M.Flatten()),
                    ("fc1", M.Linear(512, 128)),
                    ("relu3", M.ReLU()),
                    ("out", M.Linear(128, 10)),
                ]
            )
        )
    raise ValueError(f"unknown model {kind!r}: choose mlp or cnn")


def checkpoint_model_kind(ckpt: dict, path: str) -> str:
    """The model a checkpoint holds: its ``"model"`` entry, or for files written before that
    entry existed, what its parameter names say."""
    kind = ckpt.get("model")
    if kind is None:
        kind = "cnn" if any(k.startswith("conv") for k in ckpt["net"]) else "mlp"
    if kind not in DEFAULT_EPOCHS:
        raise ValueError(f"{path}: unknown model kind {kind!r} (expected mlp or cnn)")
    return kind


def in_run_dir(path: str, out_dir: str) -> str:
    """``path`` itself when absolute or already there, else the same name inside ``out_dir``."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(out_dir, path)


def to_input(images: np.ndarray) -> mg.Tensor:
    """uint8 NHWC batch -> normalised float32 NCHW tensor, on the rank's device: the bytes travel
    (a quarter of the floats; from pinned memory on a GPU) and are converted there."""
    x = (mg.tensor(images).astype("float32") / 255.0 - MEAN) / STD
    return x.transpose(0, 3, 1, 2)


def evaluate(model: M.Module, loader: DataLoader) -> float:
    """Accuracy over the whole test set: each rank scores its shard, counts are summed."""
    model.eval()
    correct = total = 0
    with mg.no_grad():
        for images, labels in loader:
            pred = model(to_input(images)).numpy().argmax(axis=1)
            correct += int((pred == labels).sum())
            total += len(labels)
    model.train()
    counts = mg.tensor(np.array([correct, total], dtype=np.float64))
    if dist.is_distributed() and dist.get_world_size() > 1:
        counts = dist.functional.all_reduce_sum(counts)
    correct, total = counts.numpy()
    return float(correct / max(total, 1))


def train(args) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    mg.random.seed(args.seed)  # same initial weights everywhere; bcast_list_ makes sure of it
    train_set = load_mnist(args.data, train=True, download=args.download, quiet=rank != 0)
    test_set = load_mnist(args.data, train=False, download=False, quiet=True)
    on_gpu = mg.get_default_device().startswith("gpu")
    train_loader = DataLoader(
        train_set,
        RandomSampler(train_set, batch_size=args.batch_size, drop_last=True, seed=args.seed),
        pin_memory=on_gpu,  # batches go to the GPU without the CPU waiting for the copy
    )
    test_loader = DataLoader(test_set, SequentialSampler(test_set, batch_size=500))

    ckpt = mg.load(args.resume) if args.resume else None
    kind = args.model or DEFAULT_MODEL
    if ckpt is not None:
        kind = checkpoint_model_kind(ckpt, args.resume)
        if args.model and args.model != kind:
            raise ValueError(
                f"{args.resume} holds a {kind} model but --model {args.model} was given"
            )
    model = build_model(kind)
    opt = optim.Adam(model.parameters(), lr=args.lr)
    sched = optim.CosineAnnealingLR(opt, T_max=args.epochs)  # a pure function of the epoch
    start_epoch = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["net"])
        opt.load_state_dict(ckpt["opt"])
        start_epoch = int(ckpt["epoch"]) + 1
        if rank == 0:
            print(f"resumed the {kind} model from {args.resume} (epoch {ckpt['epoch']}, "
                  f"acc {ckpt['acc']:.4f})")
    sched.step(start_epoch)
    dist.bcast_list_(model.tensors())
    gm = ad.GradManager().attach(
        model.parameters(), callbacks=[dist.make_allreduce_cb("mean")] if world > 1 else None
    )

    acc, history = 0.0, []
    for epoch in range(start_epoch, args.epochs):
        train_loader.sampler.set_epoch(epoch)
        bar = _progress(len(train_loader), f"epoch {epoch + 1}/{args.epochs}", rank)
        t0, seen = time.perf_counter(), 0
        for step, (images, labels) in enumerate(train_loader):
            with gm:
                loss = F.nn.cross_entropy(model(to_input(images)), mg.tensor(labels))
                gm.backward(loss)
            opt.step().clear_grad()
            seen += len(labels) * world
            if bar is not None:
                if step % 20 == 0 or step == len(train_loader) - 1:  # reading the loss waits
                    bar.set_postfix(  # for the GPU: not at every step
                        loss=f"{loss.item():.3f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}"
                    )
                bar.update(1)
        if bar is not None:
            bar.close()
        sched.step()
        acc = evaluate(model, test_loader)
        history.append(acc)
        if rank == 0:
            print(
                f"epoch {epoch + 1}: test accuracy {acc:.4f} "
                f"({seen / (time.perf_counter() - t0):.0f} img/s)",
                flush=True,
            )
            if args.save:
                mg.save(
                    {
                        "net": model.state_dict(),
                        "opt": opt.state_dict(),
                        "epoch": epoch,
                        "acc": acc,
                        "model": kind,
                    },
                    args.save,
                )
    return {"acc": acc, "history": history, "model": kind}


def _progress(total: int, desc: str, rank: int):
    """A tqdm bar on rank 0 in a terminal, one summary line per epoch in logs, else nothing."""
    if rank != 0:
        return None
    if not sys.stderr.isatty():
        return _Plain(total, desc)
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


class _Plain:
    """Progress without a terminal (CI logs): one line at the end of the epoch."""

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.post = total, desc, 0, {}

    def update(self, n):
        self.n += n

    def set_postfix(self, **kw):
        self.post = kw

    def close(self):
        print(
            f"{self.desc}: {self.n}/{self.total} steps "
            + " ".join(f"{k}={v}" for k, v in self.post.items()),
            flush=True,
        )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(DEFAULT_EPOCHS), default=None,
                   help=f"default: the checkpoint's with --resume, else {DEFAULT_MODEL}")
    p.add_argument("--epochs", type=int, default=None, help="default: 10")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: #GPUs, else 2)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--data", default=None, help="directory with the MNIST .gz files")
    p.add_argument("--download", action="store_true", help="download the full MNIST if missing")
    p.add_argument("--out-dir", default=RUN_DIR, help="folder for everything written")
    p.add_argument("--save", default="checkpoint.mgc",
                   help="checkpoint file, in --out-dir unless absolute ('' to skip)")
    p.add_argument("--resume", default=None,
                   help="checkpoint to resume from (as given, else in --out-dir)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = DEFAULT_EPOCHS[args.model or DEFAULT_MODEL]
    if args.save:
        args.save = in_run_dir(args.save, args.out_dir)
    if args.resume:
        args.resume = in_run_dir(args.resume, args.out_dir)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.save:
        os.makedirs(os.path.dirname(args.save) or ".", exist_ok=True)
        print(f"writing outputs to {os.path.dirname(args.save) or '.'}{os.sep}", flush=True)
    use_gpu = args.device == "gpu" or (args.device == "auto" and mg.is_cuda_available())
    nproc = args.nproc or (mg.get_device_count("gpu") if use_gpu else 2)
    results = dist.launcher(train, n_gpus=nproc, device_type="gpu" if use_gpu else "cpu")(args)
    return results[0]


if __name__ == "__main__":
    main()
