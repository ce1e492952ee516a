"""DistributedDataParallel (incl. no_sync) and SyncBatchNorm against single-process references."""

import contextlib

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
from minigrad.testing.distributed import run_workers

N, B = 2, 6


def _data(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N * B, 5)).astype("float32"), rng.integers(0, 3, N * B).astype(
        "int32"
    )


def _model():
    mg.random.seed(dist.get_rank() + 10 if dist.is_distributed() else 10)  # ranks differ: DDP syncs
    return M.Sequential(M.Linear(5, 8), M.Tanh(), M.Linear(8, 3))


def _ddp_worker():
    rank = dist.get_rank()
    ddp = dist.DistributedDataParallel(_model(), bucket_cap_mb=1e-4)
    gm = ad.GradManager().attach(ddp.parameters())
    sl = slice(rank * B, (rank + 1) * B)
    (xa, ya), (xb, yb) = _data(1), _data(2)
    with ddp.no_sync():
        with gm:
            gm.backward(F.nn.cross_entropy(ddp(mg.tensor(xa[sl])), mg.tensor(ya[sl])))
    local_only = [p.grad.numpy() for p in ddp.parameters()]
    with gm:
        gm.backward(F.nn.cross_entropy(ddp(mg.tensor(xb[sl])), mg.tensor(yb[sl])))
    return (
        [p.numpy() for p in ddp.parameters()],
        [p.grad.numpy() for p in ddp.parameters()],
        local_only,
    )


def test_ddp_syncs_weights_and_averages_accumulated_gradients():
    out = run_workers(_ddp_worker, N)
    mg.random.seed(10)  # rank 0's initialisation, which DDP broadcast
    model = M.Sequential(M.Linear(5, 8), M.Tanh(), M.Linear(8, 3))
    gm = ad.GradManager().attach(model.parameters())
    (xa, ya), (xb, yb) = _data(1), _data(2)
    with gm:
        gm.backward(
            F.nn.cross_entropy(model(mg.tensor(xa)), mg.tensor(ya))
            + F.nn.cross_entropy(model(mg.tensor(xb)), mg.tensor(yb))
        )
    ref_w = [p.numpy() for p in model.parameters()]
    ref_g = [p.grad.numpy() for p in model.parameters()]
    for weights, grads, _ in out:
        for w, rw in zip(weights, ref_w):
            np.testing.assert_array_equal(w, rw)
        for g, rg in zip(grads, ref_g):
            np.testing.assert_allclose(g, rg, rtol=2e-5, atol=1e-6)
    # under no_sync the ranks' gradients were their own (different) ones
    assert not np.allclose(out[0][2][0], out[1][2][0])


def _syncbn_worker(x_all):
    rank = dist.get_rank()
    bn = dist.SyncBatchNorm(3)
    x = mg.tensor(x_all[rank * 2 : (rank + 1) * 2])
    w = mg.tensor(
        np.random.default_rng(5)
        .standard_normal(x_all.shape)
        .astype("float32")[rank * 2 : (rank + 1) * 2]
    )
    gm = ad.GradManager().attach([x, bn.weight, bn.bias])
    with gm:
        y = bn(x)
        gm.backward((y * w).sum())
    return (
        y.numpy(),
        x.grad.numpy(),
        bn.weight.grad.numpy(),
        bn.bias.grad.numpy(),
        bn.running_mean.numpy(),
        bn.running_var.numpy(),
    )


def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch():
    x_all = np.random.default_rng(4).standard_normal((4, 3, 5, 5)).astype("float32")
    out = run_workers(_syncbn_worker, 2, x_all)
    bn = M.BatchNorm2d(3)
    x = mg.tensor(x_all)
    w = mg.tensor(np.random.default_rng(5).standard_normal(x_all.shape).astype("float32"))
    gm = ad.GradManager().attach([x, bn.weight, bn.bias])
    with gm:
        y = bn(x)
        gm.backward((y * w).sum())
    y_ref, gx_ref = y.numpy(), x.grad.numpy()
    # affine parameters are per-rank partial sums (a data-parallel all-reduce adds them up)
    np.testing.assert_allclose(sum(o[2] for o in out), bn.weight.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sum(o[3] for o in out), bn.bias.grad.numpy(), rtol=1e-4, atol=1e-5)
    for rank, (y_r, gx, _gw, _gb, rm, rv) in enumerate(out):
        sl = slice(rank * 2, (rank + 1) * 2)
        np.testing.assert_allclose(y_r, y_ref[sl], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gx, gx_ref[sl], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rm, bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rv, bn.running_var.numpy(), rtol=1e-5, atol=1e-6)


def _ddp_steps_worker(offers: bool):
    """Three DDP steps (SGD, gradients cleared), a no_sync step before them: with ``offers`` the
    reducer lends its bucket slots to the weight products (through the DDP gradient hook); else
    a pass-through callback comes first and nothing is offered."""
    rank = dist.get_rank()
    ddp = dist.DistributedDataParallel(_model())
    lent = []
    real = ddp._reducer.grad_buffer

    def spy(param):
        view = real(param)
        lent.append(view is not None)
        return view

    ddp._reducer.grad_buffer = spy
    gm = ad.GradManager().attach(ddp.parameters(), callbacks=None if offers else [lambda p, g: g])
    opt = mg.optimizer.SGD(ddp.parameters(), lr=0.1)
    sl = slice(rank * B, (rank + 1) * B)
    for seed in range(4):
        x, y = _data(seed)
        with contextlib.nullcontext() if seed else ddp.no_sync():
            with gm:
                gm.backward(F.nn.cross_entropy(ddp(mg.tensor(x[sl])), mg.tensor(y[sl])))
        if seed:
            opt.step().clear_grad()
    return [p.numpy() for p in ddp.parameters()], sum(lent)


def test_ddp_computes_weight_gradients_in_its_buckets():
    with_offers = run_workers(_ddp_steps_worker, N, True)
    without = run_workers(_ddp_steps_worker, N, False)
    for (params, lent), (ref, ref_lent) in zip(with_offers, without):
        for p, q in zip(params, ref):
            assert np.array_equal(p, q)
        assert ref_lent == 0
        assert lent == 2 * 2  # both weights, in the two steps after the bucket's first fill
