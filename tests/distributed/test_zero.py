"""Sharded data parallelism: ZeRO-1 (``ZeroRedundancyOptimizer``) equals data parallelism bit for
bit, and one process on the full batch in float64; each rank holds ~1/n of the optimizer state."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

IN, HID, OUT, B, STEPS = 5, 7, 3, 4, 5
# shapes whose sizes (35, 7, 21, 3) are not multiples of 2 or 3: shards cut through parameters
SHAPES = [(IN, HID), (HID,), (HID, OUT), (OUT,)]
OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adam": (optim.Adam, dict(lr=0.01, weight_decay=1e-3)),
    "lamb": (optim.LAMB, dict(lr=0.01, weight_decay=1e-2)),
}


def _data(n):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS, n * B, IN))
    y = rng.integers(0, OUT, (STEPS, n * B)).astype("int32")
    return x, y


def _init(dtype):
    rng = np.random.default_rng(1)
    return [mg.Parameter(rng.standard_normal(s) * 0.5, dtype=dtype) for s in SHAPES]


def _loss(params, x, y):
    w1, b1, w2, b2 = params
    h = F.tanh(F.matmul(x, w1) + b1)
    return F.nn.cross_entropy(F.matmul(h, w2) + b2, y)


def _train(mode, opt_name, dtype, n, bucket_mb=10.0, read_only=False):
    """``mode``: "one" (one process, full batch), "ddp" (all-reduce mean + plain optimizer),
    "zero1" (all-reduce mean + ZeroRedundancyOptimizer)."""
    x_all, y_all = _data(n)
    params = _init(dtype)
    if read_only:  # e.g. loaded from a file: updates must replace the array, not write into it
        params[0].data.flags.writeable = False
    rank = dist.get_rank() if mode != "one" else 0
    cls, hyper = OPTIMIZERS[opt_name]
    cbs = [] if mode == "one" else [dist.make_allreduce_cb("mean")]
    gm = ad.GradManager().attach(params, callbacks=cbs)
    if mode == "zero1":
        opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=cls,
                                           bucket_cap_mb=bucket_mb, **hyper)
    else:
        opt = cls(params, **hyper)
    for step in range(STEPS):
        sl = slice(None) if mode == "one" else slice(rank * B, (rank + 1) * B)
        x = mg.tensor(x_all[step, sl], dtype=dtype)
        with gm:
            gm.backward(_loss(params, x, mg.tensor(y_all[step, sl])))
        opt.step().clear_grad()
    state_bytes = opt.local_state_bytes() if mode == "zero1" else None
    return [p.numpy() for p in params], state_bytes


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_zero1_is_bitwise_ddp_in_float32(n, opt_name):
    ddp = run_workers(_train, n, "ddp", opt_name, "float32", n)
    zero = run_workers(_train, n, "zero1", opt_name, "float32", n)
    for (pz, _), (pd, _) in zip(zero, ddp):
        for a, b in zip(pz, pd):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(zero[0][0][0], _init("float32")[0].numpy())  # it trained


@pytest.mark.parametrize("n", [2, 3])
def test_zero1_float64_equals_one_process_and_shards_the_state(n):
    ref, _ = _train("one", "adam", "float64", n)
    # a tiny bucket cap: one bucket per parameter, each padded on its own
    for params, _ in run_workers(_train, n, "zero1", "adam", "float64", n, 1e-6):
        for a, b in zip(params, ref):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    total = sum(int(np.prod(s)) for s in SHAPES)
    full_state = 2 * 8 * total  # Adam: two float64 moments per element
    got = [sb for _, sb in run_workers(_train, n, "zero1", "adam", "float64", n)]
    assert sum(got) == full_state  # the pieces cover every element once, padding never held
    for sb in got:
        assert sb <= full_state / n + 2 * 8 * n  # at most the padding's worth above 1/n


def _state_worker(mode, n, to):
    """Train 5 steps; return the full optimizer state (ZeRO: consolidated on rank ``to``), then
    load it into a fresh optimizer (ZeRO: every rank slices its pieces) and train 2 more steps."""
    x_all, y_all = _data(n)
    params = _init("float32")
    rank = dist.get_rank()
    cls, hyper = OPTIMIZERS["adam"]
    gm = ad.GradManager().attach(params, callbacks=[dist.make_allreduce_cb("mean")])

    def make():
        if mode == "zero1":
            return dist.ZeroRedundancyOptimizer(params, optimizer_class=cls, **hyper)
        return cls(params, **hyper)

    def train(opt, steps):
        for step in steps:
            sl = slice(rank * B, (rank + 1) * B)
            with gm:
                gm.backward(_loss(params, mg.tensor(x_all[step, sl], dtype="float32"),
                                  mg.tensor(y_all[step, sl])))
            opt.step().clear_grad()

    opt = make()
    train(opt, range(3))
    state = None
    if mode == "zero1":
        opt.consolidate_state_dict(to=to)
        if rank == to:
            state = opt.state_dict()
        else:
            with pytest.raises(RuntimeError, match="consolidate_state_dict"):
                opt.state_dict()
        full = [None] * n  # object collectives take str keys: load_state_dict accepts them
        sent = None if state is None else dict(state, state={str(k): v for k, v in
                                                             state["state"].items()})
        dist.all_gather_object(full, sent)
        loaded = full[to]
    else:
        state = loaded = opt.state_dict()
    opt2 = make().load_state_dict(loaded)
    train(opt2, range(3, 5))
    return state, [p.numpy() for p in params]


@pytest.mark.parametrize("n", [2, 3])
def test_zero1_state_dict_is_the_plain_optimizers_and_loads_back(n):
    ddp = run_workers(_state_worker, n, "ddp", n, 0)
    zero = run_workers(_state_worker, n, "zero1", n, n - 1)
    ref_state = ddp[0][0]
    state = zero[n - 1][0]
    assert all(zero[r][0] is None for r in range(n - 1))
    assert sorted(state["state"]) == sorted(ref_state["state"]) == [0, 1, 2, 3]
    assert state["param_groups"] == ref_state["param_groups"]
    for k, st in ref_state["state"].items():
        assert st["step"] == state["state"][k]["step"] == 3
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(state["state"][k][name], st[name])
    for (_, pz), (_, pd) in zip(zero, ddp):  # continued training after the reload: identical
        for a, b in zip(pz, pd):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [2, 3])
def test_zero1_lamb_uses_whole_parameter_norms(n):
    ddp = run_workers(_train, n, "ddp", "lamb", "float64", n)
    zero = run_workers(_train, n, "zero1", "lamb", "float64", n)
    for (pz, _), (pd, _) in zip(zero, ddp):
        for a, b in zip(pz, pd):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _bad_worker(case):
    """Rank 1 builds a different model; return this rank's error message."""
    params = _init("float32")
    if case == "shapes_differ" and dist.get_rank() == 1:
        params[1] = mg.Parameter(np.zeros(HID + 2, "float32"))
    try:
        dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.SGD, lr=0.1)
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_bad_input_fails_on_every_rank():
    for msg in run_workers(_bad_worker, 2, "shapes_differ", timeout=30):
        assert msg is not None and "ZeroRedundancyOptimizer" in msg
        assert "rank 0 has 'parameter 1' of shape (7,) float32, rank 1 has" in msg


