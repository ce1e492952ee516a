"""GradManager semantics (MegEngine's): one test per rule of the issue."""

import gc
import sys

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F


def _x(shape=(4, 3), seed=0, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_readme_example_matches_numpy():
    x_np = _x()
    x = mg.tensor(x_np, dtype="float32")
    w = mg.Parameter(np.zeros((3, 2), dtype="float32"))
    gm = ad.GradManager().attach([w], callbacks=[lambda p, g: g * 0.5])
    with gm:
        y = F.relu(F.matmul(x, w) + 1.0).sum()
        gm.backward(y)
    # relu'(1) = 1 everywhere, so dy/dw[i, j] = sum_n x[n, i]
    expect = 0.5 * np.repeat(x_np.sum(0)[:, None], 2, axis=1)
    np.testing.assert_allclose(w.grad.numpy(), expect, rtol=1e-6)
    assert y.item() == pytest.approx(8.0)
    assert not gm.is_recording


def test_callbacks_chain_in_attach_order_and_attach_again_appends():
    w = mg.Parameter(np.ones(3, dtype="float32"))
    seen = []

    def cb1(t, g):
        seen.append(("cb1", g.numpy().copy()))
        return g * 2

    def cb2(t, g):
        seen.append(("cb2", g.numpy().copy()))
        return g + 1

    gm = ad.GradManager().attach([w], callbacks=[cb1])
    assert gm.attach(w, callbacks=cb2) is gm
    with gm:
        gm.backward((w * 3).sum())
    assert [name for name, _ in seen] == ["cb1", "cb2"]
    np.testing.assert_allclose(seen[1][1], [6, 6, 6])
    np.testing.assert_allclose(w.grad.numpy(), [7, 7, 7])


def test_callback_fires_as_soon_as_gradient_is_final():
    """w2's gradient is final before the backward through the first layer runs: its callback must
    fire before w1's (this ordering is what lets all-reduce overlap backward)."""
    x = mg.tensor(_x((2, 3)))
    w1 = mg.Parameter(_x((3, 3), 1))
    w2 = mg.Parameter(_x((3, 1), 2))
    order = []
    gm = ad.GradManager()
    gm.attach([w1], callbacks=[lambda t, g: order.append("w1") or g])
    gm.attach([w2], callbacks=[lambda t, g: order.append("w2") or g])
    with gm:
        gm.backward(F.matmul(F.tanh(F.matmul(x, w1)), w2).sum())
    assert order == ["w2", "w1"]


def test_gradients_accumulate_until_cleared():
    w = mg.Parameter(np.array([1.0, 2.0], dtype="float32"))
    gm = ad.GradManager().attach([w])
    for _ in range(3):
        with gm:
            gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), 3 * 2 * np.array([1.0, 2.0]))
    w.grad = None
    with gm:
        gm.backward((w * w).sum())
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0])


def test_backward_releases_and_second_backward_raises():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    gm = ad.GradManager().attach([w])
    with gm:
        y = (w * 2).sum()
        gm.backward(y)
        assert not gm.is_recording
        with pytest.raises(RuntimeError, match="already called"):
            gm.backward(y)
    z = w * 2  # after release not recorded for gm (recorded by eager autograd, PyTorch's rule)
    w.grad = None
    with gm:
        gm.backward((z * w).sum())
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2])  # z is a constant for gm


def test_backward_outside_recording_raises():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    with pytest.raises(RuntimeError, match="not recording"):
        ad.GradManager().attach([w]).backward((w * 2).sum())


def test_release_without_backward_stops_recording():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    gm = ad.GradManager().attach([w])
    gm.record()
    y = w * 2
    assert y.requires_grad
    gm.release()
    z = w * 2  # not recorded for gm once released (eager autograd records it, PyTorch's rule)
    assert not y.requires_grad  # the old graph is dead
    assert w.grad is None
    with gm:
        gm.backward((z * w).sum())
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2])  # z is a constant for gm


def test_unattached_and_unused_tensors_keep_grad_none():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    unused = mg.Parameter(np.ones(2, dtype="float32"))
    other = mg.Parameter(np.ones(2, dtype="float32"))  # used but not attached
    gm = ad.GradManager().attach([w, unused])
    with gm:
        gm.backward((w * other).sum())
    np.testing.assert_allclose(w.grad.numpy(), [1, 1])
    assert unused.grad is None
    assert other.grad is None


def test_attach_rejects_integer_tensor():
    with pytest.raises(TypeError, match="int32"):
        ad.GradManager().attach([mg.tensor([1, 2, 3])])


