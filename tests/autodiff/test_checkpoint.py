"""``ad.checkpoint``: gradients bitwise those without checkpointing (dropout included), internals
not kept, parameters reached, and every backward mode supported."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
from minigrad.backend.device import as_device


def _params(seed=0, device="cpu0"):
    rng = np.random.default_rng(seed)
    shapes = ((6, 4), (6,), (4, 6), (4,), (2, 4))
    return [mg.Parameter(rng.standard_normal(s), device=device) for s in shapes]


def _block(h, w1, b1, w2, b2):
    """A residual MLP block with dropout: its parameters are used only inside."""
    return h + F.linear(F.nn.dropout(F.gelu(F.linear(h, w1, b1)), 0.3), w2, b2)


def _model(x, params, use_checkpoint, calls=None):
    w1, b1, w2, b2, head = params

    def block(h):
        if calls is not None:
            calls.append(1)
        return _block(h, w1, b1, w2, b2)

    h = F.tanh(x)
    for _ in range(2):
        h = ad.checkpoint(block, h) if use_checkpoint else block(h)
    return (F.linear(h, head) ** 2).mean()


def _grads(use_checkpoint, backward=None, seed=0, device="cpu0"):
    params = _params(device=device)
    x = mg.tensor(np.random.default_rng(5).standard_normal((3, 4)), device=device)
    gm = ad.GradManager().attach([x, *params])
    mg.random.seed(seed)
    calls = []
    with gm:
        loss = _model(x, params, use_checkpoint, calls)
        (backward or gm.backward)(gm, loss) if backward else gm.backward(loss)
    with as_device(device).context():  # a GPU generator draws on its own GPU
        after = mg.random.get_rng(device).random(4)  # the generator's stream is not disturbed
    after = after.get() if hasattr(after, "get") else after
    return [x.grad.numpy(), *(p.grad.numpy() for p in params)], loss.item(), len(calls), after


def test_gradients_with_dropout_are_bitwise_those_without_checkpointing(device):
    ref, ref_loss, ref_calls, ref_after = _grads(False, device=device)
    got, loss, calls, after = _grads(True, device=device)
    assert loss == ref_loss
    for g, r in zip(got, ref):
        assert np.array_equal(g, r)
    assert ref_calls == 2 and calls == 4  # each block ran once more, during backward
    assert np.array_equal(after, ref_after)


def test_checkpointed_function_keeps_no_intermediate_buffers():
    params = _params()
    x = mg.tensor(np.ones((3, 4)))
    gm = ad.GradManager().attach(params)
    inner = []

    def block(h):
        a = F.exp(h)
        inner.append(a)
        return _block(a, *params[:4])

    with gm:
        y = ad.checkpoint(block, x)
        assert not inner[0]._node.__dict__ and inner[0]._node._edges is None  # freed at once
        node = y._node
        assert type(node).__name__ == "_Checkpoint"
        assert len(node._edges) == 5  # x, then the four parameters block used
        gm.backward(y.sum())
    assert all(p.grad is not None for p in params[:4]) and params[4].grad is None


def test_several_inputs_and_outputs_and_non_tensor_arguments():
    rng = np.random.default_rng(3)
    a_np, b_np = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    w = mg.Parameter(rng.standard_normal((3,)))

    def fn(a, b, scale):
        s = F.sin(a * w) * b
        return s * scale, (s + b).sum(1)

    results = []
    for use in (False, True):
        a, b = mg.tensor(a_np), mg.tensor(b_np)
        gm = ad.GradManager().attach([a, b, w])
        w.grad = None
        with gm:
            out1, out2 = ad.checkpoint(fn, a, b, 2.0) if use else fn(a, b, 2.0)
            gm.backward([out1.sum(), out2[0]])  # out2[1] gets no gradient
        results.append([a.grad.numpy(), b.grad.numpy(), w.grad.numpy()])
    for g, r in zip(results[1], results[0]):
        assert np.array_equal(g, r)


def test_checkpoint_in_multi_and_split_backward():
    ref, *_ = _grads(False)

    def multi(gm, loss):
        gm.backward(loss, release=False)

    got, *_ = _grads(True, multi)
    for g, r in zip(got, ref):
        assert np.array_equal(g, r)

    params = _params()
    x = mg.tensor(np.random.default_rng(5).standard_normal((3, 4)))
    gm = ad.GradManager().attach(params)
    ad.GradManager().attach(x)
    mg.random.seed(0)
    with gm:
        handle = gm.backward_input(_model(x, params, True), inputs=[x])
        gm.backward_weight(handle)
    assert np.array_equal(handle.input_grads[0].numpy(), ref[0])
    for p, r in zip(params, ref[1:]):
        assert np.array_equal(p.grad.numpy(), r)


def test_outside_a_recording_checkpoint_just_calls_fn():
    assert ad.checkpoint(lambda a, b: a + b, 2, 3) == 5


def test_checkpoint_errors():
    w = mg.Parameter([1.0, 2.0])
    gm = ad.GradManager().attach(w)
    with gm:
        outside = w * 3.0
        with pytest.raises(ValueError, match="uses a tensor computed outside it that needs a "
                           "gradient; pass that tensor as an argument"):
            ad.checkpoint(lambda h: h * outside, w)
        with pytest.raises(TypeError, match="must return a Tensor or a tuple/list of Tensors, "
                           "got float"):
            ad.checkpoint(lambda h: 1.0, w)
    gm1, gm2 = ad.GradManager().attach(w), ad.GradManager().attach(w)
    with gm1:
        with gm2:
            y = ad.checkpoint(lambda h: F.sin(h), w).sum()
            with pytest.raises(NotImplementedError, match="higher-order gradients through a "
                               "checkpointed function are not supported"):
                gm2.backward(y)
