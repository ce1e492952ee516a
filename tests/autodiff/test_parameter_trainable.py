"""PyTorch's habit, kept: parameters are trainable by default (``requires_grad`` True before any
GradManager sees them), ``requires_grad_(False)`` freezes one, and an optimizer given an empty
parameter list raises instead of training nothing (issue 27)."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.autodiff import GradManager


def _net():
    mg.random.seed(0)
    return M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 1))


def _step(net, params, gm):
    opt = optim.SGD(params, lr=0.1)
    x = mg.tensor(np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32))
    with gm:
        gm.backward(F.sum(net(x) ** 2))
    opt.step()


def test_parameters_report_requires_grad_before_any_grad_manager():
    net = _net()
    trainable = [p for p in net.parameters() if p.requires_grad]
    assert len(trainable) == 4  # the PyTorch idiom selects every parameter
    assert not mg.tensor([1.0]).requires_grad  # a plain tensor still does not
    before = [p.numpy().copy() for p in net.parameters()]
    _step(net, trainable, GradManager().attach(trainable))
    assert all(not np.array_equal(b, p.numpy()) for b, p in zip(before, net.parameters(),
                                                                strict=True))


def test_frozen_parameters_get_no_gradient_even_when_attached():
    net = _net()
    first = net[0]
    first.weight.requires_grad_(False)
    first.bias.requires_grad = False
    assert [p.requires_grad for p in net.parameters()] == [False, False, True, True]
    frozen_before = first.weight.numpy().copy()
    gm = GradManager().attach(net.parameters())  # the MegEngine way: attach everything
    _step(net, [p for p in net.parameters() if p.requires_grad], gm)
    assert first.weight.grad is None and first.bias.grad is None
    assert net[2].weight.grad is not None
    np.testing.assert_array_equal(first.weight.numpy(), frozen_before)
    # unfrozen, the manager it was attached to computes its gradient again
    assert first.weight.requires_grad_() is first.weight and first.weight.requires_grad
    x = mg.tensor(np.ones((2, 3), np.float32))
    with gm:
        gm.backward(F.sum(net(x)))
    assert first.weight.grad is not None and first.bias.grad is None


def test_freezing_after_attach_stops_the_gradient():
    w = mg.Parameter(np.ones(3, np.float32))
    v = mg.Parameter(np.ones(3, np.float32))
    gm = GradManager().attach([w, v])
    w.requires_grad_(False)
    with gm:
        gm.backward(F.sum(w * v * 2))
    assert w.grad is None
    np.testing.assert_array_equal(v.grad.numpy(), [2.0, 2.0, 2.0])


def test_an_optimizer_given_no_parameters_raises():
    net = _net()
    for p in net.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="SGD: got an empty parameter list"):
        optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)