def test_attached_tensors_are_held_weakly():
    gm = ad.GradManager()
    w = mg.Parameter(np.ones(2, dtype="float32"))
    gm.attach([w])
    assert len(gm.attached_tensors()) == 1
    del w
    gc.collect()
    assert gm.attached_tensors() == []


def test_dy_defaults_to_ones_and_can_be_given():
    w = mg.Parameter(np.array([1.0, 2.0, 3.0], dtype="float32"))
    gm = ad.GradManager().attach([w])
    with gm:
        gm.backward(w * w)
    np.testing.assert_allclose(w.grad.numpy(), [2, 4, 6])
    w.grad = None
    with gm:
        gm.backward(w * w, dy=mg.tensor([1.0, 0.0, -1.0]))
    np.testing.assert_allclose(w.grad.numpy(), [2, 0, -6])


def test_second_order_through_nested_grad_managers():
    x_np = _x((5,), 3).astype("float64")
    x = mg.tensor(x_np)
    gm1 = ad.GradManager().attach([x])
    gm2 = ad.GradManager().attach([x])
    with gm1:
        with gm2:
            y = F.sin(x) * F.exp(x)
            gm2.backward(y.sum())
        first = np.cos(x_np) * np.exp(x_np) + np.sin(x_np) * np.exp(x_np)
        np.testing.assert_allclose(x.grad.numpy(), first, rtol=1e-12)
        gm1.backward(x.grad)
    second = 2 * np.cos(x_np) * np.exp(x_np)
    np.testing.assert_allclose(x.grad.numpy(), first + second, rtol=1e-12)


@pytest.mark.parametrize(
    "f, d1, d2",
    [
        (
            lambda x: F.tanh(x),
            lambda x: 1 - np.tanh(x) ** 2,
            lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2),
        ),
        (
            lambda x: F.sigmoid(x),
            lambda x: (s := 1 / (1 + np.exp(-x))) * (1 - s),
            lambda x: (s := 1 / (1 + np.exp(-x))) * (1 - s) * (1 - 2 * s),
        ),
        (
            lambda x: F.log(x * x + 1),
            lambda x: 2 * x / (x * x + 1),
            lambda x: (2 - 2 * x * x) / (x * x + 1) ** 2,
        ),
        (lambda x: F.relu(x) * x, lambda x: 2 * x * (x > 0), lambda x: 2.0 * (x > 0)),
        (
            lambda x: F.sqrt(x * x + 1),
            lambda x: x / np.sqrt(x * x + 1),
            lambda x: (x * x + 1) ** -1.5,
        ),
    ],
)
def test_second_order_elementwise(f, d1, d2):
    x_np = _x((6,), 4).astype("float64")
    x = mg.tensor(x_np)
    gm1, gm2 = ad.GradManager().attach([x]), ad.GradManager().attach([x])
    with gm1:
        with gm2:
            gm2.backward(f(x).sum())
        gm1.backward(x.grad)
    np.testing.assert_allclose(x.grad.numpy(), d1(x_np) + d2(x_np), rtol=1e-10, atol=1e-12)


def test_second_order_matmul_and_reduction():
    a_np, b_np = _x((3, 4), 5).astype("float64"), _x((4, 2), 6).astype("float64")
    a, b = mg.tensor(a_np), mg.tensor(b_np)
    gm1, gm2 = ad.GradManager().attach([a]), ad.GradManager().attach([a])
    with gm1:
        with gm2:
            gm2.backward((F.matmul(a, b) ** 2).mean())
        gm1.backward(a.grad.sum())
    # f = mean((ab)^2); df/da = 2/n (ab) b^T; d/da of sum(df/da) = 2/n * ones @ (b b^T)
    n = 3 * 2
    first = 2 / n * (a_np @ b_np) @ b_np.T
    second = 2 / n * np.ones((3, 4)) @ (b_np @ b_np.T)
    np.testing.assert_allclose(a.grad.numpy(), first + second, rtol=1e-10)


def test_backward_is_iterative_for_long_chains():
    x = mg.Parameter(np.array([1.0], dtype="float32"))
    gm = ad.GradManager().attach([x])
    n = 50_000
    assert n > sys.getrecursionlimit()
    with gm:
        y = x
        for _ in range(n):
            y = y + 1.0
        gm.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


def test_backward_frees_saved_buffers():
    """After backward, nodes hold no saved arrays (intermediate buffers can be reclaimed)."""
    x = mg.Parameter(_x((8, 8)))
    gm = ad.GradManager().attach([x])
    with gm:
        h = F.exp(x)
        y = F.tanh(h).sum()
        node = h._node
        assert node.__dict__  # saved input/output for backward
        gm.backward(y)
    assert not node.__dict__ and node._edges is None


