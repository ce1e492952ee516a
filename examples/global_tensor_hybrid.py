"""Data x tensor parallel MLP on a 2 x 2 mesh of ranks, written only with SBP annotations.

The model is an ordinary two-layer MLP. The parallel layout is a handful of ``to_global`` calls on
the mesh ``[[0, 1], [2, 3]]``: mesh dimension 0 is data parallel, mesh dimension 1 tensor parallel
(Megatron's column/row split, expressed as SBPs)::

    batch x, labels       (split(0), broadcast)    each pair of ranks gets half of the batch
    fc1 weight and bias   (broadcast, split(0))    output features split: column parallel
    hidden h = relu(fc1)  (split(0), split(1))     what linear's rule makes of the two above
    fc2 weight            (broadcast, split(1))    input features split: row parallel
    logits = fc2(h)       (split(0), partial_sum)  partial sums over the tensor-parallel pair
    loss                  (partial_sum, broadcast)

Every collective (the partial sums' all-reduce before the softmax, the data-parallel all-reduce of
the gradients, ...) comes from the ops' SBP rules; the program itself calls none. ``--check`` also
trains the same model in one process and prints the largest difference (rounding level, float64).
Outputs (losses, a logical checkpoint) go to the folder printed at the start.

    python -m minigrad.distributed.launch --nproc_per_node 4 examples/global_tensor_hybrid.py
"""

import argparse
import json
import os
import sys

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim

D_IN, HIDDEN, CLASSES, BATCH, LR = 12, 16, 5, 8, 0.2
OUT_DIR = os.path.join("runs", "global_tensor_hybrid")
B, S = mg.sbp.broadcast, mg.sbp.split


class MLP(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(D_IN, HIDDEN)
        self.fc2 = M.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def build_model() -> MLP:
    """The same float64 initial weights in every process."""
    mg.random.seed(0)
    model = MLP()
    for layer in (model.fc1, model.fc2):
        layer.weight = mg.Parameter(layer.weight.numpy().astype("float64"))
        layer.bias = mg.Parameter(layer.bias.numpy().astype("float64"))
    return model


def batch(step: int):
    """A batch of a learnable toy task: the label is the largest of five fixed projections."""
    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((BATCH, D_IN))
    proj = np.random.default_rng(7).standard_normal((D_IN, CLASSES))
    return x, (x @ proj).argmax(axis=1).astype("int32")


def annotate(model: MLP, mesh) -> None:
    """The whole parallel layout: SBP annotations of the parameters."""
    model.to_global(mesh, (B, B))  # replicated (rank 0's values win), then split:
    model.fc1.to_global(mesh, (B, S(0)))  # column parallel
    model.fc2.weight = mg.Parameter(model.fc2.weight.to_global(sbp=(B, S(1))))  # row parallel


def train(steps: int, mesh=None) -> dict:
    """``steps`` of SGD; on the 2 x 2 mesh when ``mesh`` is given, else in this process alone.
    Returns the losses and the final (logical) weights."""
    model = build_model()
    if mesh is not None:
        annotate(model, mesh)
    gm = ad.GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=LR)
    data = dict(placement=mesh, sbp=(S(0), B)) if mesh is not None else {}
    losses = []
    for step in range(steps):
        xb, yb = batch(step)
        x, y = mg.tensor(xb, dtype="float64", **data), mg.tensor(yb, **data)
        with gm:
            loss = F.nn.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    weights = {name: p.numpy() for name, p in model.named_parameters()}
    return {"losses": losses, "weights": weights, "model": model}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--check", action="store_true", help="compare with a one-process run")
    args = p.parse_args(argv)
    if max(dist.get_world_size(), int(os.environ.get("WORLD_SIZE", "1"))) < 4:
        sys.exit(f"{sys.argv[0]} needs 4 ranks (a 2 x 2 mesh); run: python -m "
                 f"minigrad.distributed.launch --nproc_per_node 4 {sys.argv[0]}")
    mesh = mg.placement("cpu", [[0, 1], [2, 3]])
    rank = dist.get_rank()
    if rank == 0:
        os.makedirs(OUT_DIR, exist_ok=True)
        print(f"writing outputs to {OUT_DIR}{os.sep}", flush=True)
    out = train(args.steps, mesh)
    mg.save(out["model"].state_dict(), os.path.join(OUT_DIR, "mlp.mgc"), global_dst_rank=0)
    if rank == 0:
        losses = out["losses"]
        print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}", flush=True)
        record = {"losses": losses}
        if args.check:
            ref = train(args.steps)
            diff = max(float(np.abs(out["weights"][k] - ref["weights"][k]).max())
                       for k in ref["weights"])
            print(f"max |2 x 2 mesh - one process| over the weights: {diff:.3g}", flush=True)
            record["max_weight_diff"] = diff
        with open(os.path.join(OUT_DIR, "losses.json"), "w") as f:
            json.dump(record, f, indent=1)
    return out


if __name__ == "__main__":
    main()
