"""``Function.call_pair`` (the two-Tensor shortcut the arithmetic operators take) against the
general ``Function.__call__``: the same outputs, the same node (edges, input metadata, outputs,
tape) and the same gradients, in every case the shortcut handles or hands on."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
from minigrad.autodiff.recording import EAGER_TAPE
from minigrad.functional.elementwise import Add, Mul


class SumAndDifference(ad.Function):
    """Two outputs: the shortcut must record both like the general path."""

    def forward(self, a, b):
        return a.data + b.data, a.data - b.data

    def backward(self, ds, dd):
        ds = 0 if ds is None else ds
        dd = 0 if dd is None else dd
        return ds + dd, ds - dd


class TensorOpsForward(ad.Function):
    """A forward written with Tensor ops returning a Tensor: it must not record itself."""

    def forward(self, a, b):
        self.a, self.b = a.data, b.data
        return a * b + a

    def backward(self, dy):
        return dy * self.b + dy, dy * self.a


class AlwaysRecorded(ad.Function):
    """``records_always``: recorded even when no input needs a gradient."""

    records_always = True

    def forward(self, a, b):
        return a.data * b.data

    def backward(self, dy):
        return dy, dy


def _edge_summary(edge, inputs):
    if edge is None:
        return None
    target, index = edge
    for i, x in enumerate(inputs):
        if target is x:
            return ("input", i, index)
    return ("node", type(target).__name__, index)


def _node_summary(node, inputs):
    if node is None:
        return None
    meta = [None if m is None else (m[0], np.dtype(m[1]).name, str(m[2])) for m in node._in_meta]
    return (type(node).__name__, [_edge_summary(e, inputs) for e in node._edges], meta,
            node._n_out, len(node._tape), node._tape is EAGER_TAPE)


def _outputs_summary(out, inputs):
    outs = out if isinstance(out, tuple) else (out,)
    return [(o.numpy().tolist(), o.dtype.name, o._out_idx, o._eager_grad,
             _node_summary(o._node, inputs)) for o in outs]


def _both(function_class, make_inputs):
    """Outputs of the general call and of the shortcut on fresh, equal inputs."""
    results = []
    for shortcut in (False, True):
        x, y, run = make_inputs()

        def call(x=x, y=y, shortcut=shortcut):
            f = function_class()
            return f.call_pair(x, y) if shortcut else f(x, y)

        results.append(run(call, (x, y)))
    return results


def _param(values, dtype="float32"):
    return mg.Parameter(np.asarray(values, dtype))


def _recorded(attach_first: bool, both: bool = False):
    """Inputs ``p`` (a float32 parameter, shape (3,)) and ``c``: a float32 constant of the same
    shape, or (``both``) a float64 parameter of shape (2, 3), broadcast against ``p``."""

    def make():
        p = _param([1.0, 2.0, 3.0])
        if both:
            c = _param([[0.5, -1.0, 4.0], [2.0, 0.25, -3.0]], "float64")
        else:
            c = mg.tensor(np.array([0.5, -1.0, 4.0], np.float32))
        gm = ad.GradManager().attach([p, c] if both else p)

        def run(call, inputs):
            with gm:
                out = call()
                summary = _outputs_summary(out, inputs)
                first = out[0] if isinstance(out, tuple) else out
                gm.backward((first * first).sum())
            return summary, p.grad.numpy().tolist()

        return (p, c, run) if attach_first else (c, p, run)

    return make


@pytest.mark.parametrize("function_class", [Add, Mul, SumAndDifference, TensorOpsForward,
                                            AlwaysRecorded])
@pytest.mark.parametrize("attach_first", [True, False])
@pytest.mark.parametrize("both", [False, True])
def test_call_pair_records_what_the_general_call_records(function_class, attach_first, both):
    general, shortcut = _both(function_class, _recorded(attach_first, both))
    assert shortcut == general
    summary, _ = general
    if function_class is not TensorOpsForward:
        node = summary[0][4]
        assert node is not None and node[0] == function_class.__name__  # the op itself recorded


def test_call_pair_without_gradients_or_recording():
    def constants_in_gm():
        a = mg.tensor(np.array([1.0, 2.0], np.float32))
        b = mg.tensor(np.array([3, 4], np.int32))
        gm = ad.GradManager().attach(_param([0.0]))

        def run(call, inputs):
            with gm:
                return _outputs_summary(call(), inputs)

        return a, b, run

    def eager_outside_gm():
        a = _param([1.0, 2.0])
        b = mg.tensor(np.array([3.0, 5.0], np.float32))

        def run(call, inputs):
            out = call()
            summary = _outputs_summary(out, inputs)
            out.sum().backward()
            return summary, a.grad.numpy().tolist()

        return a, b, run

    for make in (constants_in_gm, eager_outside_gm):
        for cls in (Add, Mul, AlwaysRecorded):
            general, shortcut = _both(cls, make)
            assert shortcut == general


def test_call_pair_links_to_the_outer_graph_of_nested_recordings():
    """An input produced under an outer GradManager is an edge of an inner recording's node
    (``shares_recording``), in both paths, and both give the second-order gradient."""

    results = []
    for use_shortcut in (False, True):
        p = _param([1.5, -2.0])
        outer, inner = ad.GradManager().attach(p), ad.GradManager().attach(p)
        with outer:
            with inner:
                y = p * p
                z = Mul().call_pair(y, p) if use_shortcut else Mul()(y, p)
                assert _edge_summary(z._node._edges[0], ()) == ("node", "Mul", 0)
                inner.backward(z.sum())
            g = p.grad
            p.grad = None
            outer.backward((g * g).sum())
        results.append((g.numpy().tolist(), p.grad.numpy().tolist()))
    assert results[0] == results[1]
    x = np.array([1.5, -2.0])
    np.testing.assert_allclose(results[0][0], 3 * x**2)  # d(x^3)/dx
    np.testing.assert_allclose(results[0][1], 2 * (3 * x**2) * 6 * x, rtol=1e-6)


# -- Function.grad_buffer: gradients computed where a callback offers -----------------------------
class _Offering:
    """A GradManager callback that offers a buffer (filled with NaN, so a gradient not written
    whole shows) of ``dtype`` (default: the tensor's) for every gradient, and records them."""

    def __init__(self, dtype=None):
        self.dtype, self.offered = dtype, []

    def grad_buffer(self, tensor):
        buf = np.full(tensor.shape, np.nan, self.dtype or tensor.dtype)
        self.offered.append(buf)
        return buf

    def __call__(self, tensor, grad):
        return grad


def _linear_grads(callback, tied: bool):
    rng = np.random.default_rng(3)
    w = mg.Parameter(rng.standard_normal((3, 4)).astype(np.float32))
    x1 = mg.tensor(rng.standard_normal((5, 4)).astype(np.float32))
    x2 = mg.tensor(rng.standard_normal((6, 4)).astype(np.float32))
    gm = ad.GradManager().attach(w, callbacks=[] if callback is None else [callback])
    with gm:
        loss = (mg.functional.linear(x1, w) ** 2).sum()
        if tied:  # a second use of w: two contributions to its gradient
            loss = loss + (mg.functional.linear(x2, w) ** 3).sum()
        gm.backward(loss)
    return w.grad.numpy()


@pytest.mark.parametrize("tied", [False, True])
def test_grad_buffer_gets_the_last_contribution_only(tied):
    """The weight gradient lands in the offered buffer, bitwise as computed elsewhere; with two
    contributions only the last is offered one (the first would be overwritten before the sum)."""
    ref = _linear_grads(None, tied)
    cb = _Offering()
    got = _linear_grads(cb, tied)
    assert np.array_equal(got, ref)
    assert len(cb.offered) == 1
    buf = cb.offered[0]  # NaN where nothing was written
    if tied:  # it holds the last contribution, written whole; the sum is elsewhere
        assert not np.isnan(buf).any() and not np.array_equal(buf, ref)
    else:  # it holds the gradient
        assert np.array_equal(buf, ref)


def test_grad_buffer_of_another_dtype_is_not_used():
    ref = _linear_grads(None, False)
    cb = _Offering(np.float64)
    got = _linear_grads(cb, False)
    assert np.array_equal(got, ref) and got.dtype == np.float32
    assert len(cb.offered) == 1 and np.isnan(cb.offered[0]).all()


def _conv_grads(callback, batch: int):
    rng = np.random.default_rng(5)
    w = mg.Parameter(rng.standard_normal((4, 2, 3, 3)).astype(np.float32))
    x = mg.tensor(rng.standard_normal((batch, 2, 9, 9)).astype(np.float32))
    gm = ad.GradManager().attach(w, callbacks=[] if callback is None else [callback])
    with gm:
        gm.backward((mg.functional.conv2d(x, w, padding=1) ** 2).sum())
    return w.grad.numpy()


@pytest.mark.parametrize("batch", [1, 64])  # one product, or slabs of it summed
def test_conv2d_weight_gradient_in_the_offered_buffer(batch):
    ref = _conv_grads(None, batch)
    cb = _Offering()
    got = _conv_grads(cb, batch)
    assert np.array_equal(got, ref) and len(cb.offered) == 1
    assert np.array_equal(cb.offered[0], ref)  # written there, whole
