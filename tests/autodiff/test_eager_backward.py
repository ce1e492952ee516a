"""PyTorch-style eager autograd (``minigrad.autodiff.eager``): ``loss.backward()`` without a
GradManager, checked against float64 finite differences and against the GradManager path, with
PyTorch's accumulation, freeing and error semantics, and a graph that lives only as long as its
outputs (issue 27)."""

import gc
import weakref

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
from minigrad.testing.gradcheck import numeric_directional_derivative


def _fn(w, b, x):
    """A function exercising matmul, broadcasting, a nonlinearity, indexing, concat, reductions
    and a value used twice."""
    h = F.tanh(F.matmul(x, w) + b)
    z = F.concat([h[:, :2] * h[:, 1:3], F.exp(h) / 3], axis=1)
    return (z * h.sum(axis=1, keepdims=True)).mean() + (w * w).sum()


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(4, 3)), rng.normal(size=(3,)), rng.normal(size=(5, 4)))


def test_eager_gradients_match_float64_finite_differences():
    arrays = _arrays()
    w, b = (mg.tensor(a, dtype="float64", requires_grad=True) for a in arrays[:2])
    x = mg.tensor(arrays[2], dtype="float64")  # a constant: gets no gradient
    loss = _fn(w, b, x)
    loss.backward()
    assert x.grad is None
    rng = np.random.default_rng(1)
    for _ in range(3):
        dirs = [rng.normal(size=a.shape) for a in arrays[:2]] + [None]
        numeric = numeric_directional_derivative(_fn, list(arrays), dirs, [True] * 3, "cpu0",
                                                 [1.0], 1e-6)
        analytic = float((w.grad.numpy() * dirs[0]).sum() + (b.grad.numpy() * dirs[1]).sum())
        np.testing.assert_allclose(analytic, numeric, rtol=1e-7, atol=1e-10)


def _mlp():
    mg.random.seed(3)
    return M.Sequential(M.Linear(6, 8), M.ReLU(), M.Linear(8, 8), M.Tanh(), M.Linear(8, 3))


def test_eager_gradients_equal_grad_manager_gradients():
    rng = np.random.default_rng(2)
    x = mg.tensor(rng.normal(size=(7, 6)).astype(np.float32))
    labels = mg.tensor(rng.integers(0, 3, 7))
    eager_net, gm_net = _mlp(), _mlp()
    M.CrossEntropyLoss()(eager_net(x), labels).backward()
    gm = ad.GradManager().attach(gm_net.parameters())
    with gm:
        gm.backward(M.CrossEntropyLoss()(gm_net(x), labels))
    for pe, pg in zip(eager_net.parameters(), gm_net.parameters(), strict=True):
        assert pe.grad is not None
        np.testing.assert_allclose(pe.grad.numpy(), pg.grad.numpy(), rtol=0, atol=1e-12)


def test_gradients_accumulate_until_cleared():
    w = mg.Parameter(np.array([1.0, 2.0], np.float64))
    (w * w).sum().backward()
    (3 * w).sum().backward()  # a new graph: accumulates, as PyTorch does
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 7.0])
    opt = mg.optim.SGD([w], lr=0.5)
    opt.zero_grad()
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0])
    (w * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])
    opt.step()
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])
    opt.clear_grad()
    assert w.grad is None


def test_second_backward_raises_unless_graph_retained():
    w = mg.Parameter(np.array([1.0, 2.0], np.float64))
    loss = (w * w).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*"
                                           "retain_graph=True"):
        loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])  # the failed call added nothing
    w.grad = None
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 8.0])


def test_backward_through_a_freed_shared_part_raises_before_touching_grads():
    w = mg.Parameter(np.array([1.0, 2.0], np.float64))
    u = mg.Parameter(np.array([3.0], np.float64))
    h = w * w  # shared by both losses
    first, second = h.sum(), (h * u).sum()
    first.backward()
    with pytest.raises(RuntimeError, match="second time"):
        second.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])
    assert u.grad is None
    h = w * w
    first, second = h.sum(), (h * u).sum()
    w.grad = None
    first.backward(retain_graph=True)
    second.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0 + 6.0, 4.0 + 12.0])
    np.testing.assert_array_equal(u.grad.numpy(), [5.0])


