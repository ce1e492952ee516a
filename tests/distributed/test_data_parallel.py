"""Data parallelism: N ranks x batch b with "mean" all-reduce must equal 1 process x batch N*b."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.testing.distributed import run_workers

IN, HID, OUT, B, STEPS, LR = 5, 7, 3, 4, 4, 0.1


def _data(n_ranks):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS, n_ranks * B, IN))
    y = rng.integers(0, OUT, (STEPS, n_ranks * B)).astype("int32")
    return x, y


def _init(seed):
    rng = np.random.default_rng(seed)
    return [
        mg.Parameter(rng.standard_normal(s) * 0.5, dtype="float64")
        for s in [(IN, HID), (HID,), (HID, OUT), (OUT,)]
    ]


def _loss(params, x, y):
    w1, b1, w2, b2 = params
    h = F.tanh(F.matmul(x, w1) + b1)
    return F.nn.cross_entropy(F.matmul(h, w2) + b2, y)


def _train(n_ranks, rank, cb_factory=None, bucket_mb=None):
    x_all, y_all = _data(n_ranks)
    params = _init(seed=rank + 1)  # different on purpose: bcast_list_ must sync them
    dist.bcast_list_(params)
    cbs = [] if cb_factory is None else [cb_factory()]
    gm = ad.GradManager().attach(params, callbacks=cbs)
    losses = []
    for step in range(STEPS):
        sl = slice(rank * B, (rank + 1) * B)
        with gm:
            loss = _loss(params, mg.tensor(x_all[step, sl]), mg.tensor(y_all[step, sl]))
            gm.backward(loss)
        for p in params:
            p.set_value(p - LR * p.grad)
            p.grad = None
        losses.append(dist.functional.all_reduce_sum(loss).item() / max(dist.get_world_size(), 1))
    return [p.numpy() for p in params], losses


def _reference(n_ranks):
    x_all, y_all = _data(n_ranks)
    params = _init(seed=1)
    gm = ad.GradManager().attach(params)
    losses = []
    for step in range(STEPS):
        with gm:
            loss = _loss(params, mg.tensor(x_all[step]), mg.tensor(y_all[step]))
            gm.backward(loss)
        for p in params:
            p.set_value(p - LR * p.grad)
            p.grad = None
        losses.append(loss.item())
    return [p.numpy() for p in params], losses


def _dp_worker(bucket_mb):
    n = dist.get_world_size()
    return _train(
        n, dist.get_rank(), lambda: dist.make_allreduce_cb("mean", bucket_size_mb=bucket_mb)
    )


@pytest.mark.parametrize(
    "n, bucket_mb", [(2, 10.0), (3, 1e-4)]
)  # tiny buckets: one all-reduce per grad
def test_allreduce_mean_matches_single_process_large_batch(n, bucket_mb):
    ref_params, ref_losses = _reference(n)
    out = run_workers(_dp_worker, n, bucket_mb)
    for params, losses in out:
        for p, q in zip(params, ref_params):
            np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)


def _sum_worker():
    rank = dist.get_rank()
    w = mg.Parameter(np.ones(3) * (rank + 1))
    gm = ad.GradManager().attach([w], callbacks=[dist.make_allreduce_cb("sum")])
    with gm:
        gm.backward((w * (rank + 1.0)).sum())
    return w.grad.numpy(), w.numpy()


def test_allreduce_sum_and_bcast():
    out = run_workers(_sum_worker, 3)
    for g, _ in out:
        np.testing.assert_allclose(g, [6.0, 6.0, 6.0])


def test_world_size_one_callback_is_identity():
    out = run_workers(_sum_worker, 1)
    np.testing.assert_allclose(out[0][0], [1.0, 1.0, 1.0])


def _accumulate_worker(n_ranks, reference=False):
    """Three backward passes without clearing: .grad accumulates, and the gradient tensors of
    earlier steps (views of a reused bucket buffer) must keep their values."""
    x_all, y_all = _data(n_ranks)
    params = _init(seed=1)
    rank = 0 if reference else dist.get_rank()
    cbs = [] if reference else [dist.make_allreduce_cb("mean", bucket_size_mb=1e-4)]
    gm = ad.GradManager().attach(params, callbacks=cbs)
    held, snapshots = [], []
    for step in range(3):
        sl = slice(None) if reference else slice(rank * B, (rank + 1) * B)
        with gm:
            gm.backward(_loss(params, mg.tensor(x_all[step, sl]), mg.tensor(y_all[step, sl])))
        held.append([p.grad for p in params])
        snapshots.append([p.grad.numpy().copy() for p in params])
    intact = all(
        np.array_equal(t.numpy(), s) for ts, ss in zip(held, snapshots) for t, s in zip(ts, ss)
    )
    return [p.grad.numpy() for p in params], intact


def test_accumulated_and_held_gradients_survive_buffer_reuse():
    ref, _ = _accumulate_worker(2, reference=True)
    for grads, intact in run_workers(_accumulate_worker, 2, 2):
        assert intact, "a gradient from an earlier step was overwritten by a later all-reduce"
        for g, r in zip(grads, ref):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


# -- reduce_dtype: low-precision all-reduce, opt-in ------------------------------------------------
def _grad_values(rank):
    """Per-rank gradients that float16 cannot hold exactly (and differ between ranks)."""
    rng = np.random.default_rng(100 + rank)
    return (rng.standard_normal(9) * [1, 1e-2, 1e-4, 3, 1e2, 1e-3, 7, 1e-1, 1]).astype(np.float32)


def _reduce_dtype_worker(reduce_dtype, wrapper):
    import minigrad.module as M
    from minigrad.distributed.comm import arrays

    rank = dist.get_rank()
    sent = []
    real = arrays.all_reduce

    def recording(x, *args, **kwargs):
        sent.append(np.dtype(x.dtype).name)
        return real(x, *args, **kwargs)

    arrays.all_reduce = recording
    try:
        c = mg.tensor(_grad_values(rank))
        if wrapper == "ddp":
            class Scale(M.Module):
                def __init__(self):
                    super().__init__()
                    self.w = mg.Parameter(np.ones(9, np.float32))

                def forward(self, x):
                    return (self.w * x).sum()

            net = dist.DistributedDataParallel(Scale(), reduce_dtype=reduce_dtype)
            w = net.module.w
            gm = ad.GradManager().attach([w])
            with gm:
                gm.backward(net(c))
        else:
            w = mg.Parameter(np.ones(9, np.float32))
            gm = ad.GradManager().attach(
                [w], callbacks=[dist.make_allreduce_cb("mean", reduce_dtype=reduce_dtype)])
            with gm:
                gm.backward((w * c).sum())
    finally:
        arrays.all_reduce = real
    return w.grad.numpy(), sent


@pytest.mark.parametrize("wrapper", ["cb", "ddp"])
def test_reduce_dtype_float16_all_reduces_in_float16_and_returns_float32(wrapper):
    g0, g1 = _grad_values(0), _grad_values(1)
    low = run_workers(_reduce_dtype_worker, 2, "float16", wrapper)
    full = run_workers(_reduce_dtype_worker, 2, None, wrapper)
    # float16: each rank's gradient rounded, summed and halved in float16, then back to float32
    h = (g0.astype(np.float16) + g1.astype(np.float16)) / np.float16(2)
    expected_low = h.astype(np.float32)
    for (grad, sent), (grad32, sent32) in zip(low, full):
        assert grad.dtype == grad32.dtype == np.float32
        assert "float16" in sent and "float32" not in sent
        assert "float32" in sent32 and "float16" not in sent32  # float32 is the default
        np.testing.assert_array_equal(grad, expected_low)
        np.testing.assert_array_equal(grad32, (g0 + g1) / np.float32(2))
    assert not np.array_equal(low[0][0], full[0][0])  # the rounding is visible


def test_reduce_dtype_must_be_floating():
    with pytest.raises(ValueError, match="reduce_dtype must be a floating dtype, got int32"):
        dist.make_allreduce_cb("mean", reduce_dtype="int32")
    pytest.importorskip("ml_dtypes")
    with pytest.raises(ValueError, match="reduce_dtype bfloat16: the collectives cannot reduce"):
        dist.make_allreduce_cb("mean", reduce_dtype="bfloat16")


# -- gradients computed in the bucket (make_allreduce_cb.grad_buffer) ------------------------------
def _linear_model(seed):
    mg.random.seed(seed)
    import minigrad.module as M  # noqa: PLC0415

    return M.Linear(IN, HID), M.Linear(IN, HID)  # alike: a swapped order keeps the shapes


def _in_bucket_worker(n_ranks, offers: bool, bucket_mb: float, reorder: bool, reference=False):
    """Linear layers trained over STEPS steps; with ``reorder`` the two layers' graphs are built
    in alternating order (the buckets' parameter order changes every step) and step 2 keeps the
    gradients of step 1 (no clearing: the bucket is still viewed, nothing may be offered).
    ``offers=False`` puts a pass-through callback first, so the GradManager asks no callback for
    a buffer. Returns the parameters, the offered buffers and which weight products got one."""
    from minigrad.backend import blas  # noqa: PLC0415

    x_all, _ = _data(n_ranks)
    x_all = x_all.astype(np.float32)
    first, second = _linear_model(1)
    params = list(first.parameters()) + list(second.parameters())
    rank = 0 if reference else dist.get_rank()
    offered, into = [], []
    cbs = []
    if not reference:
        cb = dist.make_allreduce_cb("mean", bucket_size_mb=bucket_mb)
        real = cb.grad_buffer

        def spy_offer(param):
            view = real(param)
            offered.append(view is not None)
            return view

        cb.grad_buffer = spy_offer
        cbs = [cb] if offers else [lambda p, g: g, cb]
    real_matmul = blas.matmul

    def spy_matmul(a, b, out=None):
        result = real_matmul(a, b, out=out)
        if out is not None:
            into.append(result is out)
        return result

    blas.matmul = spy_matmul
    gm = ad.GradManager().attach(params, callbacks=cbs)
    for step in range(STEPS):
        sl = slice(None) if reference else slice(rank * B, (rank + 1) * B)
        x = mg.tensor(x_all[step, sl])
        with gm:
            if reorder and step % 2:
                b_out = (F.tanh(second(F.ones((x.shape[0], IN)) * 0.1)) ** 2).mean()
                a_out = (first(x) ** 2).mean()
            else:
                a_out = (first(x) ** 2).mean()
                b_out = (F.tanh(second(F.ones((x.shape[0], IN)) * 0.1)) ** 2).mean()
            gm.backward(a_out + b_out)
        if not (reorder and step == 1):
            for p in params:
                p.set_value(p - LR * p.grad)
                p.grad = None
    blas.matmul = real_matmul
    return [p.numpy() for p in params], offered, into


@pytest.mark.parametrize("bucket_mb", [10.0, 1e-4])
def test_gradients_computed_in_the_bucket_equal_copied_ones(bucket_mb):
    """From the second step on, Linear computes its weight gradient straight into the slot the
    callback offers; the parameters are bitwise those of a run where nothing is offered."""
    with_offers = run_workers(_in_bucket_worker, 2, 2, True, bucket_mb, False)
    without = run_workers(_in_bucket_worker, 2, 2, False, bucket_mb, False)
    for (params, offered, into), (ref_params, ref_offered, ref_into) in zip(with_offers, without):
        for p, q in zip(params, ref_params):
            assert np.array_equal(p, q)
        assert not ref_offered and not ref_into  # a callback first that offers nothing
        # each step after the first: both weights offered a slot, and computed into it
        assert sum(offered) == 2 * (STEPS - 1) and into == [True] * (2 * (STEPS - 1))


def test_gradients_in_the_bucket_with_changing_order_and_held_gradients():
    """The buckets' parameter order changes every step, and one step's gradients are kept into
    the next: buffers still viewed are never lent, a bucket filled in another order is packed
    anew, and training matches one process over the whole batch."""
    ref, _, _ = _in_bucket_worker(2, True, 10.0, True, reference=True)
    for bucket_mb in (10.0, 1e-4):
        for params, _, _ in run_workers(_in_bucket_worker, 2, 2, True, bucket_mb, True):
            for p, q in zip(params, ref):
                np.testing.assert_allclose(p, q, rtol=2e-5, atol=1e-6)
