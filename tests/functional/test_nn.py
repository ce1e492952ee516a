"""F.nn: linear, activations, softmax family, dropout, embedding and one_hot against NumPy float64
references written here, plus finite-difference gradient checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad

_erf = np.vectorize(math.erf)


def _t(a, device, dtype="float64"):
    return mg.tensor(a, dtype=dtype, device=device)


def test_every_public_name_is_reachable_both_ways():
    for name in F.nn.__all__:
        assert getattr(F, name) is getattr(F.nn, name), name


# --------------------------------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("xshape", [(5, 4), (2, 3, 4), (4,)])
def test_linear(xshape, device, rng):
    x = rng.standard_normal(xshape)
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal(3)
    got = F.linear(_t(x, device), _t(w, device), _t(b, device)).numpy()
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-12)
    check_grad(lambda x, w, b: F.linear(x, w, b), x, w, b, device=device)
    check_grad(lambda x, w: F.linear(x, w), x, w, device=device)


def test_linear_unfused_bias_and_partial_grads(device, rng):
    x = rng.standard_normal((5, 4))
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal((1, 3))  # not (out,): added by broadcasting instead of in place
    got = F.linear(_t(x, device), _t(w, device), _t(b, device)).numpy()
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-12)
    check_grad(lambda x, w, b: F.linear(x, w, b), x, w, b, device=device)
    check_grad(lambda x, w, b: F.linear(x, w, b), x, w, b[0], device=device, wrt=[1, 2])
    check_grad(lambda x, w, b: F.linear(x, w, b), x, w, b[0], device=device, wrt=[0])


def test_linear_second_order(device, rng, double_grad):
    # linear(x, w) is bilinear: the recorded backward must carry the x-w cross term
    double_grad(lambda x, w, b: F.linear(x, w, b) * F.linear(x, w, b), rng.standard_normal((5, 4)),
                rng.standard_normal((3, 4)), rng.standard_normal(3), device=device)



@pytest.mark.parametrize("xshape", [(2, 3, 4), (4,), (2, 1, 3, 4)])
def test_linear_of_any_rank_is_one_node_and_bitwise_the_2d_product(xshape, device, rng):
    """A non-2-D input is flattened inside the Linear node (no reshape nodes each way): the node's
    first edge is the input itself, and output and gradients equal bit for bit those of the
    2-D product between explicit reshapes."""
    x, w, b = rng.standard_normal(xshape), rng.standard_normal((3, 4)), rng.standard_normal(3)
    results = []
    for one_node in (True, False):
        xt, wt, bt = (mg.Parameter(a.astype("float32"), device=device) for a in (x, w, b))
        gm = mg.GradManager().attach([xt, wt, bt])
        with gm:
            if one_node:
                y = F.linear(xt, wt, bt)
                assert type(y._node).__name__ == "Linear" and y._node._edges[0][0] is xt
            else:
                y = F.reshape(F.linear(F.reshape(xt, (-1, 4)), wt, bt), xshape[:-1] + (3,))
            gm.backward((y * y).sum())
        results.append([y.numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()])
    for got, want in zip(*results):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_linear_of_a_3d_input_second_order(device, rng, double_grad):
    double_grad(lambda x, w, b: F.linear(x, w, b) * F.linear(x, w, b),
                rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4)),
                rng.standard_normal(3), device=device)

def test_linear_error_names_shapes(device):
    with pytest.raises(ValueError, match=r"linear: .*\(2, 5\).*\(3, 4\)"):
        F.linear(_t(np.zeros((2, 5)), device), _t(np.zeros((3, 4)), device))


# --------------------------------------------------------------------------------------------------
# activations

ACTIVATIONS = {
    "relu": (F.relu, lambda x: np.maximum(x, 0)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    "relu6": (F.relu6, lambda x: np.clip(x, 0, 6)),
    "gelu": (F.gelu, lambda x: x * 0.5 * (1 + _erf(x / math.sqrt(2)))),
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x))),
    "softplus": (F.softplus, lambda x: np.logaddexp(0.0, x)),
    "sigmoid": (F.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "hsigmoid": (F.hsigmoid, lambda x: np.clip(x + 3, 0, 6) / 6),
    "hswish": (F.hswish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation(name, device, rng):
    fn, ref = ACTIVATIONS[name]
    x = rng.standard_normal((3, 7)) * 4
    x = x[np.abs(np.abs(x) - 3) > 1e-3].reshape(-1)  # keep clear of the kinks at 0, +-3, 6
    x = x[np.abs(x) > 1e-3]
    x = x[np.abs(x - 6) > 1e-3]
    np.testing.assert_allclose(fn(_t(x, device)).numpy(), ref(x), rtol=1e-10, atol=1e-12)
    check_grad(fn, x, device=device)
    x32 = x.astype(np.float32)
    out32 = fn(mg.tensor(x32, device=device))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32.numpy(), ref(x), rtol=1e-5, atol=1e-6)


def test_softplus_is_stable_for_large_inputs(device):
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0])
    np.testing.assert_allclose(F.softplus(_t(x, device)).numpy(), np.logaddexp(0.0, x))


# --------------------------------------------------------------------------------------------------
# softmax family


def _ref_logsoftmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("shape,axis", [((4, 5), None), ((2, 3, 4), 1), ((3, 1), -1), ((6,), 0)])
def test_softmax_and_logsoftmax(shape, axis, device, rng):
    x = rng.standard_normal(shape) * 3
    ax = -1 if axis is None else axis
    ref = _ref_logsoftmax(x, ax)
    np.testing.assert_allclose(F.logsoftmax(_t(x, device), axis).numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(F.softmax(_t(x, device), axis).numpy(), np.exp(ref), atol=1e-12)
    check_grad(lambda x: F.softmax(x, axis), x, device=device)
    check_grad(lambda x: F.logsoftmax(x, axis), x, device=device)


def test_softmax_large_logits_and_non_contiguous(device, rng):
    x = rng.standard_normal((3, 4)) * 1000
    got = F.softmax(F.transpose(_t(x, device), (1, 0)), axis=0).numpy()
    np.testing.assert_allclose(got, np.exp(_ref_logsoftmax(x.T, 0)), atol=1e-12)
    assert np.isfinite(F.logsoftmax(_t(x, device)).numpy()).all()


@pytest.mark.parametrize("op", [F.softmax, F.logsoftmax])
def test_softmax_second_order(op, device, rng):
    """The backward is made of Tensor ops, so gradients of gradients are right."""
    _check_gradient_is_differentiable(lambda x: op(x, 1), device, rng)


def _check_gradient_is_differentiable(op, device, rng):
    """Finite differences of the recorded gradient x -> d sum(op(x) * w) / dx."""
    x0 = rng.standard_normal((3, 4))
    w = rng.standard_normal((3, 4))

    def grad_of(x):
        gm = mg.GradManager().attach(x)
        with gm:
            gm.backward((op(x) * _t(w, device)).sum())
        g, x.grad = x.grad, None
        return g

    check_grad(grad_of, x0, device=device, rtol=1e-4)


def test_softmax_axis_error(device):
    with pytest.raises(ValueError, match="softmax: axis 2"):
        F.softmax(_t(np.zeros((2, 2)), device), 2)


# --------------------------------------------------------------------------------------------------
# dropout


def test_dropout_statistics_and_scaling(device, rng):
    x = rng.standard_normal((200, 100)) + 5.0
    mg.random.seed(7)
    out = F.dropout(_t(x, device, "float32"), 0.3).numpy()
    assert out.dtype == np.float32
    dropped = out == 0
    assert abs(dropped.mean() - 0.3) < 0.02
    np.testing.assert_allclose(out[~dropped], (x / 0.7)[~dropped], rtol=1e-5)
    mg.random.seed(7)
    again = F.dropout(_t(x, device, "float32"), 0.3).numpy()
    np.testing.assert_array_equal(out, again)  # seeding makes it reproducible


def test_dropout_eval_identity_and_grad(device, rng):
    x = rng.standard_normal((4, 5))
    t = _t(x, device)
    assert F.dropout(t, 0.5, training=False) is t
    np.testing.assert_array_equal(F.dropout(t, 1.0).numpy(), np.zeros_like(x))

    def fn(x):
        mg.random.seed(1)
        return F.dropout(x, 0.4)

    check_grad(fn, x, device=device)
    with pytest.raises(ValueError, match="dropout: drop_prob"):
        F.dropout(t, 1.5)


# --------------------------------------------------------------------------------------------------
# embedding and one_hot


def test_embedding_forward_grad_and_repeated_indices(device, rng):
    w = rng.standard_normal((6, 3))
    idx = np.array([[0, 5, 2], [2, 2, 1]], dtype=np.int32)
    np.testing.assert_array_equal(F.embedding(_t(idx, device, "int32"), _t(w, device)).numpy(),
                                  w[idx])
    check_grad(lambda i, w: F.embedding(i, w), idx, w, device=device)
    wt = _t(w, device)
    gm = mg.GradManager().attach(wt)
    with gm:
        gm.backward(F.embedding(_t(idx, device, "int32"), wt).sum())
    np.testing.assert_array_equal(wt.grad.numpy()[:, 0], [1, 1, 3, 0, 0, 1])


def test_embedding_padding_idx_gets_no_gradient(device, rng):
    w = rng.standard_normal((4, 2))
    idx = _t(np.array([0, 1, 1, 3]), device, "int32")
    wt = _t(w, device)
    gm = mg.GradManager().attach(wt)
    with gm:
        out = F.embedding(idx, wt, padding_idx=1)
        gm.backward(out.sum())
    np.testing.assert_array_equal(out.numpy(), w[[0, 1, 1, 3]])
    np.testing.assert_array_equal(wt.grad.numpy()[:, 0], [1, 0, 0, 1])


def test_embedding_errors(device):
    w = _t(np.zeros((3, 2)), device)
    with pytest.raises(TypeError, match="embedding: indices must be an integer"):
        F.embedding(_t(np.zeros(2), device), w)
    with pytest.raises(IndexError, match=r"embedding: indices must be in \[0, 3\)"):
        F.embedding(_t(np.array([0, 3]), device, "int32"), w).numpy()  # GPU: raised at the read


def test_one_hot(device):
    idx = np.array([[0, 3], [2, 1]])
    got = F.one_hot(_t(idx, device, "int32"), 4)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.numpy(), np.eye(4, dtype=np.int32)[idx])
    with pytest.raises(ValueError, match=r"one_hot: values must be in \[0, 3\)"):
        F.one_hot(_t(idx, device, "int32"), 3).numpy()  # on a GPU: raised when values are read


def test_gelu_float32_fast_path_is_accurate_in_the_tails(device):
    x = np.linspace(-9, 9, 2001)
    ref = x * 0.5 * np.array([math.erfc(-v / math.sqrt(2)) for v in x])
    got = F.gelu(mg.tensor(x.astype(np.float32), device=device)).numpy().astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-30)


@pytest.mark.parametrize("op", [F.gelu, F.silu])
def test_activation_second_order(op, device, rng):
    _check_gradient_is_differentiable(op, device, rng)


def test_prelu_matches_where_and_its_slope_gradient():
    x = np.array([[-2.0, 3.0], [1.0, -0.5]])
    w = np.array([0.3])
    np.testing.assert_allclose(F.prelu(mg.tensor(x), mg.tensor(w)).numpy(),
                               np.where(x > 0, x, 0.3 * x), rtol=1e-12)
    check_grad(lambda a, s: F.prelu(a, s), x, w)
