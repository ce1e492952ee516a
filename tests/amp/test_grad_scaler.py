"""GradScaler: the scale's dynamics against a hand-computed sequence, skipped steps that leave
parameters and optimizer state untouched, MegEngine's and PyTorch's spellings giving the same
training, the state dict round trip, the overflow report naming the parameter, the collapse
error, and two ranks agreeing to skip when only rank 1 overflowed."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import minigrad as mg
import minigrad.amp as amp
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.testing.distributed import run_workers

# the injected inf/nan make NumPy warn about the products it flows through
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

X = np.array([0.5, -1.5, 2.0], np.float32)
X_INF = np.array([0.5, np.inf, 2.0], np.float32)


def _scaled_step(scaler, w, opt, x):
    """One MegEngine-spelling step of ``loss = sum(w * x)`` (its gradient is ``x``)."""
    gm = ad.GradManager().attach([w])
    with gm:
        scaler.backward(gm, (w * mg.tensor(x)).sum())
    grad = None if w.grad is None else w.grad.numpy().copy()
    opt.step().clear_grad()
    return grad


def test_scale_grows_after_interval_and_backs_off_on_overflow():
    """init 16, growth x2 every 3 clean steps, backoff x0.5: the sequence computed by hand."""
    scaler = amp.GradScaler(init_scale=16.0, growth_factor=2.0, backoff_factor=0.5,
                            growth_interval=3, warn=False)
    w = mg.Parameter(np.zeros(3, np.float32))
    opt = optim.SGD([w], lr=0.1)
    events = [False, False, False, True, False, False, False, False, True, True]
    expected = [16, 16, 32, 16, 16, 16, 32, 32, 16, 8]
    trackers = [1, 2, 0, 0, 1, 2, 0, 1, 0, 0]
    scales = []
    for overflow, tracker in zip(events, trackers):
        grad = _scaled_step(scaler, w, opt, X_INF if overflow else X)
        if overflow:
            assert grad is None  # MegEngine: every gradient dropped, the step moves nothing
        else:
            np.testing.assert_array_equal(grad, X)  # unscaled exactly (powers of two)
        scales.append(scaler.scale_factor)
        assert scaler.state_dict()["_growth_tracker"] == tracker
    assert scales == expected
    assert scaler.skipped_steps == 3 and scaler.consecutive_skips == 2


def test_backward_scales_the_output_gradient():
    """The gradient that reaches the parameter before unscaling is scale times the true one."""
    scaler = amp.GradScaler(init_scale=64.0)
    w = mg.Parameter(np.ones(3, np.float32))
    gm = ad.GradManager().attach([w])
    with gm:
        scaler.backward(gm, (w * mg.tensor(X)).sum(), unscale_grad=False)
    np.testing.assert_array_equal(w.grad.numpy(), 64.0 * X)
    scaler.unscale([w])
    np.testing.assert_array_equal(w.grad.numpy(), X)


def test_update_with_new_scale_and_static_scaling():
    scaler = amp.GradScaler(init_scale=8.0, growth_interval=0, warn=False)  # static
    w = mg.Parameter(np.zeros(3, np.float32))
    opt = optim.SGD([w], lr=0.1)
    _scaled_step(scaler, w, opt, X_INF)
    assert scaler.scale_factor == 8.0
    scaler.update(new_scale=1024.0)
    assert scaler.get_scale() == 1024.0


def _adam_net(seed=0):
    mg.random.seed(seed)
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    return net, optim.Adam(net.parameters(), lr=0.05)


def _snapshot(net, opt):
    params = {k: np.array(v, copy=True) for k, v in net.state_dict().items()}
    state = opt.state_dict()["state"]
    return params, {i: {k: np.array(v, copy=True) for k, v in s.items()}
                    for i, s in state.items()}


def _assert_same(a, b):
    pa, sa = a
    pb, sb = b
    assert pa.keys() == pb.keys() and sa.keys() == sb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])
    for i in sa:
        assert sa[i].keys() == sb[i].keys()
        for k in sa[i]:
            np.testing.assert_array_equal(sa[i][k], sb[i][k])


def _batch(step, overflow_steps):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    if step in overflow_steps:
        x[2, 1] = 1e30  # the scaled float16 products overflow
    return mg.tensor(x), mg.tensor(rng.integers(0, 2, 5))


def _loss(net, x, y):
    with amp.autocast():
        return F.nn.cross_entropy(net(x), y)


def _train_step(spelling, net, opt, gm, scaler, x, y, unscale_first=False):
    """One scaled step in MegEngine's spelling (``scaler.backward(gm, loss)``, then the optimizer)
    or PyTorch's (``scale``, ``step``, ``update``)."""
    with gm:
        loss = _loss(net, x, y)
        if spelling == "megengine":
            scaler.backward(gm, loss)
        else:
            gm.backward(scaler.scale(loss))
    if spelling == "megengine":
        opt.step().clear_grad()
        return
    if unscale_first:
        scaler.unscale_(opt)
    scaler.step(opt).clear_grad()
    scaler.update()


