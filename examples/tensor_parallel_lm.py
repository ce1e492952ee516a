"""Train a small character-level transformer language model with tensor parallelism on CPU ranks.

The corpus is minigrad's own source and README (shipped with the repository), read as ASCII bytes.
``--tp`` ranks split every layer in the chosen ``--mode`` (1d, 2d, 2.5d, 3d); ``--dp`` copies of
that group train on different windows of the text and average their gradients over the data group.
The model is written once with ``tp.*`` layers, so the checkpoint (full tensors, single-device keys)
is loaded at the end into a one-process model that samples some text.

    python examples/tensor_parallel_lm.py --tp 4 --mode 2d
    python examples/tensor_parallel_lm.py --tp 8 --mode 2.5d --depth 2
    python examples/tensor_parallel_lm.py --tp 2 --mode 1d --dp 2 --out runs/lm_1d

Outputs (in ``--out``, printed at the start): ``loss.csv`` (step, loss), ``checkpoint.mgz`` and
``sample.txt``.
"""

import argparse
import csv
import os
import time
from pathlib import Path

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128  # ASCII


def load_corpus() -> np.ndarray:
    """The README and every Python file of the minigrad package, as ASCII codes."""
    files = [ROOT / "README.md", *sorted((ROOT / "minigrad").rglob("*.py"))]
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    codes = np.frombuffer(text.encode("ascii", errors="replace"), np.uint8)
    return codes.astype(np.int64)


def windows(corpus: np.ndarray, step: int, replica: int, batch: int, seq: int, seed: int):
    """``batch`` random windows of ``seq + 1`` characters: (inputs, next-character labels). The
    same on every rank of a tensor-parallel group, different for each data-parallel replica."""
    rng = np.random.default_rng([seed, step, replica])
    starts = rng.integers(0, len(corpus) - seq - 1, batch)
    chunk = np.stack([corpus[s : s + seq + 1] for s in starts])
    return chunk[:, :-1], chunk[:, 1:]


def build_model(args):
    """The LM from the seed: tensor-parallel under a parallel context, single-device without."""
    mg.random.seed(args.seed)
    tp.reset_layout()
    return tp.TransformerLM(VOCAB, args.dim, args.heads, args.layers, args.seq)


def parallel_config(args) -> dict:
    """Colossal-AI's ``parallel`` dict for the command line."""
    tensor = dict(size=args.tp, mode=None if args.mode == "none" else args.mode)
    if args.mode == "2.5d":
        tensor["depth"] = args.depth
    return dict(tensor=tensor)


def train(args, corpus):
    """One rank: set up the groups, train, save the (logical) checkpoint; returns the losses."""
    ctx = dist.init_parallel(parallel_config(args))
    if dist.get_rank() == 0:
        print(ctx)
    model = build_model(args)
    gm = ad.GradManager().attach(
        model.parameters(), callbacks=[dist.make_allreduce_cb("mean", group=ctx.group("data"))]
    )
    opt = optim.Adam(model.parameters(), lr=args.lr)
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        ids, labels = windows(corpus, step, ctx.rank("data"), args.batch, args.seq, args.seed)
        with gm:
            loss = tp.cross_entropy(model(tp.split_input(ids)), tp.split_input(labels))
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
        if dist.get_rank() == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.3f}  ({time.perf_counter() - start:.1f} s)")
    state = model.state_dict()  # collective: full tensors on every rank
    if dist.get_rank() == 0:
        mg.save(state, str(Path(args.out) / "checkpoint.mgz"))
    return losses


def sample(args, length: int = 300) -> str:
    """Text sampled (temperature 1) from the saved checkpoint, in this single process."""
    model = build_model(args)
    model.load_state_dict(mg.load(str(Path(args.out) / "checkpoint.mgz")))
    model.eval()
    rng = np.random.default_rng(args.seed)
    ids = list(b"import minigrad")
    with ad.no_grad():
        for _ in range(length):
            window = np.array([ids[-args.seq:]])
            logits = model(mg.tensor(window)).numpy()[0, -1].astype(np.float64)
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(VOCAB, p=p / p.sum())))
    return bytes(ids).decode("ascii", errors="replace")


def parse_args(argv=None):
    """The command line (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=4, help="tensor-parallel size")
    p.add_argument("--mode", choices=["1d", "2d", "2.5d", "3d", "none"], default="2d")
    p.add_argument("--depth", type=int, default=2, help="2.5D depth")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sequences per data-parallel replica")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/tensor_parallel_lm", help="output folder")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Train on ``dp × tp`` CPU ranks, then sample from the checkpoint in this process."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(f"writing to {os.path.abspath(args.out)}")
    corpus = load_corpus()
    world = args.dp * args.tp
    results = dist.launcher(train, n_gpus=world, device_type="cpu")(args, corpus)
    losses = results[0]
    with open(Path(args.out) / "loss.csv", "w", newline="") as f:
        csv.writer(f).writerows([("step", "loss"), *enumerate(losses)])
    text = sample(args)
    (Path(args.out) / "sample.txt").write_text(text)
    print(f"sample: {text[:200]!r}")
    tensor_group_agrees = all(results[r] == losses for r in range(args.tp))  # data is slowest
    return dict(losses=losses, sample=text, tensor_group_agrees=tensor_group_agrees)


if __name__ == "__main__":
    main()