def test_no_grad_blocks_recording():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    gm = ad.GradManager().attach([w])
    with gm:
        with mg.no_grad():
            y = w * 2
        assert not y.requires_grad
        z = w * 3
        gm.backward(z.sum() + y.sum())
    np.testing.assert_allclose(w.grad.numpy(), [3, 3])


def test_custom_function():
    class Cube(ad.Function):
        def forward(self, x):
            self.x = x
            return x * x * x

        def backward(self, dy):
            return 3 * self.x * self.x * dy

    x = mg.Parameter(np.array([1.0, -2.0], dtype="float32"))
    gm = ad.GradManager().attach([x])
    with gm:
        y = Cube()(x)
        assert not isinstance(y, tuple)
        gm.backward(y.sum())
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 12.0])


def test_custom_function_multiple_outputs_missing_grad_is_none():
    """MegEngine: an output that received no gradient is passed to backward as None."""
    seen = []

    class SplitTwo(ad.Function):
        def forward(self, x):
            return x * 2, x * 3

        def backward(self, da, db):
            seen.append((da is None, db is None))
            return (0 if da is None else da * 2) + (0 if db is None else db * 3)

    x = mg.Parameter(np.array([1.0, 2.0], dtype="float32"))
    gm = ad.GradManager().attach([x])
    with gm:
        a, _b = SplitTwo()(x)
        gm.backward(a.sum())
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])
    assert seen == [(False, True)]


def test_after_backward_callback_runs_before_accumulation():
    w = mg.Parameter(np.ones(2, dtype="float32"))
    gm = ad.GradManager()
    holder = {}

    def cb(t, g):
        holder["g"] = g
        return g

    def flush():
        assert w.grad is None  # not yet accumulated
        holder["g"]._data[...] = 10.0  # e.g. an all-reduce writing its result in place

    gm.attach([w], callbacks=[cb])
    with gm:
        gm.register_after_backward_callback(flush)
        gm.backward((w * 2).sum())
    np.testing.assert_allclose(w.grad.numpy(), [10.0, 10.0])


def test_old_graph_is_not_reused_in_a_new_recording():
    w = mg.Parameter(np.array([2.0], dtype="float32"))
    gm = ad.GradManager().attach([w])
    with gm:
        old = w * w
        gm.backward(old)
    w.grad = None
    with gm:
        total = old + w * 3  # `old` is a constant now
        gm.backward(total)
    np.testing.assert_allclose(w.grad.numpy(), [3.0])


def test_broadcast_gradient_is_summed_to_input_shape():
    b = mg.Parameter(np.zeros((1, 3), dtype="float32"))
    gm = ad.GradManager().attach([b])
    with gm:
        gm.backward((mg.tensor(_x((4, 3))) + b).sum())
    np.testing.assert_allclose(b.grad.numpy(), [[4, 4, 4]])


def test_mixed_dtype_gradient_keeps_parameter_dtype():
    w = mg.Parameter(np.ones(3, dtype="float32"))
    gm = ad.GradManager().attach([w])
    with gm:
        gm.backward((w * mg.tensor(np.arange(3.0))).sum())  # float64 operand -> float64 result
    assert w.grad.dtype == np.float32
    np.testing.assert_allclose(w.grad.numpy(), [0, 1, 2])


def test_split_slices_without_gradient_get_zeros():
    """F.split is a built-in multi-output op: its backward fills the outputs that got no
    gradient (None) with zeros."""
    x = mg.Parameter(np.arange(6.0, dtype="float32"))
    gm = ad.GradManager().attach(x)
    with gm:
        _a, b, _c = F.split(x, 3)
        gm.backward((b * b).sum())
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0, 4, 6, 0, 0])


def test_records_always_function_is_recorded_and_back_propagated_without_grad_inputs():
    """A ``records_always`` op (the differentiable collectives) joins the graph even when none of
    its inputs needs a gradient, so its backward still runs (a collective must run on every rank);
    outside a recording it records nothing."""
    seen = []

    class Double(ad.Function):
        records_always = True

        def forward(self, x):
            return x * 2

        def backward(self, dy):
            seen.append(dy.numpy().copy())
            return dy * 2

    w = mg.Parameter([1.0, 2.0])
    x = mg.tensor([3.0, 4.0])  # needs no gradient
    assert not Double()(x).requires_grad
    gm = ad.GradManager().attach(w)
    with gm:
        y = Double()(x)
        assert y.requires_grad
        gm.backward((y * w).sum())
    np.testing.assert_array_equal(w.grad.numpy(), [6.0, 8.0])
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], [1.0, 2.0])
    assert x.grad is None