@pytest.mark.parametrize("spelling", ["megengine", "pytorch"])
def test_skipped_step_leaves_parameters_and_optimizer_state_untouched(spelling):
    net, opt = _adam_net()
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net, warn=False)
    for step in range(3):
        before = _snapshot(net, opt)
        _train_step(spelling, net, opt, gm, scaler, *_batch(step, overflow_steps={2}))
        after = _snapshot(net, opt)
        if step == 2:
            _assert_same(before, after)
            assert scaler.scale_factor == 8.0
        else:
            with pytest.raises(AssertionError):
                _assert_same(before, after)
    assert scaler.last_overflow is not None and scaler.skipped_steps == 1


def test_pytorch_spelling_trains_exactly_like_megengine_spelling():
    runs = {}
    for spelling in ("megengine", "pytorch"):
        net, opt = _adam_net(seed=3)
        gm = ad.GradManager().attach(net.parameters())
        scaler = amp.GradScaler(growth_interval=2, module=net, warn=False)
        history = []
        for step in range(7):
            x, y = _batch(step, overflow_steps={3, 4})
            # PyTorch's spelling with an explicit unscale_, as before gradient clipping
            _train_step(spelling, net, opt, gm, scaler, x, y, unscale_first=True)
            history.append((scaler.scale_factor, _snapshot(net, opt)))
        runs[spelling] = history
    scales = [s for s, _ in runs["megengine"]]
    assert scales == [16, 32, 32, 16, 8, 8, 16]
    assert scales == [s for s, _ in runs["pytorch"]]
    for (_, a), (_, b) in zip(runs["megengine"], runs["pytorch"]):
        _assert_same(a, b)


def test_unscale_twice_is_an_error():
    net, opt = _adam_net()
    scaler = amp.GradScaler()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already called for this optimizer"):
        scaler.unscale_(opt)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration


def test_state_dict_round_trip_through_a_checkpoint():
    scaler = amp.GradScaler(init_scale=32.0, growth_interval=4, warn=False)
    w = mg.Parameter(np.zeros(3, np.float32))
    opt = optim.SGD([w], lr=0.1)
    for x in (X, X, X_INF, X, X):
        _scaled_step(scaler, w, opt, x)
    buf = io.BytesIO()
    mg.save(scaler.state_dict(), buf)
    buf.seek(0)
    restored = amp.GradScaler(warn=False).load_state_dict(mg.load(buf))
    assert restored.state_dict() == scaler.state_dict()
    assert restored.state_dict()["_growth_tracker"] == 2 and restored.scale_factor == 16.0
    w2 = mg.Parameter(w.numpy())
    opt2 = optim.SGD([w2], lr=0.1)
    for _ in range(2):  # both reach the growth interval on the same step
        _scaled_step(scaler, w, opt, X)
        _scaled_step(restored, w2, opt2, X)
        assert restored.scale_factor == scaler.scale_factor
    assert scaler.scale_factor == 32.0


def test_load_state_dict_names_missing_keys():
    with pytest.raises(ValueError, match=r"missing keys \['_growth_tracker'\]"):
        amp.GradScaler().load_state_dict({"scale_factor": 1.0, "growth_factor": 2.0,
                                          "backoff_factor": 0.5, "growth_interval": 10})


