"""OneFlow's loss modules, CrossEntropyLoss and MSELoss, against NumPy (values and gradients)."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.module as M

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((6, 4))
LABELS = np.array([0, 3, 1, 1, 2, 3], dtype=np.int32)


def _nll(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels], logp


def _loss_and_grad(module, logits, labels):
    x = mg.tensor(logits, dtype="float64")
    gm = ad.GradManager().attach([x])
    with gm:
        loss = module(x, mg.tensor(labels))
        gm.backward(loss.sum())
    return loss.numpy(), x.grad.numpy()


def _numeric_grad(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (fn(x + d) - fn(x - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss_plain(reduction):
    nll, _ = _nll(LOGITS, LABELS)
    want = {"mean": nll.mean(), "sum": nll.sum(), "none": nll}[reduction]
    got, grad = _loss_and_grad(M.CrossEntropyLoss(reduction=reduction), LOGITS, LABELS)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    reduce = {"mean": np.mean, "sum": np.sum, "none": np.sum}[reduction]
    np.testing.assert_allclose(grad, _numeric_grad(lambda z: reduce(_nll(z, LABELS)[0]), LOGITS),
                               rtol=1e-6, atol=1e-8)


def test_cross_entropy_loss_weight_ignore_index_and_smoothing():
    weight = np.array([1.0, 2.0, 0.5, 3.0])
    labels = LABELS.copy()
    labels[2] = -1  # ignored

    def reference(z):
        nll, _ = _nll(z, np.where(labels < 0, 0, labels))
        w = np.where(labels < 0, 0.0, weight[np.where(labels < 0, 0, labels)])
        return (nll * w).sum() / w.sum()

    module = M.CrossEntropyLoss(weight=mg.tensor(weight, dtype="float64"), ignore_index=-1)
    got, grad = _loss_and_grad(module, LOGITS, labels)
    np.testing.assert_allclose(got, reference(LOGITS), rtol=1e-12)
    np.testing.assert_allclose(grad, _numeric_grad(reference, LOGITS), rtol=1e-6, atol=1e-8)
    smooth = M.CrossEntropyLoss(label_smoothing=0.2)
    nll, logp = _nll(LOGITS, LABELS)
    want = (0.8 * nll - 0.2 * logp.mean(axis=1)).mean()
    np.testing.assert_allclose(_loss_and_grad(smooth, LOGITS, LABELS)[0], want, rtol=1e-12)


def test_mse_loss_and_errors():
    pred, target = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 5))
    for reduction, want in (("mean", ((pred - target) ** 2).mean()),
                            ("sum", ((pred - target) ** 2).sum()),
                            ("none", (pred - target) ** 2)):
        got = M.MSELoss(reduction)(mg.tensor(pred, dtype="float64"),
                                   mg.tensor(target, dtype="float64"))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    x = mg.tensor(pred, dtype="float64")
    gm = ad.GradManager().attach([x])
    with gm:
        gm.backward(M.MSELoss()(x, mg.tensor(target, dtype="float64")))
    np.testing.assert_allclose(x.grad.numpy(), 2 * (pred - target) / pred.size, rtol=1e-12)
    with pytest.raises(ValueError, match="MSELoss: reduction must be 'mean', 'sum' or 'none'"):
        M.MSELoss("avg")
    with pytest.raises(ValueError, match="CrossEntropyLoss: reduction must be"):
        M.CrossEntropyLoss(reduction="avg")
    assert repr(M.CrossEntropyLoss()) == "CrossEntropyLoss(ignore_index=-100, reduction='mean')"