def test_non_scalar_backward_needs_a_gradient():
    w = mg.Parameter(np.array([1.0, 2.0, 3.0], np.float64))
    y = w * w
    with pytest.raises(RuntimeError, match=r"only for scalar outputs.*shape \(3,\)"):
        y.backward()
    with pytest.raises(RuntimeError, match=r"gradient has shape \(2,\)"):
        y.backward(mg.tensor([1.0, 1.0], dtype="float64"))
    y.backward(mg.tensor([1.0, 0.5, -1.0], dtype="float64"))
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, -6.0])
    with pytest.raises(NotImplementedError, match="create_graph"):
        (w * w).sum().backward(create_graph=True)


def test_leaf_backward_and_requires_grad_flags():
    p = mg.Parameter(np.array([1.0, 2.0], np.float32))
    p.backward(mg.tensor([3.0, 4.0]))
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 4.0])
    x = mg.tensor([1.0, 2.0])
    assert not x.requires_grad and not (x * 2).requires_grad  # nothing to record
    with pytest.raises(RuntimeError, match="nor by ops outside GradManagers"):
        (x * 2).sum().backward()
    x.requires_grad = True
    y = (x * x).sum()
    assert y.requires_grad and not y.detach().requires_grad
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])
    with pytest.raises(RuntimeError, match="only float tensors"):
        mg.tensor([1, 2]).requires_grad_()


def test_no_grad_and_frozen_parameters_record_nothing():
    w = mg.Parameter(np.array([1.0, 2.0], np.float32))
    frozen = mg.Parameter(np.array([5.0, 6.0], np.float32)).requires_grad_(False)
    with mg.no_grad():
        y = (w * w).sum()
    assert not y.requires_grad
    with pytest.raises(RuntimeError, match="not produced by an op recorded"):
        y.backward()
    assert not (frozen * 2).requires_grad
    (w * frozen).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 6.0])
    assert frozen.grad is None


def test_inside_grad_manager_nothing_changes():
    """Inside ``with gm:`` only attached tensors are recorded; loss.backward() is gm's; a tensor
    computed eagerly before is a constant there."""
    w = mg.Parameter(np.array([1.0, 2.0], np.float64))
    other = mg.Parameter(np.array([3.0, 4.0], np.float64))  # not attached
    before = w * other  # recorded eagerly, outside gm
    gm = ad.GradManager().attach([w])
    with gm:
        assert not (other * 2).requires_grad  # unattached: not recorded, as in MegEngine
        loss = (w * other + before).sum()
        loss.backward()  # gm.backward(loss): releases the recording
        assert not gm.is_recording
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 4.0])  # nothing through `before`
    assert other.grad is None
    before.sum().backward()  # the eager graph is still there, untouched by gm
    np.testing.assert_array_equal(w.grad.numpy(), [6.0, 8.0])
    np.testing.assert_array_equal(other.grad.numpy(), [1.0, 2.0])


def test_parameters_with_grad_hooks_refuse_eager_backward():
    """DDP syncs gradients with hooks that only a GradManager's backward runs: an eager backward
    must refuse, not leave the ranks' gradients unsynchronised."""
    w = mg.Parameter(np.array([1.0, 2.0], np.float32))
    handle = ad.register_grad_hook(w, lambda t, g: g * 2)
    with pytest.raises(RuntimeError, match="gradient hooks"):
        (w * w).sum().backward()
    assert w.grad is None
    handle.remove()
    (w * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])


def test_inference_loop_without_no_grad_does_not_grow():
    """The graph hangs off its outputs: once an iteration's output is dropped, its nodes (and
    the buffers they saved) are freed by reference counting alone (no cycles, no tape)."""
    net = _mlp()
    x = mg.tensor(np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32))
    gc.collect()
    gc.disable()
    try:
        refs = []
        for _ in range(300):
            out = net(x).sum()
            assert out.requires_grad
            refs.append(weakref.ref(out._node))
            assert sum(r() is not None for r in refs) == 1  # only this iteration's graph
        first_nodes = len(gc.get_objects())
        for _ in range(300):
            out = net(x).sum()
        assert len(gc.get_objects()) <= first_nodes + 10
        del out
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