def _net_with_overflow_in(name_of_bad):
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    bad = dict(net.named_parameters())[name_of_bad]
    gm = ad.GradManager().attach(net.parameters())
    return net, bad, gm


def _overflow_step(scaler, net, bad, gm):
    poison = np.zeros(bad.shape, np.float32)
    poison.reshape(-1)[0] = np.inf
    with gm:
        loss = net(mg.tensor(X[None])).sum() + (bad * mg.tensor(poison)).sum()
        scaler.backward(gm, loss)


def test_overflow_report_names_the_parameter():
    net, bad, gm = _net_with_overflow_in("2.weight")
    scaler = amp.GradScaler(module=net)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _overflow_step(scaler, net, bad, gm)
    report = scaler.last_overflow
    assert report.tensors == {0: ["2.weight"]}
    assert (report.scale_before, report.scale_after, report.consecutive) == (16.0, 8.0, 1)
    messages = [str(w.message) for w in caught if issubclass(w.category, amp.OverflowWarning)]
    assert len(messages) == 1
    assert "rank 0: 2.weight" in messages[0] and "16 -> 8" in messages[0]
    assert "0.weight" not in messages[0]


def test_overflow_report_without_a_module_uses_names_or_positions():
    w = mg.Parameter(np.zeros(3, np.float32), name="head.w")
    v = mg.Parameter(np.zeros(2, np.float32))
    gm = ad.GradManager().attach([w, v])
    scaler = amp.GradScaler(warn=False)
    with gm:
        scaler.backward(gm, (w * mg.tensor(X_INF)).sum() + (v * mg.tensor([np.nan, 1.0])).sum())
    assert scaler.last_overflow.tensors == {0: ["head.w", "tensor 1 (shape (2,), float32)"]}


def test_debug_names_the_first_module_whose_forward_overflowed():
    mg.random.seed(0)
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net, debug=True, warn=False)
    x = mg.tensor(np.full((1, 3), 1e5, np.float32))  # float16 products overflow in layer 0
    with gm:
        with amp.autocast():
            out = net(x)
        scaler.backward(gm, out.astype("float32").sum())
    report = scaler.last_overflow
    # the first op: autocast's cast of the float32 input (1e5 > float16's 65504) to float16
    assert report.first_forward == {
        0: "op AsType(float32 (1, 3)); innermost module: 0 (Linear, output float16 (1, 4))"}
    assert "first non-finite forward output on rank 0: op AsType(float32 (1, 3))" in str(report)
    with gm:  # a clean iteration afterwards reports nothing
        with amp.autocast():
            out = net(mg.tensor(X[None]))
        scaler.backward(gm, out.astype("float32").sum())
    assert scaler.last_overflow is report and scaler.consecutive_skips == 0
    with pytest.raises(ValueError, match="debug=True needs module="):
        amp.GradScaler(debug=True)


class _Growth(M.Module):
    def forward(self, x):
        return F.exp(x * 100.0)  # float32 exp overflows past 88


def test_debug_names_the_first_op_whose_output_overflowed_and_keeps_the_profiler(tmp_path):
    from minigrad.utils.profiler import Profiler

    net = M.Sequential(M.Linear(2, 2), _Growth(), M.Linear(2, 1))
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net, debug=True, warn=False)
    with Profiler(str(tmp_path)) as prof:  # a running profiler still gets every op
        with gm:
            out = net(mg.tensor(np.full((1, 2), 3.0, np.float32)))
            scaler.backward(gm, out.sum())
    first = scaler.last_overflow.first_forward[0]
    assert first.startswith("op Exp(float32 (1, 2)); innermost module: 1 (_Growth"), first
    assert any(e["cat"] == "op" and e["name"] == "Exp" for e in prof.events)
    from minigrad import seams
    assert seams.TRACER.value is None  # the watcher is gone after the forward


