"""``dist.fully_shard`` (ZeRO-3 and ZeRO-2): parameters held as shards, bitwise equal to data
parallelism in float32 and to one process in float64; bad input fails on every rank."""

import contextlib
import dataclasses

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

IN, HID, OUT, B, STEPS = 5, 7, 3, 4, 5
OPTIMIZERS = {
    "sgd": (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adam": (optim.Adam, dict(lr=0.01, weight_decay=1e-3)),
    "lamb": (optim.LAMB, dict(lr=0.01, weight_decay=1e-2)),  # trust ratio: whole-param norms
}


class Block(M.Module):
    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(3)
        self.fc = M.Linear(IN, HID)
        self.fc.weight = mg.Parameter(rng.standard_normal((HID, IN)) * 0.5, dtype=dtype)
        self.fc.bias = mg.Parameter(rng.standard_normal(HID) * 0.5, dtype=dtype)
        # used on odd steps only: no gradient on even steps
        self.extra = mg.Parameter(rng.standard_normal(HID) * 0.1, dtype=dtype)
        self.step = 0

    def forward(self, x):
        h = F.tanh(self.fc(x))
        return h * self.extra if self.step % 2 else h


class Net(M.Module):
    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(4)
        self.block = Block(dtype)
        self.head = mg.Parameter(rng.standard_normal((HID, OUT)) * 0.5, dtype=dtype)
        self.frozen = mg.Parameter(rng.standard_normal(OUT), dtype=dtype)  # never trained

    def forward(self, x):
        return F.matmul(self.block(x), self.head) + self.frozen


def _data(n):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((STEPS, n * B, IN))
    y = rng.integers(0, OUT, (STEPS, n * B)).astype("int32")
    return x, y


def _trainable(net):
    return [p for name, p in net.named_parameters() if not name.startswith("frozen")]


def _train(mode, opt_name, dtype, n, reshard=True, clip=None):
    """``mode``: "one" (one process, full batch), "ddp" (all-reduce mean), "fsdp"."""
    x_all, y_all = _data(n)
    net = Net(dtype)
    rank = dist.get_rank() if mode != "one" else 0
    if mode == "fsdp":
        dist.fully_shard(net.block, reshard_after_forward=reshard)
        dist.fully_shard(net, reshard_after_forward=reshard)
    params = _trainable(net)
    cls, hyper = OPTIMIZERS[opt_name]
    cbs = [dist.make_allreduce_cb("mean")] if mode == "ddp" else []
    gm = ad.GradManager().attach(params, callbacks=cbs)
    opt = cls(params, **hyper)
    norms = []
    for step in range(STEPS):
        net.block.step = step
        sl = slice(None) if mode == "one" else slice(rank * B, (rank + 1) * B)
        with gm:
            out = net(mg.tensor(x_all[step, sl], dtype=dtype))
            gm.backward(F.nn.cross_entropy(out, mg.tensor(y_all[step, sl])))
        if clip is not None:
            norms.append(float(optim.clip_grad_norm(params, clip).item()))
        opt.step().clear_grad()
    if clip is not None:
        return (_full_params(net) if mode == "fsdp" else [p.numpy() for p in net.parameters()],
                norms)
    if mode == "fsdp":  # the full parameters, gathered once more for the comparison
        return _full_params(net), sum(p.data.nbytes for p in net.parameters())
    return [p.numpy() for p in net.parameters()], None


def _full_params(net):
    out = []
    for module in (net, net.block):
        state = module._fully_shard
        out.extend(zip(state.names, [np.asarray(a) for a in state.gather()]))
    order = [name for name, _ in Net("float64").named_parameters()]
    found = dict(out)
    return [found[name if name in found else name.split(".", 1)[1]] for name in order]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("reshard", [True, False])
def test_fully_shard_is_bitwise_ddp_in_float32(n, opt_name, reshard):
    ddp = run_workers(_train, n, "ddp", opt_name, "float32", n)
    fsdp = run_workers(_train, n, "fsdp", opt_name, "float32", n, reshard)
    for (pf, _), (pd, _) in zip(fsdp, ddp):
        assert len(pf) == len(pd) == 5
        for a, b in zip(pf, pd):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, b)
    init = [p.numpy() for p in Net("float32").parameters()]
    assert not np.array_equal(fsdp[0][0][0], init[0])  # trained
    np.testing.assert_array_equal(fsdp[0][0][4], init[4])  # the frozen one did not move


