"""Split backward (zero-bubble pipelines): ``backward_input`` then ``backward_weight`` must give
bitwise the gradients of one ordinary ``backward``, computing only what each pass needs."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F


def _p(rng, *shape, scale=0.5):
    return mg.Parameter(rng.standard_normal(shape) * scale)  # float64


def mlp():
    rng = np.random.default_rng(0)
    params = [_p(rng, 16, 8), _p(rng, 16), _p(rng, 5, 16), _p(rng, 5)]
    labels = mg.tensor(rng.integers(0, 5, 6))

    def loss(x, w1, b1, w2, b2):
        h = F.tanh(F.linear(x, w1, b1))
        return F.nn.cross_entropy(F.linear(h, w2, b2), labels) + (w1 * w1).sum() * 1e-3

    return loss, params, rng.standard_normal((6, 8))


def conv_net():
    rng = np.random.default_rng(1)
    params = [_p(rng, 4, 3, 3, 3), _p(rng, 4), _p(rng, 2, 4 * 3 * 3), _p(rng, 2)]

    def loss(x, wc, bc, wl, bl):
        h = F.max_pool2d(F.relu(F.conv2d(x, wc, bc, padding=1)), 2)
        return (F.linear(F.flatten(h, 1), wl, bl) ** 2).mean()

    return loss, params, rng.standard_normal((2, 3, 6, 6))


def attention():
    rng = np.random.default_rng(2)
    e = 8
    params = [_p(rng, 3 * e, e), _p(rng, 3 * e), _p(rng, e, e), _p(rng, e), _p(rng, e), _p(rng, e)]

    def loss(x, w_in, b_in, w_out, b_out, g, b):
        h = F.multi_head_attention(x, x, x, 2, w_in, b_in, w_out, b_out, is_causal=True)
        h = F.layer_norm(h + x, e, weight=g, bias=b)
        return (h * h).sum()

    return loss, params, rng.standard_normal((2, 5, e))


MODELS = [mlp, conv_net, attention]


def _reference(model):
    loss_fn, params, x_np = model()
    x = mg.tensor(x_np)
    gm = ad.GradManager().attach([x, *params])
    with gm:
        gm.backward(loss_fn(x, *params))
    return x.grad.numpy(), [p.grad.numpy() for p in params]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_input_then_weight_pass_is_bitwise_one_backward(model):
    dx_ref, dparams_ref = _reference(model)
    loss_fn, params, x_np = model()
    x = mg.tensor(x_np)
    gm = ad.GradManager().attach(params)
    ad.GradManager().attach(x)  # x needs a gradient, but gm accumulates only the parameters
    with gm:
        handle = gm.backward_input(loss_fn(x, *params), inputs=[x])
        assert all(p.grad is None for p in params)  # nothing reached the weights yet
        (dx,) = handle.input_grads
        assert np.array_equal(dx.numpy(), dx_ref)
        gm.backward_weight(handle)
        assert gm.is_recording  # split passes never release the recording
    assert x.grad is None  # an input's gradient is returned, not accumulated
    for p, ref in zip(params, dparams_ref):
        assert np.array_equal(p.grad.numpy(), ref)


def test_interleaved_micro_batches_equal_gradient_accumulation():
    """Forward 3 micro-batches, then input passes and weight passes in a zero-bubble-like order:
    equal to accumulating the ordinary backward of each micro-batch."""
    loss_fn, params, _ = mlp()
    xs = [np.random.default_rng(10 + i).standard_normal((6, 8)) for i in range(3)]
    ref_gm = ad.GradManager().attach(params)
    for x_np in xs:
        with ref_gm:
            ref_gm.backward(loss_fn(mg.tensor(x_np), *params))
    refs = [p.grad.numpy() for p in params]
    for p in params:
        p.grad = None

    gm = ad.GradManager().attach(params)
    inputs = [mg.tensor(x_np) for x_np in xs]
    ad.GradManager().attach(inputs)
    with gm:
        losses = [loss_fn(x, *params) for x in inputs]
        h2 = gm.backward_input(losses[2], inputs=[inputs[2]])
        h0 = gm.backward_input(losses[0], inputs=[inputs[0]])
        gm.backward_weight(h2)
        h1 = gm.backward_input(losses[1], inputs=[inputs[1]])
        gm.backward_weight(h1)
        gm.backward_weight(h0)
    for p, ref in zip(params, refs):
        np.testing.assert_allclose(p.grad.numpy(), ref, rtol=1e-12)


class _Mul(ad.Function):
    """x * w that logs which input gradients each backward call was asked for."""

    asked: list = []

    def forward(self, x, w):
        self.x, self.w = x, w
        return x._data * w._data

    def backward(self, dy):
        need = (self.needs_input_grad(0), self.needs_input_grad(1))
        _Mul.asked.append(need)
        return (dy * self.w if need[0] else None), (dy * self.x if need[1] else None)


def test_each_pass_asks_only_for_the_gradients_it_needs():
    _Mul.asked = []
    w1, w2 = mg.Parameter([2.0, 3.0]), mg.Parameter([5.0, 7.0])
    x = mg.tensor([1.0, -1.0])
    gm = ad.GradManager().attach([w1, w2])
    ad.GradManager().attach(x)
    with gm:
        y = _Mul()(_Mul()(x, w1), w2).sum()
        handle = gm.backward_input(y, inputs=[x])
        assert _Mul.asked == [(True, False), (True, False)]
        _Mul.asked = []
        gm.backward_weight(handle)
        assert _Mul.asked == [(False, True), (False, True)]
    np.testing.assert_array_equal(handle.input_grads[0].numpy(), [10.0, 21.0])
    np.testing.assert_array_equal(w1.grad.numpy(), [5.0, -7.0])
    np.testing.assert_array_equal(w2.grad.numpy(), [2.0, -3.0])


def test_weight_pass_fires_callbacks_and_after_backward_hooks():
    order = []
    w = mg.Parameter([1.0, 2.0])
    x = mg.tensor([3.0, 4.0])
    gm = ad.GradManager().attach(w, callbacks=lambda t, g: order.append("cb") or g * 10)
    ad.GradManager().attach(x)
    with gm:
        y = (x * w).sum()
        gm.register_after_backward_callback(lambda: order.append("after"))
        handle = gm.backward_input(y, inputs=[x])
        assert order == []  # no attached tensor is final after the input pass
        gm.backward_weight(handle)
    assert order == ["cb", "after"]
    np.testing.assert_array_equal(w.grad.numpy(), [30.0, 40.0])


def test_gradients_stop_at_a_non_leaf_input():
    """An input produced by recorded ops: its gradient is returned and nothing behind it is
    touched, so a later backward can carry it on (a pipeline stage's received activation)."""
    w0, w1 = mg.Parameter([2.0]), mg.Parameter([3.0])
    gm = ad.GradManager().attach([w0, w1])
    with gm:
        h = w0 * 4.0  # "the previous stage"
        y = (h * w1) ** 2
        handle = gm.backward_input(y, inputs=[h])
        gm.backward_weight(handle)
        assert w0.grad is None and h._node.__dict__  # h's producer untouched, still alive
        np.testing.assert_array_equal(w1.grad.numpy(), [2 * 24.0 * 8.0])
        gm.backward(h, handle.input_grads[0])
    np.testing.assert_array_equal(handle.input_grads[0].numpy(), [2 * 24.0 * 3.0])
    np.testing.assert_array_equal(w0.grad.numpy(), [2 * 24.0 * 3.0 * 4.0])


def test_loss_terms_without_the_input_go_to_the_weight_pass():
    w = mg.Parameter([1.5])
    x = mg.tensor([2.0])
    gm = ad.GradManager().attach(w)
    ad.GradManager().attach(x)
    with gm:
        reg = (w * w).sum()  # does not depend on x
        handle = gm.backward_input([(x * w).sum(), reg], inputs=[x])
        gm.backward_weight(handle)
    np.testing.assert_array_equal(handle.input_grads[0].numpy(), [1.5])
    np.testing.assert_array_equal(w.grad.numpy(), [2.0 + 3.0])


def test_split_backward_errors():
    w = mg.Parameter([1.0])
    x = mg.tensor([2.0])
    gm, other = ad.GradManager().attach(w), ad.GradManager()
    with pytest.raises(RuntimeError, match="backward_input: the manager is not recording"):
        gm.backward_input((w * 2).sum(), inputs=[x])
    with gm:
        with pytest.raises(ValueError, match=r"inputs\[0\] \(tensor of shape \(1,\) and dtype "
                           r"float32\) cannot receive a gradient"):
            gm.backward_input((w * x).sum(), inputs=[x])
        ad.GradManager().attach(x)
        handle = gm.backward_input((w * 2).sum(), inputs=[x])
        assert handle.input_grads == (None,)  # x needs a gradient but y does not depend on it
        with pytest.raises(ValueError, match="handle returned by this manager"):
            other.backward_weight(handle)
        gm.backward_weight(handle)
        with pytest.raises(RuntimeError, match="weight pass already ran"):
            gm.backward_weight(handle)
        pending = gm.backward_input((w * 3).sum(), inputs=[])
    with gm:
        with pytest.raises(RuntimeError, match="recording of this handle's backward_input has"):
            gm.backward_weight(pending)
    with pytest.raises(TypeError, match="inputs must be Tensors"):
        with gm:
            gm.backward_input((w * 3).sum(), inputs=[np.ones(1)])


def test_a_graph_split_backward_consumed_cannot_be_back_propagated_again():
    w = mg.Parameter([1.0])
    x = mg.tensor([2.0])
    gm = ad.GradManager().attach(w)
    ad.GradManager().attach(x)
    with gm:
        y = (x * w).sum()
        gm.backward_weight(gm.backward_input(y, inputs=[x]))
        with pytest.raises(RuntimeError, match="already back-propagated"):
            gm.backward(y)
