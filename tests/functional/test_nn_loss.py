"""Losses and topk_accuracy against NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def _t(a, device, dtype="float64"):
    return mg.tensor(a, dtype=dtype, device=device)


def _red(x, reduction):
    return {"mean": x.mean(), "sum": x.sum(), "none": x}[reduction]


def _ref_ce(x, y, axis, smooth=0.0):
    m = x.max(axis=axis, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    picked = np.take_along_axis(logp, np.expand_dims(y, axis), axis).squeeze(axis)
    return -(1 - smooth) * picked - smooth * logp.mean(axis=axis)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smooth", [0.0, 0.1])
def test_cross_entropy(reduction, smooth, device, rng):
    x = rng.standard_normal((6, 5)) * 3
    y = rng.integers(0, 5, 6).astype(np.int32)
    got = F.cross_entropy(_t(x, device), _t(y, device, "int32"), label_smooth=smooth,
                          reduction=reduction)
    np.testing.assert_allclose(got.numpy(), _red(_ref_ce(x, y, 1, smooth), reduction), rtol=1e-10)
    check_grad(lambda x, y: F.cross_entropy(x, y, label_smooth=smooth, reduction=reduction), x, y,
               device=device)


def test_cross_entropy_other_axis_and_probabilities(device, rng):
    x = rng.standard_normal((2, 4, 3))  # (N, C, L) with labels (N, L)
    y = rng.integers(0, 4, (2, 3)).astype(np.int32)
    got = F.cross_entropy(_t(x, device), _t(y, device, "int32"))
    np.testing.assert_allclose(got.numpy(), _ref_ce(x, y, 1).mean(), rtol=1e-10)
    xl = rng.standard_normal((3, 2, 5))
    yl = rng.integers(0, 5, (3, 2)).astype(np.int32)
    got = F.cross_entropy(_t(xl, device), _t(yl, device, "int32"), axis=-1)
    np.testing.assert_allclose(got.numpy(), _ref_ce(xl, yl, 2).mean(), rtol=1e-10)
    p = rng.random((4, 3)) + 0.1
    p /= p.sum(1, keepdims=True)
    yp = np.array([0, 2, 1, 1], dtype=np.int32)
    got = F.cross_entropy(_t(p, device), _t(yp, device, "int32"), with_logits=False)
    np.testing.assert_allclose(got.numpy(), -np.log(p[np.arange(4), yp]).mean(), rtol=1e-12)
    check_grad(lambda p, y: F.cross_entropy(p, y, with_logits=False), p, yp, device=device)


def test_cross_entropy_bad_labels(device):
    x = _t(np.zeros((3, 4)), device)
    with pytest.raises(TypeError, match="cross_entropy: label must be an integer tensor"):
        F.cross_entropy(x, _t(np.zeros(3), device))
    # (on a GPU the range is checked without waiting: the error comes when values are read)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 4\), got min 0 max 4"):
        F.cross_entropy(x, _t(np.array([0, 4, 1]), device, "int32")).numpy()
    with pytest.raises(ValueError, match="cross_entropy: labels must be in .* min -1"):
        F.cross_entropy(x, _t(np.array([0, -1, 1]), device, "int32")).numpy()
    with pytest.raises(ValueError, match=r"cross_entropy: label shape \(2,\)"):
        F.cross_entropy(x, _t(np.array([0, 1]), device, "int32"))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(x, _t(np.array([0, 1, 2]), device, "int32"), reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction, device, rng):
    x = rng.standard_normal((4, 3)) * 3
    y = rng.random((4, 3))
    p = 1 / (1 + np.exp(-x))
    ref = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    got = F.binary_cross_entropy(_t(x, device), _t(y, device), reduction=reduction)
    np.testing.assert_allclose(got.numpy(), _red(ref, reduction), rtol=1e-10)
    got = F.binary_cross_entropy(_t(p, device), _t(y, device), with_logits=False,
                                 reduction=reduction)
    np.testing.assert_allclose(got.numpy(), _red(ref, reduction), rtol=1e-10)
    check_grad(lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), x, y,
               device=device)
    check_grad(lambda p, y: F.binary_cross_entropy(p, y, with_logits=False), p, y, wrt=[0],
               device=device)


def test_binary_cross_entropy_stable_and_shape_error(device):
    x = np.array([-500.0, 500.0])
    got = F.binary_cross_entropy(_t(x, device), _t(np.array([1.0, 0.0]), device),
                                 reduction="none").numpy()
    np.testing.assert_allclose(got, [500.0, 500.0])
    with pytest.raises(ValueError, match=r"binary_cross_entropy: pred shape \(2,\)"):
        F.binary_cross_entropy(_t(x, device), _t(np.zeros(3), device))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_l1_and_square_loss(reduction, device, rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np.testing.assert_allclose(F.l1_loss(_t(a, device), _t(b, device), reduction).numpy(),
                               _red(np.abs(a - b), reduction), rtol=1e-12)
    np.testing.assert_allclose(F.square_loss(_t(a, device), _t(b, device), reduction).numpy(),
                               _red((a - b) ** 2, reduction), rtol=1e-12)
    assert F.mse_loss is F.square_loss
    check_grad(lambda a, b: F.l1_loss(a, b, reduction), a, b, device=device)
    check_grad(lambda a, b: F.square_loss(a, b, reduction), a, b, device=device)



@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5), ()])
def test_square_loss_node_is_bitwise_the_composition(reduction, dtype, shape, device, rng):
    """square_loss is one node; its loss and both gradients equal, bit for bit, those of the
    composition ``((pred - label) * (pred - label)).mean()`` (or ``.sum()``) it replaces. On a
    GPU the loss is one kernel whose sum runs in its own order: equal there to rounding."""
    a, b = rng.standard_normal(shape) * 3, rng.standard_normal(shape)
    results = []
    for fused in (True, False):
        pa, pb = (mg.Parameter(x.astype(dtype), device=device) for x in (a, b))
        gm = mg.GradManager().attach([pa, pb])
        with gm:
            if fused:
                loss = F.square_loss(pa, pb, reduction)
            else:
                d = pa - pb
                loss = _red(d * d, reduction)
            gm.backward(loss * 1.7)
        results.append([loss.numpy(), pa.grad.numpy(), pb.grad.numpy()])
    for k, (got, want) in enumerate(zip(*results)):
        assert got.dtype == want.dtype and got.shape == want.shape
        if k == 0 and not device.startswith("cpu"):
            np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-14)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cross_entropy_node_is_bitwise_the_composition(reduction, dtype, device, rng):
    """The (N, C) cross entropy is one node: its loss equals, bit for bit, the composition
    ``-indexing_one_hot(logsoftmax(x), y)`` reduced, and its gradient is ``softmax(x) -
    one_hot(y)`` scaled by the upstream gradient (divided by N for the mean), from the bits of
    ``F.softmax``. On a GPU one kernel each way: equal there to rounding."""
    x = (rng.standard_normal((37, 11)) * 4).astype(dtype)
    y = rng.integers(0, 11, 37).astype(np.int32)
    p, label = mg.Parameter(x, device=device), _t(y, device, "int32")
    gm = mg.GradManager().attach(p)
    with gm:
        loss = F.cross_entropy(p, label, reduction=reduction)
        gm.backward(loss)
    composed = _red(-F.indexing_one_hot(F.logsoftmax(_t(x, device, dtype), 1), label, 1),
                    reduction)
    want_grad = F.softmax(_t(x, device, dtype), 1).numpy()
    want_grad[np.arange(37), y] -= 1
    if reduction == "mean":
        want_grad *= np.asarray(1, dtype) / 37
    exact = device.startswith("cpu")
    for got, want in ((loss.numpy(), composed.numpy()), (p.grad.numpy(), want_grad)):
        assert got.dtype == want.dtype and got.shape == want.shape
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                       atol=1e-7 if dtype == "float32" else 1e-15)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_square_loss_is_twice_differentiable(reduction, device, rng, double_grad):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    double_grad(lambda a, b: F.square_loss(a, b, reduction) * F.square_loss(a, b, reduction),
                a, b, device=device)

def test_topk_accuracy(device, rng):
    logits = rng.standard_normal((50, 7))
    target = rng.integers(0, 7, 50).astype(np.int32)
    ranks = [(np.argsort(-row) == t).nonzero()[0][0] for row, t in zip(logits, target, strict=True)]
    ranks = np.array(ranks)
    acc1, acc3 = F.topk_accuracy(_t(logits, device), _t(target, device, "int32"), (1, 3))
    assert acc1.dtype == np.float32
    np.testing.assert_allclose(acc1.item(), (ranks < 1).mean(), rtol=1e-6)
    np.testing.assert_allclose(acc3.item(), (ranks < 3).mean(), rtol=1e-6)
    single = F.topk_accuracy(_t(logits, device), _t(target, device, "int32"))
    np.testing.assert_allclose(single.item(), (ranks < 1).mean(), rtol=1e-6)
    with pytest.raises(ValueError, match="topk_accuracy: k=8"):
        F.topk_accuracy(_t(logits, device), _t(target, device, "int32"), 8)


def test_losses_against_torch(rng, device):
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x = rng.standard_normal((5, 4))
    y = rng.integers(0, 4, 5)
    np.testing.assert_allclose(
        F.cross_entropy(_t(x, device), _t(y, device, "int32"), label_smooth=0.2).numpy(),
        tf.cross_entropy(torch.tensor(x), torch.tensor(y), label_smoothing=0.2).numpy(),
        rtol=1e-10)
    t = rng.random((5, 4))
    np.testing.assert_allclose(
        F.binary_cross_entropy(_t(x, device), _t(t, device)).numpy(),
        tf.binary_cross_entropy_with_logits(torch.tensor(x), torch.tensor(t)).numpy(), rtol=1e-10)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_second_order(reduction, device, rng, double_grad):
    # the fused (N, C) logits path has its own backward; its recorded form must match too
    y = _t(rng.integers(0, 4, 5).astype(np.int32), device, "int32")
    double_grad(lambda x: F.cross_entropy(x, y, reduction=reduction),
                rng.standard_normal((5, 4)), device=device)
