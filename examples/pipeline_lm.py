"""Train a small character-level transformer language model with pipeline parallelism.

The model is a list of layers (``PipelineModule``): a token embedding tied to the output head
(``TiedLayerSpec``), learned positions, transformer blocks, a final LayerNorm. It is cut into
``--stages`` stages (x ``--dp`` data-parallel replicas), one CPU process each, and trained on the
text that ships with minigrad (its README and docs) with the chosen pipeline schedule. Everything
it writes goes into one folder, ``runs/pipeline_lm/`` (``--out-dir``), which it names on screen:
``metrics.json`` (losses per step), ``checkpoint/`` (one file per layer, loadable with any number
of stages or into one process) and, with ``--timeline``, the Gantt chart of the last step.

    python examples/pipeline_lm.py                                    # 2 stages, 1F1B
    python examples/pipeline_lm.py --stages 4 --micro-batches 8 --timeline timeline.png
    python examples/pipeline_lm.py --stages 2 --dp 2 --schedule interleaved
    python examples/pipeline_lm.py --schedule zb-h1 --checkpoint-interval 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import minigrad as mg
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.data import DataLoader, RandomSampler, SequentialSampler
from minigrad.data.dataset import ArrayDataset
from minigrad.distributed.pipeline import (
    SCHEDULES,
    LayerSpec,
    PipelineEngine,
    PipelineModule,
    RepeatingLoader,
    TiedLayerSpec,
    plot_timeline,
)

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = os.path.join("runs", "pipeline_lm")
VOCAB = 128  # ASCII; other characters become "?"


# ------------------------------------------------------------------------------------------------
# The model, as a list of layers
# ------------------------------------------------------------------------------------------------
class Positions(M.Module):
    """Token embeddings (B, T, d) plus a learned embedding of each position."""

    def __init__(self, seq_len: int, d_model: int):
        super().__init__()
        self.weight = mg.Parameter(np.random.default_rng(1).normal(0, 0.02, (seq_len, d_model))
                                   .astype("float32"))

    @classmethod
    def parameter_count(cls, seq_len: int, d_model: int) -> int:
        return seq_len * d_model

    def forward(self, h):
        return h + self.weight[: h.shape[1]]


class Block(M.Module):
    """A pre-LayerNorm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = M.LayerNorm(d_model), M.LayerNorm(d_model)
        self.attn = M.MultiHeadAttention(d_model, heads)
        self.fc1, self.fc2 = M.Linear(d_model, 4 * d_model), M.Linear(4 * d_model, d_model)
        self.drop = M.Dropout(dropout)

    @classmethod
    def parameter_count(cls, d_model: int, heads: int, dropout: float) -> int:
        """Counted from the arguments, so the partition table needs no built block."""
        return 2 * 2 * d_model + 4 * (d_model + 1) * d_model + 2 * 4 * d_model * d_model \
            + 5 * d_model

    def forward(self, h):
        a = self.ln1(h)
        h = h + self.drop(self.attn(a, a, a, is_causal=True)[0])
        return h + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(h)))))


def lm_head(embedding: M.Embedding, h):
    """The output projection: the token embedding, transposed (weights tied to the input),
    scaled by 1 / sqrt(d) so that the first logits are small."""
    return F.matmul(h, embedding.weight.T) * embedding.weight.shape[1] ** -0.5


def lm_loss(logits, labels):
    """Next-character cross entropy over every position."""
    return F.nn.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def build_specs(args) -> list:
    return [TiedLayerSpec("embed", M.Embedding, VOCAB, args.d_model),
            LayerSpec(Positions, args.seq_len, args.d_model),
            *[LayerSpec(Block, args.d_model, args.heads, args.dropout)
              for _ in range(args.layers)],
            LayerSpec(M.LayerNorm, args.d_model),
            TiedLayerSpec("embed", M.Embedding, VOCAB, args.d_model, forward_fn=lm_head)]


