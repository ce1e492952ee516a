"""Train a small transformer language model with sequence parallelism on CPU ranks.

Every sequence is split over ``--sp`` ranks (ring attention or Ulysses all-to-all attention) and
the batch over ``--dp`` data-parallel replicas: ``sp × dp`` processes in all. Token-wise layers run
on each rank's shard, attention exchanges keys and values, and parameter gradients are summed over
the sequence × data group. The data is synthetic and shipped here: each sequence counts from a
random start with a random stride (mod the vocabulary), so a causal model has to infer the stride
from the context.

    python examples/sequence_parallel_lm.py --sp 2 --sp-impl ring --causal --zigzag
    python examples/sequence_parallel_lm.py --sp 2 --dp 2 --sp-impl ulysses --causal
    python examples/sequence_parallel_lm.py --sp 2 --steps 3 --dtype float64 --check

The loss per step, the configuration and the trained weights go to ``--out-dir`` (named on screen).
``--check`` trains the same model in one process with dense attention and prints the largest
difference of the final weights (rounding level: ~1e-15 in float64).
"""

import argparse
import csv
import json
from pathlib import Path

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.optimizer as optim
from minigrad.distributed import comm
from minigrad.distributed import sequence_parallel as sp
from minigrad.distributed.mesh.topology import ProcessTopology

VOCAB, STRIDES = 32, (1, 2, 3, 5)


def synthetic_batches(steps: int, batch: int, seq_len: int, seed: int = 0):
    """``steps`` arrays of ``(batch, seq_len + 1)`` tokens: x_{t+1} = x_t + stride (mod VOCAB)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        start = rng.integers(0, VOCAB, size=(batch, 1))
        stride = rng.choice(STRIDES, size=(batch, 1))
        yield (start + stride * np.arange(seq_len + 1)) % VOCAB


def build_model(args, attention: str, group=None):
    mg.random.seed(args.seed)  # the same initial weights on every rank and in the reference
    return sp.SequenceParallelLM(VOCAB, args.dim, args.heads, args.layers, args.seq_len,
                                 attention=attention, causal=args.causal, zigzag=args.zigzag,
                                 group=group, dtype=args.dtype)


def train_parallel(args):
    """One rank: its data replica's rows, its shard of every sequence."""
    topo = ProcessTopology(["data", "sequence"], [args.dp, args.sp])
    seq_group, grad_group = topo.group("sequence"), topo.group("data", "sequence")
    data_rank = topo.get_coord(dist.get_rank()).data
    model = build_model(args, args.sp_impl, seq_group)
    params = list(model.parameters())
    gm = ad.GradManager().attach(
        params, callbacks=[dist.make_allreduce_cb("sum", group=grad_group)])
    opt = optim.Adam(params, lr=args.lr)
    rows = args.batch // args.dp
    losses = []
    for tokens in synthetic_batches(args.steps, args.batch, args.seq_len, args.seed):
        mine = tokens[data_rank * rows:(data_rank + 1) * rows]
        ids, labels = sp.split_lm_batch(mine, args.zigzag, seq_group)
        with gm:
            loss = sp.sequence_cross_entropy(model(ids), labels, grad_group)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(float(comm.all_reduce(loss.numpy(), group=grad_group)))
    return {"losses": losses, "params": [p.numpy() for p in params],
            "state": model.state_dict() if dist.get_rank() == 0 else None}


def train_single(args):
    model = build_model(args, "dense")
    params = list(model.parameters())
    gm = ad.GradManager().attach(params)
    opt = optim.Adam(params, lr=args.lr)
    losses = []
    for tokens in synthetic_batches(args.steps, args.batch, args.seq_len, args.seed):
        with gm:
            logits = model(tokens[:, :-1])
            loss = F.nn.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.numpy() for p in params]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sp", type=int, default=2, help="ranks per sequence")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--sp-impl", choices=("ring", "ulysses"), default="ring")
    p.add_argument("--causal", action="store_true", help="causal (autoregressive) attention")
    p.add_argument("--zigzag", action="store_true", help="zigzag shards (balanced causal work)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="runs/sequence_parallel_lm", help="output folder")
    p.add_argument("--check", action="store_true", help="compare with a one-process run")
    args = p.parse_args(argv)
    if args.batch % args.dp:
        p.error(f"--batch {args.batch} is not divisible by --dp {args.dp}")
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"sequence parallel {args.sp} ({args.sp_impl}) x data parallel {args.dp}: "
          f"writing to {out}")

    ranks = dist.launcher(lambda: train_parallel(args), n_gpus=args.sp * args.dp,
                          device_type="cpu")()
    losses = ranks[0]["losses"]
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f} "
          f"(uniform guess: {np.log(VOCAB):.4f})")
    with open(out / "losses.csv", "w", newline="") as f:
        csv.writer(f).writerows([("step", "loss")] + list(enumerate(losses)))
    (out / "config.json").write_text(json.dumps(vars(args), indent=2))
    mg.save(ranks[0]["state"], str(out / "model.mgc"))
    result = {"losses": losses, "params": ranks[0]["params"], "out": out}
    if args.check:
        ref = train_single(args)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(result["params"], ref["params"]))
        print(f"max |sequence parallel - single process| over all weights: {diff:.3g}")
        result["reference"], result["max_diff"] = ref, diff
    return result


if __name__ == "__main__":
    main()
