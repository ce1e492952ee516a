"""One training run of the helper MLP in a named layout, optionally resumed from or saved to a
checkpoint: the building block of the resharding tests (each layout trains the same global
batches, so every layout computes the same function up to rounding)."""

import os

import numpy as np
from ckpt_helpers import BATCH, HID, IN, OUT, batch, float64

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp
from minigrad.distributed.pipeline import PipelineEngine, PipelineModule

#: layout name -> (world size, tensor-parallel config or None)
LAYOUTS = {
    "single": 1, "data2": 2, "tensor2_1d": 2, "tensor4_2d": 4, "pipe2": 2,
}


def _mse(out, y):
    return F.mean((out - y) ** 2)


def _layers():
    mg.random.seed(0)
    return [float64(M.Linear(IN, HID)), M.ReLU(), float64(M.Linear(HID, OUT))]


class Run:
    """The model, optimizer and step function of ``layout`` (call inside the launched ranks)."""

    def __init__(self, layout: str):
        self.layout = layout
        self.engine = None
        if layout.startswith("tensor"):
            size, mode = (2, "1d") if layout == "tensor2_1d" else (4, "2d")
            dist.init_parallel(dict(tensor=dict(size=size, mode=mode)))
            tp.reset_layout()
            mg.random.seed(0)
            self.model = float64(M.Sequential(tp.Linear(IN, HID), M.ReLU(), tp.Linear(HID, OUT)))
        elif layout == "pipe2":
            self.model = PipelineModule(_layers(), num_stages=2, loss_fn=_mse)
        else:
            self.model = M.Sequential(*_layers())
        self.opt = optim.Adam(list(self.model.parameters()), lr=0.01)
        if layout == "pipe2":
            self.engine = PipelineEngine(self.model, self.opt, micro_batches=2, schedule="1f1b")
        callbacks = [dist.make_allreduce_cb("mean")] if layout == "data2" else []
        self.gm = ad.GradManager().attach(self.model.parameters(), callbacks=callbacks)

    def step(self, step: int) -> None:
        x, y = batch(step)
        if self.engine is not None:
            half = BATCH // 2
            self.engine.train_batch(iter([(x[:half], y[:half]), (x[half:], y[half:])]))
            return
        if self.layout == "data2":
            half, r = BATCH // 2, dist.get_rank()
            x, y = x[r * half:(r + 1) * half], y[r * half:(r + 1) * half]
        with self.gm:
            if self.layout.startswith("tensor"):
                out = tp.gather_output(self.model(tp.split_input(mg.tensor(x))))
            else:
                out = self.model(mg.tensor(x))
            self.gm.backward(_mse(out, mg.tensor(y)))
        self.opt.step().clear_grad()

    def state(self, step: int) -> dict:
        return {"model": self.model, "optim": self.opt, "step": step}

    def resume(self, root: str) -> tuple[dict, str | None]:
        """The state at step 0, loaded from the latest checkpoint under ``root`` if there is one;
        and that checkpoint's path (None when there is none)."""
        state = self.state(0)
        latest = dist.checkpoint.latest(root)
        if latest is not None:
            dist.checkpoint.load(state, latest)
        return state, latest


def train(layout: str, stop: int, root: str | None = None, save_at: int | None = None,
          resume: bool = False) -> dict:
    """Train ``layout`` up to step ``stop`` (from the latest checkpoint under ``root`` when
    ``resume``), saving at ``save_at``; returns this rank's logical parameters."""
    run = Run(layout)
    state = run.state(0)
    if resume:
        dist.checkpoint.load(state, dist.checkpoint.latest(root))
    for step in range(state["step"], stop):
        run.step(step)
        state["step"] = step + 1
        if save_at == step + 1:
            dist.checkpoint.save(state, os.path.join(root, f"step-{step + 1}"))
    return {k: np.asarray(v) for k, v in run.model.state_dict().items()}


def run(layout: str, *args, **kwargs) -> dict:
    """:func:`train` on the layout's ranks (one process for ``single``); the union of every
    rank's parameters (names held by several ranks must agree bitwise)."""
    from minigrad.testing.distributed import run_workers

    n = LAYOUTS[layout]
    results = [train(layout, *args, **kwargs)] if n == 1 else run_workers(
        train, n, layout, *args, timeout=240, **kwargs)
    merged = {}
    for state in results:
        for name, value in state.items():
            if name in merged:
                np.testing.assert_array_equal(merged[name], value, err_msg=name)
            merged[name] = value
    return merged