def test_too_many_consecutive_skips_raise():
    net, bad, gm = _net_with_overflow_in("0.bias")
    scaler = amp.GradScaler(module=net, max_consecutive_skips=3, warn=False)
    _overflow_step(scaler, net, bad, gm)
    _overflow_step(scaler, net, bad, gm)
    with pytest.raises(amp.LossScaleCollapse, match=r"0\.bias.*3 step\(s\) skipped in a row"):
        _overflow_step(scaler, net, bad, gm)


def test_disabled_scaler_is_a_pass_through():
    scaler = amp.GradScaler(enabled=False)
    w = mg.Parameter(np.zeros(3, np.float32))
    opt = optim.SGD([w], lr=1.0)
    grad = _scaled_step(scaler, w, opt, X)
    np.testing.assert_array_equal(grad, X)
    np.testing.assert_array_equal(w.numpy(), -X)
    assert scaler.scale(mg.tensor(2.0)).item() == 2.0


# -- two ranks ---------------------------------------------------------------------------------


def _two_rank_worker():
    import minigrad.distributed as dist

    rank = dist.get_rank()
    mg.random.seed(0)  # the same model on both ranks
    net = M.Sequential(M.Linear(3, 4), M.ReLU(), M.Linear(4, 2))
    opt = optim.SGD(net.parameters(), lr=0.1)
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net, growth_interval=2, warn=False)
    scales, moved, reports = [], [], []
    for step in range(4):
        x = np.random.default_rng(10 * step + rank).standard_normal((4, 3)).astype(np.float32)
        if rank == 1 and step == 1:
            x[0, 0] = 1e30  # only rank 1's gradients overflow
        before = {k: np.array(v, copy=True) for k, v in net.state_dict().items()}
        with gm:
            with amp.autocast():
                loss = F.nn.cross_entropy(net(mg.tensor(x)), mg.tensor([0, 1, 0, 1]))
            scaler.backward(gm, loss)
        opt.step().clear_grad()
        after = net.state_dict()
        moved.append(any(not np.array_equal(before[k], after[k]) for k in before))
        scales.append(scaler.scale_factor)
        reports.append(None if scaler.last_overflow is None else dict(scaler.last_overflow.tensors))
    return scales, moved, reports


def test_two_ranks_skip_together_when_only_rank_1_overflows():
    (s0, m0, r0), (s1, m1, r1) = run_workers(_two_rank_worker, 2, timeout=120)
    assert s0 == s1 == [16, 8, 8, 16]
    assert m0 == m1 == [True, False, True, True]
    assert r0[1] == r1[1] and set(r0[1]) == {1}  # both ranks' reports: found on rank 1
    assert "0.weight" in r0[1][1]
    assert r0[0] is None and r1[0] is None


def _tensor_parallel_worker():
    import minigrad.distributed as dist
    from minigrad.distributed import tensor_parallel as tp

    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    tp.reset_layout()
    rank = dist.get_rank()
    mg.random.seed(0)
    net = M.Sequential(tp.Linear(3, 8), M.ReLU(), tp.Linear(8, 2))  # column, then row parallel
    opt = optim.SGD(net.parameters(), lr=0.1)
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(module=net, warn=False)
    shard = dict(net.named_parameters())["0.weight"]
    scales, moved = [], []
    for step in range(3):
        before = [np.array(p.numpy(), copy=True) for p in net.parameters()]
        with gm:
            loss = net(mg.tensor(X[None])).sum()
            if rank == 1 and step == 1:  # rank 1's shard of the first weight overflows
                poison = np.zeros(shard.shape, np.float32)
                poison.reshape(-1)[0] = np.inf
                loss = loss + (shard * mg.tensor(poison)).sum()
            scaler.backward(gm, loss)
        opt.step().clear_grad()
        moved.append(any(not np.array_equal(b, p.numpy()) for b, p in zip(before,
                                                                         net.parameters())))
        scales.append(scaler.scale_factor)
    return scales, moved, dict(scaler.last_overflow.tensors)


def test_tensor_parallel_ranks_skip_together_when_one_shard_overflows():
    (s0, m0, r0), (s1, m1, r1) = run_workers(_tensor_parallel_worker, 2, timeout=120)
    assert s0 == s1 == [16, 8, 8]
    assert m0 == m1 == [True, False, True]
    assert r0 == r1 == {1: ["0.weight"]}
