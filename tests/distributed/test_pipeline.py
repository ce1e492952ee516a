"""Pipeline parallelism over remote_send/remote_recv: gradients equal the single-process run."""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.testing.distributed import run_workers

DIMS = [6, 8, 8, 5, 3]


def _weights():
    rng = np.random.default_rng(3)
    return [rng.standard_normal((a, b)) * 0.4 for a, b in zip(DIMS[:-1], DIMS[1:])]


def _batch():
    rng = np.random.default_rng(4)
    return rng.standard_normal((10, DIMS[0])), rng.integers(0, DIMS[-1], 10).astype("int32")


def _stage(x, w, last):
    h = F.matmul(x, w)
    return h if last else F.relu(h)


def _single_process():
    ws = [mg.Parameter(w) for w in _weights()]
    x, y = _batch()
    gm = ad.GradManager().attach(ws)
    with gm:
        h = mg.tensor(x)
        for i, w in enumerate(ws):
            h = _stage(h, w, i == len(ws) - 1)
        loss = F.nn.cross_entropy(h, mg.tensor(y))
        gm.backward(loss)
    return [w.grad.numpy() for w in ws], loss.item()


def _pipeline_worker():
    """Rank r owns layer r of a 4-layer MLP: recv -> layer -> send (loss on the last rank)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    w = mg.Parameter(_weights()[rank])
    x, y = _batch()
    gm = ad.GradManager().attach([w])
    loss = None
    with gm:
        h = mg.tensor(x) if rank == 0 else dist.functional.remote_recv(src_rank=rank - 1)
        h = _stage(h, w, rank == n - 1)
        if rank < n - 1:
            dist.functional.remote_send(h, dest_rank=rank + 1)
            gm.backward()
        else:
            loss = F.nn.cross_entropy(h, mg.tensor(y))
            gm.backward(loss)
    return w.grad.numpy(), (loss.item() if loss is not None else None)


def test_four_stage_pipeline_matches_single_process():
    ref_grads, ref_loss = _single_process()
    out = run_workers(_pipeline_worker, 4)
    for rank, (g, _loss) in enumerate(out):
        np.testing.assert_allclose(g, ref_grads[rank], rtol=1e-10, atol=1e-12)
    assert out[-1][1] == ref_loss


def _microbatch_worker(n_micro):
    """Two stages, several micro-batches per step; gradients accumulate over micro-batches."""
    rank = dist.get_rank()
    ws = _weights()
    w = mg.Parameter(ws[0] if rank == 0 else ws[1])
    x, y = _batch()
    gm = ad.GradManager().attach([w])
    for xm, ym in zip(np.split(x, n_micro), np.split(y, n_micro)):
        with gm:
            if rank == 0:
                dist.functional.remote_send(F.relu(F.matmul(mg.tensor(xm), w)), dest_rank=1)
                gm.backward()
            else:
                h = dist.functional.remote_recv(src_rank=0)
                gm.backward(F.nn.cross_entropy(F.matmul(h, w), mg.tensor(ym), reduction="sum"))
    return w.grad.numpy()


def single_process_two_stages():
    """The gradients of both stages of ``_microbatch_worker``, computed in one process."""
    ws = _weights()
    w0, w1 = mg.Parameter(ws[0]), mg.Parameter(ws[1])
    x, y = _batch()
    gm = ad.GradManager().attach([w0, w1])
    with gm:
        logits = F.matmul(F.relu(F.matmul(mg.tensor(x), w0)), w1)
        gm.backward(F.nn.cross_entropy(logits, mg.tensor(y), reduction="sum"))
    return w0.grad.numpy(), w1.grad.numpy()


def test_two_stage_micro_batches_match_single_process():
    ref = single_process_two_stages()
    out = run_workers(_microbatch_worker, 2, 5)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-10)
    np.testing.assert_allclose(out[1], ref[1], rtol=1e-10)