@pytest.mark.parametrize("n", [2, 3])
def test_fully_shard_float64_equals_one_process_and_holds_a_shard(n):
    ref, _ = _train("one", "adam", "float64", n)
    out = run_workers(_train, n, "fsdp", "adam", "float64", n)
    for params, _ in out:
        for a, b in zip(params, ref):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    total = sum(p.size for p in Net("float64").parameters()) * 8
    held = [nbytes for _, nbytes in out]
    assert sum(held) == total  # the pieces cover every parameter element exactly once
    assert max(held) <= total / n + 8 * n * 2  # a shard each, plus padding per layout


def _freed_worker(reshard):
    net = Net("float32")
    dist.fully_shard(net.block, reshard_after_forward=reshard)
    dist.fully_shard(net, reshard_after_forward=reshard)
    gm = ad.GradManager().attach(_trainable(net))
    x, y = _data(2)
    rank = dist.get_rank()
    with gm:
        out = net(mg.tensor(x[0, rank * B:(rank + 1) * B], dtype="float32"))
        alive_after_forward = [r() is not None for m in (net, net.block)
                               for r in m._fully_shard.gathered]
        gm.backward(F.nn.cross_entropy(out, mg.tensor(y[0, rank * B:(rank + 1) * B])))
    alive_after_backward = [r() is not None for m in (net, net.block)
                            for r in m._fully_shard.gathered]
    return alive_after_forward, alive_after_backward


def test_reshard_after_forward_frees_the_gathered_parameters():
    for fwd, bwd in run_workers(_freed_worker, 2, True):
        assert fwd == [False, False] and bwd == [False, False]  # ZeRO-3: freed after forward
    for fwd, bwd in run_workers(_freed_worker, 2, False):
        assert fwd == [True, True] and bwd == [False, False]  # ZeRO-2: kept until backward


@pytest.mark.parametrize("n", [2, 3])
def test_global_norm_clipping_sees_every_shard(n):
    """The norm sums per-rank partial sums: another order than DDP's, so equal to rounding."""
    ddp = run_workers(_train, n, "ddp", "sgd", "float64", n, True, 0.3)
    fsdp = run_workers(_train, n, "fsdp", "sgd", "float64", n, True, 0.3)
    assert max(ddp[0][1]) > 0.3  # clipping acted
    for (pf, nf), (pd, nd) in zip(fsdp, ddp):
        np.testing.assert_allclose(nf, nd, rtol=1e-12)
        for a, b in zip(pf, pd):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [2, 3])
def test_lamb_trust_ratio_uses_whole_parameter_norms(n):
    ddp = run_workers(_train, n, "ddp", "lamb", "float64", n)
    fsdp = run_workers(_train, n, "fsdp", "lamb", "float64", n)
    for (pf, _), (pd, _) in zip(fsdp, ddp):
        for a, b in zip(pf, pd):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _bad_worker(case):
    """Run one kind of misuse; return this rank's error message (every rank must get one)."""
    rank = dist.get_rank()
    net = Net("float32")
    try:
        if case == "optimizer_before":
            opt = optim.SGD(_trainable(net), lr=0.1)
            dist.fully_shard(net.block)
            dist.fully_shard(net)
            gm = ad.GradManager().attach(_trainable(net))
            with gm:
                gm.backward(net(mg.tensor(np.ones((2, IN), "float32"))).sum())
            opt.step()
        elif case == "parent_first":
            dist.fully_shard(net)
            dist.fully_shard(net.block)
        elif case == "shared":
            other = M.Module()
            other.w = net.block.extra  # one parameter in two modules wrapped separately
            dist.fully_shard(net.block)
            dist.fully_shard(other)
        elif case == "shapes_differ":
            if rank == 1:
                net.block.fc.bias = mg.Parameter(np.zeros(HID + 1, "float32"))
            dist.fully_shard(net.block)
        elif case == "order_differs":
            if rank == 1:
                net.block.extra, net.block.fc = net.block.fc, net.block.extra
            dist.fully_shard(net.block)
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize(
    "case, pieces",
    [
        ("optimizer_before", ["SGD.step", "parameter 0 (shape (7, 5))", "fully_shard(Block)",
                              "fc.weight", "build the optimizer after sharding"]),
        ("parent_first", ["fully_shard(Block)", "'fc.weight'", "already belongs to "
                          "fully_shard(Net)"]),
        ("shared", ["fully_shard(Module)", "'w'", "replaced by shards of fully_shard(Block)"]),
        ("shapes_differ", ["fully_shard(Block)", "parameter 1", "rank 0 has 'fc.bias' of shape "
                           "(7,) float32, rank 1 has 'fc.bias' of shape (8,)"]),
        ("order_differs", ["fully_shard(Block)", "parameter 0", "rank 0 has 'fc.weight'",
                           "rank 1 has 'fc' of shape (7,)"]),
    ],
)
def test_bad_input_fails_on_every_rank_naming_the_parameter(case, pieces):
    messages = run_workers(_bad_worker, 2, case, timeout=30)
    for msg in messages:
        assert msg is not None, f"{case}: a rank raised nothing"
        for piece in pieces:
            assert piece in msg, f"{case}: {piece!r} not in {msg!r}"