# ------------------------------------------------------------------------------------------------
# Data: windows of the text that ships with minigrad
# ------------------------------------------------------------------------------------------------
def load_text() -> np.ndarray:
    """The README and the docs as ASCII codes."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in paths if p.exists())
    return np.frombuffer(text.encode("ascii", "replace"), np.uint8).astype("int32")


def windows(codes: np.ndarray, seq_len: int, split: str) -> ArrayDataset:
    """Non-overlapping windows (inputs, next characters); the last tenth is for validation."""
    n = (len(codes) - 1) // seq_len
    starts = np.arange(n) * seq_len
    cut = int(n * 0.9)
    starts = starts[:cut] if split == "train" else starts[cut:]
    idx = starts[:, None] + np.arange(seq_len)
    return ArrayDataset(codes[idx], codes[idx + 1])


def loaders(args, replica: int, replicas: int):
    """The training loader shards by data-parallel replica (not by global rank: the first and
    last stages of one pipeline must read the same items, in the same order)."""
    codes = load_text()
    train, val = windows(codes, args.seq_len, "train"), windows(codes, args.seq_len, "val")
    train_loader = DataLoader(train, RandomSampler(train, args.batch_size, drop_last=True,
                                                   world_size=replicas, rank=replica, seed=0))
    val_loader = DataLoader(val, SequentialSampler(val, args.batch_size, drop_last=True,
                                                   world_size=replicas, rank=replica))
    return train_loader, val_loader


# ------------------------------------------------------------------------------------------------
# One rank
# ------------------------------------------------------------------------------------------------
def run_rank(args) -> dict:
    mg.random.seed(0)
    chunks = 2 if args.schedule == "interleaved" else 1
    net = PipelineModule(build_specs(args), num_stages=args.stages, loss_fn=lm_loss,
                         partition_method="type:block" if chunks == 1 else "uniform",
                         activation_checkpoint_interval=args.checkpoint_interval,
                         chunks=chunks)
    rank = dist.get_rank()
    replica = net.topology.get_coord(rank).data
    engine = PipelineEngine(net, optim.Adam(net.parameters(), lr=args.lr), args.micro_batches,
                            schedule=args.schedule)
    if rank == 0:
        print(net.partition_table(), flush=True)
    train_loader, val_loader = loaders(args, replica, net.topology.get_dim("data"))
    data = iter(RepeatingLoader(train_loader))
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        losses.append(engine.train_batch(data))
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}  "
                  f"({(time.perf_counter() - start) / (step + 1) * 1e3:.0f} ms/step)", flush=True)
    timeline = engine.timeline()  # collective: every rank's actions of the last step
    val_loss = engine.eval_batch(iter(RepeatingLoader(val_loader)))
    engine.save_state_dict(os.path.join(args.out_dir, "checkpoint"))
    if rank == 0 and args.timeline:
        title = f"{args.schedule}, {args.stages} stages x {args.micro_batches} micro-batches"
        plot_timeline(timeline, args.timeline, title=title)
    return {"losses": losses, "val_loss": val_loss, "stage": net.stage_id, "replica": replica}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, default=2, help="pipeline stages")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas per stage")
    p.add_argument("--schedule", default="1f1b", choices=sorted(set(SCHEDULES) - {"inference"}))
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--checkpoint-interval", type=int, default=0,
                   help="activation checkpointing: recompute every k layers (0: off)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--timeline", default="", help="PNG of the last step's timeline (in --out-dir)")
    p.add_argument("--out-dir", default=RUN_DIR, help="folder for everything written")
    args = p.parse_args(argv)
    if args.timeline and not os.path.isabs(args.timeline):
        args.timeline = os.path.join(args.out_dir, args.timeline)
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"writing outputs to {args.out_dir}{os.sep}", flush=True)
    results = dist.launcher(run_rank, n_gpus=args.stages * args.dp, device_type="cpu")(args)
    summary = {"args": vars(args), "losses": results[0]["losses"],
               "val_loss": results[0]["val_loss"],
               "perplexity": math.exp(results[0]["val_loss"])}
    with open(os.path.join(args.out_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"validation loss {summary['val_loss']:.4f} (perplexity {summary['perplexity']:.1f})")
    summary["ranks"] = results
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
