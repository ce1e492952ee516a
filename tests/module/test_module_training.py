"""End to end: small models trained with GradManager + optimizers reach high training accuracy."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim


def _fit(net, opt, x, y, steps, batch, seed=0):
    rng = np.random.default_rng(seed)
    gm = mg.GradManager().attach(net.parameters())
    for _ in range(steps):
        idx = rng.integers(0, len(x), batch)
        with gm:
            gm.backward(F.nn.cross_entropy(net(mg.tensor(x[idx])), mg.tensor(y[idx])))
        opt.step().clear_grad()
    net.eval()
    pred = net(mg.tensor(x)).numpy().argmax(1)
    return (pred == y).mean()


def test_mlp_learns_concentric_rings():
    """Not linearly separable: needs the hidden layer."""
    mg.random.seed(0)
    rng = np.random.default_rng(1)
    n = 400
    radius = np.where(np.arange(n) % 2 == 0, 1.0, 2.5) + rng.normal(0, 0.15, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1).astype(np.float32)
    y = (np.arange(n) % 2).astype(np.int32)
    net = M.Sequential(M.Linear(2, 32), M.ReLU(), M.Linear(32, 32), M.Tanh(), M.Linear(32, 2))
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = optim.MultiStepLR(opt, milestones=[200])
    acc = _fit(net, opt, x, y, steps=300, batch=32)
    sched.step()
    assert acc > 0.95, acc


@pytest.mark.skipif(not all(hasattr(F, n) for n in ("conv2d", "max_pool2d", "batch_norm")),
                    reason="conv/pool/batch_norm functional ops not available yet")
def test_cnn_learns_bar_orientation():
    """8x8 images with a noisy vertical (class 0) or horizontal (class 1) bar."""
    mg.random.seed(0)
    rng = np.random.default_rng(2)
    n = 256
    y = rng.integers(0, 2, n).astype(np.int32)
    x = rng.normal(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    pos = rng.integers(1, 7, n)
    for i in range(n):
        if y[i] == 0:
            x[i, 0, :, pos[i]] += 1.0
        else:
            x[i, 0, pos[i], :] += 1.0
    net = M.Sequential(
        M.Conv2d(1, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU(), M.MaxPool2d(2),
        M.Flatten(), M.Linear(4 * 4 * 4, 2),
    )
    opt = optim.Adam(net.parameters(), lr=1e-2)
    acc = _fit(net, opt, x, y, steps=200, batch=32)
    assert acc > 0.95, acc