def _accumulate(mode, n, mixed):
    """Two micro-batches per step (gradients accumulate in ``.grad``), then one step; with
    ``mixed`` the head is float64 while the block is float32 (two layouts, two collectives)."""
    x_all, y_all = _data(n)
    net = Net("float32")
    if mixed:
        net.head = mg.Parameter(net.head.numpy().astype("float64"))
    rank = dist.get_rank()
    if mode == "fsdp":
        dist.fully_shard(net.block)
        dist.fully_shard(net)
    params = _trainable(net)
    cbs = [dist.make_allreduce_cb("mean")] if mode == "ddp" else []
    gm = ad.GradManager().attach(params, callbacks=cbs)
    opt = optim.Adam(params, lr=0.01)
    for step in range(3):
        net.block.step = 1  # every parameter gets a gradient
        for half in (0, 1):
            rows = slice(rank * B + half * B // 2, rank * B + (half + 1) * B // 2)
            with gm:
                out = net(mg.tensor(x_all[step, rows], dtype="float32"))
                gm.backward(F.nn.cross_entropy(out, mg.tensor(y_all[step, rows])) * 0.5)
        opt.step().clear_grad()
    return _full_params(net) if mode == "fsdp" else [p.numpy() for p in net.parameters()]


@pytest.mark.parametrize("mixed", [False, True])
def test_gradient_accumulation_and_mixed_dtypes_are_bitwise_ddp(mixed):
    ddp = run_workers(_accumulate, 2, "ddp", 2, mixed)
    fsdp = run_workers(_accumulate, 2, "fsdp", 2, mixed)
    for pf, pd in zip(fsdp, ddp):
        assert [a.dtype for a in pf] == [a.dtype for a in pd]
        assert (pf[3].dtype == np.float64) == mixed
        for a, b in zip(pf, pd):
            np.testing.assert_array_equal(a, b)


def _steps(net, params, opt, gm, n, steps, dtype):
    x_all, y_all = _data(n)
    rank = dist.get_rank()
    for step in steps:
        net.block.step = step
        sl = slice(rank * B, (rank + 1) * B)
        with gm:
            out = net(mg.tensor(x_all[step, sl], dtype=dtype))
            gm.backward(F.nn.cross_entropy(out, mg.tensor(y_all[step, sl])))
        opt.step().clear_grad()


def _built(mode, dtype):
    """The net, sharded ("fsdp") or with the all-reduce callback ("ddp"), its trainable
    parameters, GradManager and Adam."""
    net = Net(dtype)
    if mode == "fsdp":
        dist.fully_shard(net.block)
        dist.fully_shard(net)
    params = _trainable(net)
    cbs = [dist.make_allreduce_cb("mean")] if mode == "ddp" else []
    gm = ad.GradManager().attach(params, callbacks=cbs)
    return net, params, gm, optim.Adam(params, lr=0.01)


def _save_worker(mode, dtype):
    """Train 3 steps at this world size; return the full model and optimizer state."""
    n = dist.get_world_size()
    net, params, gm, opt = _built(mode, dtype)
    _steps(net, params, opt, gm, n, range(3), dtype)
    model = dist.full_state_dict(net)
    optimizer = dist.full_optimizer_state_dict(net, opt)
    return model, {"param_groups": optimizer["param_groups"],
                   "state": {str(k): v for k, v in optimizer["state"].items()}}


def _resume_worker(mode, dtype, model, optimizer):
    """Load a full state at this world size (sharded or DDP), train 2 more steps."""
    n = dist.get_world_size()
    net, params, gm, opt = _built(mode, dtype)
    if mode == "fsdp":
        dist.load_full_state_dict(net, model)
        dist.load_full_optimizer_state_dict(net, opt, optimizer)
    else:
        net.load_state_dict(model)
        opt.load_state_dict(optimizer)
    _steps(net, params, opt, gm, n, range(3, 5), dtype)
    return dist.full_state_dict(net)


def test_checkpoint_saved_at_2_ranks_resumes_at_3_sharded_or_ddp():
    saved = run_workers(_save_worker, 2, "fsdp", "float64")
    ddp_saved = run_workers(_save_worker, 2, "ddp", "float64")
    model, optimizer = saved[0]
    assert saved[1][0].keys() == model.keys()
    for name, value in ddp_saved[0][0].items():  # the full state is DDP's, bit for bit
        np.testing.assert_array_equal(model[name], value, err_msg=name)
        assert model[name].shape == value.shape
    for k, st in ddp_saved[0][1]["state"].items():
        for key, value in st.items():
            np.testing.assert_array_equal(optimizer["state"][k][key], value)
    fsdp3 = run_workers(_resume_worker, 3, "fsdp", "float64", model, optimizer)
    ddp3 = run_workers(_resume_worker, 3, "ddp", "float64", model, optimizer)
    for f, d in zip(fsdp3, ddp3):
        assert f.keys() == d.keys()
        for name in d:
            np.testing.assert_allclose(f[name], d[name], rtol=1e-10, atol=1e-14, err_msg=name)
    assert not np.array_equal(fsdp3[0]["head"], model["head"])  # training went on


def _no_sync_worker(mode, n):
    """Three micro-batches per step, the first two without gradient synchronisation."""
    x_all, y_all = _data(n)
    net = Net("float32")
    rank = dist.get_rank()
    params = _trainable(net)
    if mode == "fsdp":
        dist.fully_shard(net.block)
        dist.fully_shard(net)
        params = _trainable(net)
        gm = ad.GradManager().attach(params)
        model, no_sync = net, lambda: dist.no_sync(net)
    else:
        model = dist.DistributedDataParallel(net)
        gm = ad.GradManager().attach(params)
        no_sync = model.no_sync
    opt = optim.Adam(params, lr=0.01)
    calls = []
    for step in range(3):
        net.block.step = 1
        for micro in range(3):
            rows = x_all[step, rank * B:(rank + 1) * B][micro:micro + 2]
            labels = y_all[step, rank * B:(rank + 1) * B][micro:micro + 2]
            ctx = no_sync() if micro < 2 else contextlib.nullcontext()
            with ctx, gm:
                gm.backward(F.nn.cross_entropy(model(mg.tensor(rows, dtype="float32")),
                                               mg.tensor(labels)))
            calls.append(params[0].grad is None if mode == "fsdp" else None)
        opt.step().clear_grad()
    params = _full_params(net) if mode == "fsdp" else [p.numpy() for p in net.parameters()]
    return params, calls


def test_no_sync_accumulates_locally_and_syncs_once_bitwise_ddp():
    ddp = run_workers(_no_sync_worker, 2, "ddp", 2)
    fsdp = run_workers(_no_sync_worker, 2, "fsdp", 2)
    for (pf, calls), (pd, _) in zip(fsdp, ddp):
        assert calls == [True, True, False] * 3  # no piece gradient until the synced backward
        for a, b in zip(pf, pd):
            np.testing.assert_array_equal(a, b)


def _nested_sharded():
    """A float32 Net with its block and itself fully sharded: (net, gm, SGD, an input)."""
    net = Net("float32")
    dist.fully_shard(net.block)
    dist.fully_shard(net)
    gm = ad.GradManager().attach(_trainable(net))
    opt = optim.SGD(_trainable(net), lr=0.1)
    x = mg.tensor(np.ones((2, IN), "float32"))
    return net, gm, opt, x


def _prefetch_worker():
    net, gm, opt, x = _nested_sharded()
    hits = []
    for _ in range(3):
        with gm:
            gm.backward(net(x).sum())
        opt.step().clear_grad()
        hits.append((net._fully_shard.prefetch_hits, net.block._fully_shard.prefetch_hits))
    return hits


def test_the_next_wrapped_module_is_prefetched_from_the_second_forward_on():
    # the root's forward starts the block's gather before running; the first pass learns the order
    for hits in run_workers(_prefetch_worker, 2):
        assert hits == [(0, 0), (0, 1), (0, 2)]


def _skip_backward_worker():
    net, gm, opt, x = _nested_sharded()
    try:
        for _ in range(2):
            with gm:
                loss = net(x).sum()
                if dist.get_rank() == 0:  # rank 1 forgets backward
                    gm.backward(loss)
            opt.step().clear_grad()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_rank_without_backward_fails_on_every_rank_instead_of_mixing_gathers():
    # rank 0's backward gathers Net's parameters again while rank 1, in its next forward,
    # prefetches Block's: both are all-gathers, so only the check string each carries (what it
    # gathers) tells them apart when their sizes agree. Rank 0 raises naming both modules; rank
    # 1 raises too, as a mismatch, or because rank 0 abandoned the collective (no rank hangs)
    msgs = run_workers(_skip_backward_worker, 2, timeout=30, collective_timeout=20)
    assert all(msg is not None for msg in msgs)
    assert "the ranks' all-gathers do not match: rank 0 gathered the parameters of " \
           "fully_shard(Net)" in msgs[0]
    assert "rank 1 sent the parameters of fully_shard(Block)" in msgs[0]
    assert "a rank skipped a backward" in msgs[0]
    # (or, when the failed gather was a prefetch not yet waited for, in its next collective: the
    # group is unusable then, and the message says why)
    unusable = ("is unusable after an earlier collective error" in msgs[1]
                and "fully_shard(Net)" in msgs[1] and "fully_shard(Block)" in msgs[1])
    assert unusable or any(what in msgs[1] for what in (
        "the ranks' all-gathers do not match", "rank(s) [0] aborted", "rank(s) [0] died")), msgs[1]


# -- MixedPrecisionPolicy ------------------------------------------------------------------------
class MPBlock(M.Module):
    """Linear + tanh with float32 parameters; ``cast`` (the hand-built reference): the block
    casts its input and parameters to that dtype itself, as the policy does for fully_shard."""

    def __init__(self, cast=None):
        super().__init__()
        rng = np.random.default_rng(11)
        self.w = mg.Parameter(rng.standard_normal((IN, HID)) * 0.5, dtype="float32")
        self.b = mg.Parameter(rng.standard_normal(HID) * 0.5, dtype="float32")
        self.cast = cast
        self.seen = []  # dtypes of the input and the weight inside forward

    def forward(self, x):
        c = (lambda t: t.astype(self.cast)) if self.cast else (lambda t: t)
        x, w, b = c(x), c(self.w), c(self.b)
        self.seen.append((x.dtype.name, w.dtype.name))
        return F.tanh(F.matmul(x, w) + b)


class MPNet(M.Module):
    def __init__(self, cast=None, out=None):
        super().__init__()
        rng = np.random.default_rng(12)
        self.block = MPBlock(cast)
        self.head = mg.Parameter(rng.standard_normal((HID, OUT)) * 0.5, dtype="float32")
        self.cast, self.out = cast, out

    def forward(self, x):
        c = (lambda t: t.astype(self.cast)) if self.cast else (lambda t: t)
        y = F.matmul(self.block(c(x)), c(self.head))
        return y.astype(self.out) if self.out else y


def _mp_train(mode, reduce_dtype, output_dtype, reshard=True, param_dtype="float16"):
    """``mode``: "ref" (float32 parameters cast to float16 by hand, all-reduce mean in
    ``reduce_dtype``) or "fsdp" (plain float32 model, fully_shard with the policy)."""
    from minigrad.distributed.comm import arrays

    rank, n = dist.get_rank(), dist.get_world_size()
    x_all, y_all = _data(n)
    sent = {"all_gather_into": set(), "reduce_scatter": set()}
    real = {k: getattr(arrays, k) for k in sent}

    def recorder(name):
        def call(x, *args, **kwargs):  # x: all_gather_into's out (the input's dtype) or chunks
            first = x[0] if isinstance(x, list) else x
            sent[name].add(first.dtype.name)
            return real[name](x, *args, **kwargs)
        return call

    if mode == "ref":
        net = MPNet(cast=param_dtype, out=output_dtype)
        cbs = [dist.make_allreduce_cb("mean", reduce_dtype=reduce_dtype or "float32")]
    else:
        net = MPNet()
        policy = dist.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        dist.fully_shard(net.block, reshard_after_forward=reshard, mp_policy=policy)
        # the output dtype on the root only (on the block it would make the head's product
        # float32, by promotion)
        policy = dataclasses.replace(policy, output_dtype=output_dtype)
        dist.fully_shard(net, reshard_after_forward=reshard, mp_policy=policy)
        cbs = []
        for k in sent:
            setattr(arrays, k, recorder(k))
    try:
        params = list(net.parameters())
        gm = ad.GradManager().attach(params, callbacks=cbs)
        opt = optim.Adam(params, lr=0.01)
        out_dtypes, grad_dtypes = set(), set()
        for step in range(3):
            sl = slice(rank * B, (rank + 1) * B)
            with gm:
                out = net(mg.tensor(x_all[step, sl], dtype="float32"))
                out_dtypes.add(out.dtype.name)
                gm.backward(F.nn.cross_entropy(out, mg.tensor(y_all[step, sl])))
            grad_dtypes |= {p.grad.dtype.name for p in params}
            opt.step().clear_grad()
    finally:
        for k, f in real.items():
            setattr(arrays, k, f)
    full = (_full_mp(net) if mode == "fsdp" else [p.numpy() for p in net.parameters()])
    return dict(params=full, seen=set(net.block.seen), out=out_dtypes, grads=grad_dtypes,
                held={p.dtype.name for p in net.parameters()}, sent=sent,
                state={v.dtype.name for st in opt.state_dict()["state"].values()
                       for v in st.values() if getattr(v, "ndim", 0)})


def _full_mp(net):
    found = {}
    for prefix, module in (("", net), ("block.", net.block)):
        state = module._fully_shard
        found.update({prefix + k: np.asarray(a) for k, a in zip(state.names, state.gather())})
    return [found[name] for name, _ in MPNet().named_parameters()]


@pytest.mark.parametrize("reduce_dtype,output_dtype,reshard", [
    (None, None, True), ("float16", None, True), (None, "float32", False)])
def test_mixed_precision_policy_equals_a_hand_cast_float16_model(reduce_dtype, output_dtype,
                                                                 reshard):
    ref = run_workers(_mp_train, 2, "ref", reduce_dtype, output_dtype)
    fsdp = run_workers(_mp_train, 2, "fsdp", reduce_dtype, output_dtype, reshard)
    init = [p.numpy() for p in MPNet().parameters()]
    for f, r in zip(fsdp, ref):
        for a, b, start in zip(f["params"], r["params"], init):
            assert a.dtype == np.float32  # the master weights stay float32
            np.testing.assert_array_equal(a, b)
            assert not np.array_equal(a, start)
        # the module computed in float16, its output as the policy says
        assert f["seen"] == r["seen"] == {("float16", "float16")}
        assert f["out"] == r["out"] == {output_dtype or "float16"}
        # the shards, their gradients and the optimizer state are float32
        assert f["held"] == f["grads"] == f["state"] == {"float32"}
        # gathered in float16; reduced in reduce_dtype (float32 by default)
        assert f["sent"]["all_gather_into"] == {"float16"}
        assert f["sent"]["reduce_scatter"] == {reduce_dtype or "float32"}
    assert not np.array_equal(fsdp[0]["params"][0], run_workers(
        _mp_train, 2, "fsdp", None if reduce_dtype else "float16", output_dtype)[0]["params"][0])


def test_mixed_precision_policy_in_bfloat16_gathers_its_bytes():
    # the collectives carry no bfloat16: the shards travel as bytes and are read back bitwise
    ref = run_workers(_mp_train, 2, "ref", None, None, True, "bfloat16")
    fsdp = run_workers(_mp_train, 2, "fsdp", None, None, True, "bfloat16")
    for f, r in zip(fsdp, ref):
        for a, b in zip(f["params"], r["params"]):
            np.testing.assert_array_equal(a, b)
        assert f["seen"] == r["seen"] == {("bfloat16", "bfloat16")}
        assert f["held"] == f["grads"] == f["state"] == {"float32"}
        assert f["sent"] == {"all_gather_into": {"uint8"}, "reduce_scatter": {"float32"}}


def test_mixed_precision_policy_checks_its_dtypes():
    with pytest.raises(ValueError, match="reduce_dtype: the collectives cannot reduce bfloat16"):
        dist.MixedPrecisionPolicy(param_dtype="bfloat16", reduce_dtype="bfloat16")
    with pytest.raises(ValueError, match="MixedPrecisionPolicy: param_dtype must be a floating "
                                         "dtype, got int32"):
        dist.MixedPrecisionPolicy(param_dtype="int32")
    with pytest.raises(TypeError, match="mp_policy must be a MixedPrecisionPolicy, got dict"):
        dist.fully_shard(MPNet(), mp_policy={"param_dtype": "float16"})
