"""Differentiable collectives: forward against NumPy over all ranks' inputs, backward against the
analytic adjoint, for world sizes 1-3."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
from minigrad.testing.distributed import run_workers

SHAPE = (4, 6)


def _inp(rank, shape=SHAPE):
    return np.random.default_rng(100 + rank).standard_normal(shape)


def _w(rank, shape):
    return np.random.default_rng(200 + rank).standard_normal(shape)


def _run_op(op_name, kwargs):
    """On each rank: y = op(x_rank); loss = sum(y * w_rank); return (y, dloss/dx)."""
    rank = dist.get_rank()
    x = mg.tensor(_inp(rank))
    gm = ad.GradManager().attach([x])
    op = getattr(dist.functional, op_name)
    with gm:
        y = op(x, **kwargs)
        if y is None:
            gm.backward()
            return None, x.grad.numpy() if x.grad is not None else None
        gm.backward((y * mg.tensor(_w(rank, y.shape))).sum())
    return y.numpy(), (x.grad.numpy() if x.grad is not None else None)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_all_reduce_sum(n):
    out = run_workers(_run_op, n, "all_reduce_sum", {})
    xs = [_inp(r) for r in range(n)]
    ws = [_w(r, SHAPE) for r in range(n)]
    for y, g in out:
        np.testing.assert_allclose(y, sum(xs), rtol=1e-12)
        np.testing.assert_allclose(g, sum(ws), rtol=1e-12)


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_max(n):
    out = run_workers(_run_op, n, "all_reduce_max", {})
    xs = np.stack([_inp(r) for r in range(n)])
    ws = sum(_w(r, SHAPE) for r in range(n))
    for r, (y, g) in enumerate(out):
        np.testing.assert_allclose(y, xs.max(0))
        np.testing.assert_allclose(g, ws * (xs[r] == xs.max(0)))


@pytest.mark.parametrize("n, axis", [(2, 0), (3, 1)])
def test_all_gather_and_backward_reduce_scatter(n, axis):
    out = run_workers(_run_op, n, "all_gather", {"axis": axis})
    xs = [_inp(r) for r in range(n)]
    full = np.concatenate(xs, axis=axis)
    ws = sum(_w(r, full.shape) for r in range(n))
    parts = np.split(ws, n, axis=axis)
    for r, (y, g) in enumerate(out):
        np.testing.assert_allclose(y, full)
        np.testing.assert_allclose(g, parts[r], rtol=1e-12)


@pytest.mark.parametrize("n, axis", [(2, 0), (3, 1)])
def test_reduce_scatter_sum_and_backward_all_gather(n, axis):
    shape = (6, 6)

    def run(axis):
        rank = dist.get_rank()
        x = mg.tensor(_inp(rank, shape))
        gm = ad.GradManager().attach([x])
        with gm:
            y = dist.functional.reduce_scatter_sum(x, axis=axis)
            gm.backward((y * mg.tensor(_w(rank, y.shape))).sum())
        return y.numpy(), x.grad.numpy()

    out = run_workers(run, n, axis)
    total = sum(_inp(r, shape) for r in range(n))
    chunks = np.split(total, n, axis=axis)
    grad = np.concatenate([_w(r, chunks[0].shape) for r in range(n)], axis=axis)
    for r, (y, g) in enumerate(out):
        np.testing.assert_allclose(y, chunks[r], rtol=1e-12)
        np.testing.assert_allclose(g, grad)


@pytest.mark.parametrize("n", [2, 3])
def test_broadcast_gradient_sums_on_root(n):
    out = run_workers(_run_op, n, "broadcast", {})
    ws = sum(_w(r, SHAPE) for r in range(n))
    for r, (y, g) in enumerate(out):
        np.testing.assert_allclose(y, _inp(0))
        if r == 0:
            np.testing.assert_allclose(g, ws, rtol=1e-12)
        else:
            assert g is None


@pytest.mark.parametrize("n", [2, 3])
def test_all_to_all(n):
    shape = (6, 3 * n)

    def run():
        rank = dist.get_rank()
        x = mg.tensor(_inp(rank, shape))
        gm = ad.GradManager().attach([x])
        with gm:
            y = dist.functional.all_to_all(x, split_axis=1, concat_axis=0)
            gm.backward((y * mg.tensor(_w(rank, y.shape))).sum())
        return y.numpy(), x.grad.numpy()

    out = run_workers(run, n)
    xs = [_inp(r, shape) for r in range(n)]
    for r, (y, g) in enumerate(out):
        expect = np.concatenate([np.split(xs[j], n, axis=1)[r] for j in range(n)], axis=0)
        np.testing.assert_allclose(y, expect)
        # rank r's chunk j went to rank j at rows [r*6:(r+1)*6]
        wgrad = np.concatenate([_w(j, y.shape)[r * 6 : (r + 1) * 6] for j in range(n)], axis=1)
        np.testing.assert_allclose(g, wgrad)


@pytest.mark.parametrize("op", ["reduce_sum", "gather"])
def test_root_only_results_pull_gradients_to_every_rank(op):
    n = 3
    out = run_workers(_run_op, n, op, {})
    xs = [_inp(r) for r in range(n)]
    if op == "reduce_sum":
        expect_y, w0 = sum(xs), _w(0, SHAPE)
        grads = [w0] * n
    else:
        expect_y = np.concatenate(xs, axis=0)
        grads = np.split(_w(0, expect_y.shape), n, axis=0)
    for r, (y, g) in enumerate(out):
        if r == 0:
            np.testing.assert_allclose(y, expect_y, rtol=1e-12)
        else:
            assert y is None
        np.testing.assert_allclose(g, grads[r])


def test_scatter_from_root():
    n = 2

    def run():
        rank = dist.get_rank()
        x = mg.tensor(_inp(0, (4, 3))) if rank == 0 else None
        gm = ad.GradManager()
        if x is not None:
            gm.attach([x])
        with gm:
            y = dist.functional.scatter(x)
            gm.backward((y * mg.tensor(_w(rank, y.shape))).sum())
        return y.numpy(), (x.grad.numpy() if x is not None else None)

    out = run_workers(run, n)
    chunks = np.split(_inp(0, (4, 3)), n)
    for r, (y, _) in enumerate(out):
        np.testing.assert_allclose(y, chunks[r])
    np.testing.assert_allclose(out[0][1], np.concatenate([_w(r, (2, 3)) for r in range(n)]))


def _round_trip():
    rank = dist.get_rank()
    if rank == 0:
        x = mg.tensor(np.array([1.5, -2.0, 3.0]))
        gm = ad.GradManager().attach([x])
        with gm:
            dist.functional.remote_send(x, dest_rank=1)
            r = dist.functional.remote_recv(src_rank=1)
            gm.backward((r * r).sum())
        return x.grad.numpy()
    gm = ad.GradManager()
    with gm:
        t = dist.functional.remote_recv(src_rank=0)
        dist.functional.remote_send(t, dest_rank=0)
        gm.backward()
    return None


def test_remote_send_recv_round_trip_gradient_is_2x():
    out = run_workers(_round_trip, 2)
    np.testing.assert_allclose(out[0], 2 * np.array([1.5, -2.0, 3.0]))
