"""Shared pieces of the distributed checkpoint tests: a small float64 model, its data and one
training step, identical in every layout."""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim

IN, HID, OUT, BATCH = 4, 8, 4, 8


def float64(model):
    """Every tensor of ``model`` in float64 (references at 1e-10)."""
    for t in model.tensors():
        t._data = t._data.astype(np.float64)
    return model


def mlp(seed=0):
    """Linear-ReLU-Linear, float64, from ``seed``."""
    mg.random.seed(seed)
    return float64(M.Sequential(M.Linear(IN, HID), M.ReLU(), M.Linear(HID, OUT)))


def batch(step, size=BATCH):
    """The (x, y) of ``step``: the same global batch in every layout."""
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((size, IN)), rng.standard_normal((size, OUT))


def adam(model):
    """Adam with a per-parameter state (moments and step counts) to carry over."""
    return optim.Adam(model.parameters(), lr=0.01)


def train_step(model, opt, gm, x, y, sched=None):
    """One step of mean squared error."""
    with gm:
        loss = F.mean((model(mg.tensor(x)) - mg.tensor(y)) ** 2)
        gm.backward(loss)
    opt.step().clear_grad()
    if sched is not None:
        sched.step()
    return loss.item()


def params(model):
    """name -> full value (logical)."""
    return {k: np.asarray(v) for k, v in model.state_dict().items()}


def manager(model):
    """A GradManager attached to every parameter."""
    return ad.GradManager().attach(model.parameters())
