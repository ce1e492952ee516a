"""Deterministic data parallelism: one device, DP 2, DP 4, ZeRO-2 (``fully_shard``) and gradient
accumulation over 2 and 4 micro-batches give the same float32 bytes after 5 Adam steps; the usual
all-reduce (and reduce-scatter) does not."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.autodiff import GradManager
from minigrad.distributed.data_parallel.deterministic import (
    BlockGradients,
    block_tree_sum,
    current_blocks,
    deterministic_reductions,
)
from minigrad.testing.distributed import run_workers

N, IN, HID, OUT, STEPS, BLOCKS = 32, 6, 24, 3, 5, 8


def _data():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((STEPS, N, IN)) * 3).astype("float32")
    y = rng.standard_normal((STEPS, N, OUT)).astype("float32")
    return x, y


def _model():
    mg.random.seed(11)
    return M.Sequential(M.Linear(IN, HID), M.Tanh(), M.Linear(HID, OUT))


def _loss(model):
    return lambda x, y: F.nn.square_loss(model(x), y)


def _train(deterministic: bool, micro: int, zero: int = 0) -> bytes:
    """5 Adam steps on this rank's part of each global batch, in ``micro`` micro-batches; the
    parameters' bytes. ``zero=2``: ``fully_shard(reshard_after_forward=False)`` (ZeRO-2), each
    rank updating its shard; the bytes are those of the gathered full parameters."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    if zero:
        dist.fully_shard(model[0], reshard_after_forward=zero == 3)
        dist.fully_shard(model, reshard_after_forward=zero == 3)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x_all, y_all = _data()
    per_rank = N // world
    rows = per_rank // micro
    block_rows = N // BLOCKS
    acc = BlockGradients(model.parameters(), BLOCKS)
    gm = GradManager().attach(
        model.parameters(),
        callbacks=[dist.make_allreduce_cb("mean")] if world > 1 and not zero else None)
    for step in range(STEPS):
        x, y = x_all[step], y_all[step]
        opt.clear_grad()
        for m in range(micro):
            lo = rank * per_rank + m * rows
            xs, ys = x[lo:lo + rows], y[lo:lo + rows]
            if deterministic:
                acc.backward(_loss(model), xs, ys, first_block=lo // block_rows,
                             block_size=block_rows)
            else:  # the usual way: mean loss of the micro-batch / micro, then all-reduce
                with gm:
                    gm.backward(_loss(model)(xs, ys) / micro)
        if deterministic:
            acc.reduce()
        opt.step()
    if zero:
        assert all(p.ndim == 1 for p in model.parameters())  # the optimizer saw the shards
        full = dist.full_state_dict(model)
        return b"".join(np.asarray(full[n]).tobytes() for n in names)
    return b"".join(p.numpy().tobytes() for p in model.parameters())


# (ranks, micro-batches, ZeRO stage)
LAYOUTS = [(1, 1, 0), (1, 2, 0), (1, 4, 0), (2, 1, 0), (2, 2, 0), (2, 4, 0), (4, 1, 0), (4, 2, 0),
           (2, 2, 2), (2, 4, 2), (4, 2, 2)]


def _run(deterministic):
    out = {}
    for ranks, micro, zero in LAYOUTS:
        if ranks == 1:
            out[(ranks, micro, zero)] = _train(deterministic, micro, zero)
        else:
            results = run_workers(_train, ranks, deterministic, micro, zero)
            assert all(r == results[0] for r in results)  # replicas agree in both modes
            out[(ranks, micro, zero)] = results[0]
    return out


def test_deterministic_mode_gives_identical_bytes_for_every_data_parallel_layout():
    same = _run(deterministic=True)
    base = same[(1, 1, 0)]
    assert np.frombuffer(base, np.float32).size == IN * HID + HID + HID * OUT + OUT
    for layout, value in same.items():
        assert value == base, f"{layout} (ranks, micro-batches, zero) differs from one device"
    usual = _run(deterministic=False)
    differ = [layout for layout, value in usual.items() if value != usual[(1, 1, 0)]]
    # without the mode the summation order changes the last bits (the test shows the mode acts)
    assert len(differ) >= 3 and any(zero for *_, zero in differ), differ
    # and the deterministic result is the same training: close to the usual one
    np.testing.assert_allclose(np.frombuffer(base, np.float32),
                               np.frombuffer(usual[(1, 1, 0)], np.float32), rtol=1e-4, atol=1e-5)


def test_block_tree_sum_adds_in_the_fixed_pairwise_order_whatever_the_arrival_order():
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(4).astype("float32") * np.float32(10.0) ** rng.integers(-4, 4)
            for _ in range(8)]
    expect = ((vals[0] + vals[1]) + (vals[2] + vals[3])) + ((vals[4] + vals[5])
                                                           + (vals[6] + vals[7]))
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 3, 5, 1, 0, 6, 2, 4]):
        got = block_tree_sum(((i, [vals[i]]) for i in order), 8)[0]
        assert got.tobytes() == expect.tobytes()
    six = block_tree_sum(((i, [vals[i]]) for i in range(6)), 6)[0]
    assert six.tobytes() == (((vals[0] + vals[1]) + (vals[2] + vals[3]))
                             + (vals[4] + vals[5])).tobytes()
    with pytest.raises(RuntimeError, match=r"expected blocks 0\.\.7 exactly once"):
        block_tree_sum(((i, [vals[i]]) for i in range(7)), 8)


def test_deterministic_gradient_is_the_mean_gradient_and_the_switch_nests():
    model = _model()
    x, y = _data()
    acc = BlockGradients(model.parameters(), 4)
    acc.backward(_loss(model), x[0], y[0], first_block=0, block_size=N // 4)
    loss = acc.reduce()
    got = [p.grad.numpy().astype(np.float64) for p in model.parameters()]
    ref = _model()
    gm = GradManager().attach(ref.parameters())
    with gm:
        ref_loss = _loss(ref)(x[0], y[0])
        gm.backward(ref_loss)
    for g, p in zip(got, ref.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(float(ref_loss.numpy()), rel=1e-6)
    assert current_blocks() is None
    with deterministic_reductions(8):
        with deterministic_reductions(4):
            assert current_blocks() == 4
        assert current_blocks() == 8
    assert current_blocks() is None
