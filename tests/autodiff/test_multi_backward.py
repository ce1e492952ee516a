"""Per-graph liveness and several backwards per recording (``release=False``), the way a 1F1B
pipeline keeps several micro-batch graphs alive and back-propagates them out of order."""

import gc

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F


def _mlp_params(seed=0):
    rng = np.random.default_rng(seed)
    return [mg.Parameter(rng.standard_normal(s)) for s in ((8, 4), (8,), (3, 8), (3,))]


def _loss(x, w1, b1, w2, b2):
    return (F.linear(F.tanh(F.linear(x, w1, b1)), w2, b2) ** 2).mean()


def test_micro_batches_back_propagated_out_of_order_equal_accumulation():
    params = _mlp_params()
    xs = [mg.tensor(np.random.default_rng(i).standard_normal((5, 4))) for i in range(4)]
    gm = ad.GradManager().attach(params)
    for x in xs:  # reference: one recording per micro-batch
        with gm:
            gm.backward(_loss(x, *params))
    refs = [p.grad.numpy() for p in params]
    for p in params:
        p.grad = None
    with gm:
        losses = [_loss(x, *params) for x in xs]  # four graphs alive at once
        for i in (2, 0, 3):
            gm.backward(losses[i], release=False)
            assert gm.is_recording
        gm.backward(losses[1])  # the default releases
        assert not gm.is_recording
    for p, ref in zip(params, refs):
        np.testing.assert_allclose(p.grad.numpy(), ref, rtol=1e-12)


def test_a_backward_frees_only_its_own_graph():
    w = mg.Parameter(np.ones(3))
    gm = ad.GradManager().attach(w)
    with gm:
        a, b = F.exp(w * 2.0), F.exp(w * 3.0)
        node_a, node_b = a._node, b._node
        gm.backward(a.sum(), release=False)
        assert not node_a.__dict__ and node_a._edges is None  # a's buffers freed
        assert node_b.__dict__ and node_b._edges is not None  # b's graph untouched
        assert b.requires_grad
        gm.backward(b.sum())
    np.testing.assert_allclose(w.grad.numpy(), 2 * np.exp(2.0) + 3 * np.exp(3.0))


def test_backward_through_a_consumed_graph_raises():
    w = mg.Parameter(np.ones(2))
    gm = ad.GradManager().attach(w)
    with gm:
        h = F.exp(w)
        y = h.sum()
        gm.backward(y, release=False)
        with pytest.raises(RuntimeError, match=r"graph of tensor of shape \(\) and dtype float64 "
                           "was already back-propagated"):
            gm.backward(y, release=False)
        z = (h * 2.0).sum()  # a new graph that reuses a consumed one
        with pytest.raises(RuntimeError, match="Exp node that an earlier backward already"):
            gm.backward(z)


def test_backward_on_a_graph_whose_recording_ended_raises_naming_the_tensor():
    w = mg.Parameter(np.ones(2, np.float32))
    gm = ad.GradManager().attach(w)
    with gm:
        y = (w * 2.0).sum()
        y.name = "loss"
    with gm:
        with pytest.raises(RuntimeError, match=r"tensor 'loss' of shape \(\) and dtype float32 "
                           "belongs to a graph whose recording has ended"):
            gm.backward(y)
    with gm:  # a y that never depended on anything recorded still gives no gradient
        gm.backward(mg.tensor([1.0, 2.0]).sum())
    assert w.grad is None


def test_old_graph_from_an_ended_recording_is_a_constant():
    w = mg.Parameter(np.array([2.0]))
    gm = ad.GradManager().attach(w)
    with gm:
        old = w * w
    assert not old.requires_grad
    with gm:
        gm.backward(old * w)  # d(old * w)/dw with old constant
    np.testing.assert_array_equal(w.grad.numpy(), [4.0])


def test_callbacks_and_after_backward_run_on_every_backward():
    w = mg.Parameter(np.array([1.0, 2.0]))
    calls, flushes = [], []
    gm = ad.GradManager().attach(w, callbacks=lambda t, g: calls.append(g.numpy()) or g)
    with gm:
        y1, y2 = (w * 3.0).sum(), (w * w).sum()
        gm.register_after_backward_callback(lambda: flushes.append(1))
        gm.backward(y1, release=False)
        gm.register_after_backward_callback(lambda: flushes.append(2))
        gm.backward(y2, release=False)
    assert flushes == [1, 2]  # each registered callback runs once, after the next backward
    np.testing.assert_array_equal(calls[0], [3.0, 3.0])
    np.testing.assert_array_equal(calls[1], [2.0, 4.0])
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 7.0])


def test_extra_roots_join_only_backwards_that_release_or_have_no_y():
    """``add_backward_root`` (remote_send's token): a releasing backward must pull every pending
    root; a ``release=False`` backward of an explicit y leaves other micro-batches' roots alone."""
    w = mg.Parameter(np.array([1.0]))
    gm = ad.GradManager().attach(w)
    with gm:
        tokens = [(w * float(k)).sum() for k in (1, 2, 3)]
        for t in tokens:
            gm.add_backward_root(t)
        gm.backward(tokens[1], release=False)
        np.testing.assert_array_equal(w.grad.numpy(), [2.0])
        gm.backward()  # no y: every pending root
    np.testing.assert_array_equal(w.grad.numpy(), [2.0 + 1.0 + 3.0])
    with pytest.raises(RuntimeError, match="add_backward_root: the manager is not recording"):
        gm.add_backward_root(tokens[0])


def test_tensor_backward_uses_the_innermost_manager_that_recorded_it():
    x = mg.Parameter(np.array([0.5, 1.0]))
    gm = ad.GradManager().attach(x)
    with gm:
        y = F.sin(x).sum()
        y.backward()
        assert not gm.is_recording  # like gm.backward(y): releases
    np.testing.assert_allclose(x.grad.numpy(), np.cos([0.5, 1.0]), rtol=1e-12)
    outer, inner = ad.GradManager().attach(x), ad.GradManager().attach(x)
    x.grad = None
    with outer:
        with inner:
            z = (x * x).sum()
            z.backward(mg.tensor(3.0, dtype="float64"))
            assert not inner.is_recording and outer.is_recording
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 6.0])
    with pytest.raises(RuntimeError, match=r"Tensor.backward: this tensor \(shape \(\), dtype "
                       "float64\\) was not produced by an op recorded by a GradManager"):
        z.backward()


def test_grad_manager_repr():
    w1, w2 = mg.Parameter([1.0]), mg.Parameter([2.0])

    def allreduce_cb(t, g):
        return g

    gm = ad.GradManager().attach([w1, w2], callbacks=[allreduce_cb])
    assert repr(gm) == "GradManager(attached=2, recording=False, callbacks=['" + \
        allreduce_cb.__qualname__ + "'])"
    with gm:
        assert "recording=True" in repr(gm)
    del w1
    gc.collect()
    assert repr(gm).startswith("GradManager(attached=1,")


def test_function_backward_returning_a_non_tensor_raises_naming_the_function():
    class Bad(ad.Function):
        def forward(self, x):
            return x._data * 2

        def backward(self, dy):
            return 2.0  # a Python number is not a gradient

    w = mg.Parameter([1.0])
    gm = ad.GradManager().attach(w)
    with gm:
        with pytest.raises(TypeError, match="Bad.backward must return a Tensor, an array or None "
                           "for each input; got float for input 0"):
            gm.backward(Bad()(w).sum())