def _no_backward_worker():
    rank = dist.get_rank()
    params = _init("float32")
    opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.SGD, lr=0.1)
    if rank == 0:  # rank 0 did a backward (local gradients), rank 1 did none
        for p in params:
            p.grad = mg.tensor(np.ones(p.shape, "float32"))
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_step_without_backward_fails_on_every_rank_naming_the_parameter():
    for msg in run_workers(_no_backward_worker, 2, timeout=30):
        assert msg is not None
        assert "ZeroRedundancyOptimizer.step: parameter 0 (shape (5, 7)) has a gradient on " \
               "ranks [0] but none on ranks [1]" in msg


def _resume_worker(mode, params_state, opt_state):
    """At this world size: load parameters and a full optimizer state, train steps 3 and 4."""
    n = dist.get_world_size()
    x_all, y_all = _data(n)
    params = [mg.Parameter(v) for v in params_state]
    rank = dist.get_rank()
    cls, hyper = OPTIMIZERS["adam"]
    gm = ad.GradManager().attach(params, callbacks=[dist.make_allreduce_cb("mean")])
    if mode == "zero1":
        opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=cls, **hyper)
    else:
        opt = cls(params, **hyper)
    opt.load_state_dict(opt_state)
    for step in (3, 4):
        sl = slice(rank * B, (rank + 1) * B)
        with gm:
            gm.backward(_loss(params, mg.tensor(x_all[step, sl]), mg.tensor(y_all[step, sl])))
        opt.step().clear_grad()
    return [p.numpy() for p in params]


def _save_worker():
    """ZeRO-1 at this world size for 3 steps (float64); the parameters and the full state."""
    x_all, y_all = _data(dist.get_world_size())
    params = _init("float64")
    rank = dist.get_rank()
    cls, hyper = OPTIMIZERS["adam"]
    gm = ad.GradManager().attach(params, callbacks=[dist.make_allreduce_cb("mean")])
    opt = dist.ZeroRedundancyOptimizer(params, optimizer_class=cls, **hyper)
    for step in range(3):
        sl = slice(rank * B, (rank + 1) * B)
        with gm:
            gm.backward(_loss(params, mg.tensor(x_all[step, sl]), mg.tensor(y_all[step, sl])))
        opt.step().clear_grad()
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if rank == 0 else None
    if state is not None:
        state = dict(state, state={str(k): v for k, v in state["state"].items()})
    return [p.numpy() for p in params], state


def test_zero1_state_saved_at_2_ranks_resumes_at_3_like_ddp():
    params, state = run_workers(_save_worker, 2)[0]
    zero = run_workers(_resume_worker, 3, "zero1", params, state)
    ddp = run_workers(_resume_worker, 3, "ddp", params, state)
    for pz, pd in zip(zero, ddp):
        for a, b in zip(pz, pd):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    assert not np.array_equal(zero[0][0], params[0])


def test_zero1_read_only_parameters_are_replaced_not_written():
    ddp = run_workers(_train, 2, "ddp", "sgd", "float32", 2, 10.0, True)
    zero = run_workers(_train, 2, "zero1", "sgd", "float32", 2, 10.0, True)
    for (pz, _), (pd, _) in zip(zero, ddp):
        for a, b in zip(pz, pd):
            np.testing.assert_array_equal(a, b)
