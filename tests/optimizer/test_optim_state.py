"""Optimizer state dicts (resume equivalence, validation), gradient clipping, LR schedulers."""

import math

import numpy as np
import pytest
from minigrad.tensor import Parameter

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.module as M
import minigrad.optimizer as optim


def _run(opt, params, grads):
    for g in grads:
        for p, gi in zip(params, g, strict=True):
            p.grad = mg.tensor(gi)
        opt.step().clear_grad()


@pytest.mark.parametrize("cls,kw", [
    (optim.SGD, dict(lr=0.1, momentum=0.9)), (optim.Adam, dict(lr=0.01)),
    (optim.AdamW, dict(lr=0.01)), (optim.Adagrad, dict(lr=0.1)), (optim.Adadelta, {}),
    (optim.LAMB, dict(lr=0.01, weight_decay=0.01)),
])
def test_resume_from_state_dict_is_bit_identical(cls, kw):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3,)]]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in init] for _ in range(8)]
    straight = [Parameter(a) for a in init]
    _run(cls(straight, **kw), straight, grads)

    first = [Parameter(a) for a in init]
    opt = cls(first, **kw)
    _run(opt, first, grads[:4])
    saved = opt.state_dict()
    resumed = [Parameter(p.numpy()) for p in first]
    opt2 = cls(resumed, **{**kw, "lr": 123.0} if "lr" in kw else kw)
    opt2.load_state_dict(saved)
    _run(opt2, resumed, grads[4:])
    for a, b in zip(straight, resumed, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # the saved state is a snapshot, not a view of the live buffers
    _run(opt, first, grads[4:5])
    again = opt.state_dict()
    key = next(iter(saved["state"]))
    for name, value in saved["state"][key].items():
        if isinstance(value, np.ndarray):
            assert not np.array_equal(value, again["state"][key][name])


def test_load_state_dict_validates():
    p, q = Parameter(np.ones(3, np.float32)), Parameter(np.ones(2, np.float32))
    opt = optim.Adam([p, q], lr=0.1)
    p.grad, q.grad = mg.tensor(np.ones(3, np.float32)), mg.tensor(np.ones(2, np.float32))
    opt.step()
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="1 param group"):
        optim.Adam([{"params": [p]}, {"params": [q]}], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="2 parameter"):
        optim.Adam([p], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"has shape \(3,\), expected \(2,\)"):
        optim.Adam([q, p], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="'param_groups' and 'state'"):
        opt.load_state_dict({"state": {}})


def test_clip_grad_norm_matches_numpy_and_clips():
    rng = np.random.default_rng(0)
    ps = [Parameter(rng.standard_normal(s)) for s in [(3, 4), (5,)]]
    gs = [rng.standard_normal(p.shape) * 3 for p in ps]
    for p, g in zip(ps, gs, strict=True):
        p.grad = mg.tensor(g)
    expect = math.sqrt(sum((g**2).sum() for g in gs))
    total = optim.clip_grad_norm(ps, max_norm=1.0)
    assert total.item() == pytest.approx(expect, rel=1e-6)
    scale = 1.0 / (expect + 1e-6)
    for p, g in zip(ps, gs, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g * scale, rtol=1e-12)
    # under the limit: untouched; inf-norm: the max |g|
    before = [p.grad.numpy() for p in ps]
    assert optim.clip_grad_norm(ps, max_norm=10.0).item() == pytest.approx(1.0, rel=1e-5)
    for p, b in zip(ps, before, strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), b)
    inf = optim.clip_grad_norm(ps, max_norm=10.0, ord=float("inf")).item()
    assert inf == pytest.approx(max(np.abs(b).max() for b in before), rel=1e-6)


def test_clip_grad_value():
    p = Parameter(np.zeros(5))
    p.grad = mg.tensor(np.array([-3.0, -0.5, 0.0, 0.7, 9.0]))
    optim.clip_grad_value(p, -1.0, 0.5)
    np.testing.assert_array_equal(p.grad.numpy(), [-1.0, -0.5, 0.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="lower"):
        optim.clip_grad_value(p, 1.0, 0.0)


def _opt(lr=1.0):
    return optim.SGD([{"params": [Parameter(np.ones(1))]},
                      {"params": [Parameter(np.ones(1))], "lr": lr * 10}], lr=lr)


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def test_multistep_lr_megengine_semantics():
    opt = _opt(0.1)
    sched = optim.MultiStepLR(opt, milestones=[2, 5], gamma=0.5)
    seen = []
    for _ in range(7):
        seen.append(_lrs(opt)[0])
        sched.step()
    expect = [0.1 * 0.5 ** sum(e >= m for m in (2, 5)) for e in range(7)]
    np.testing.assert_allclose(seen, expect)
    assert _lrs(opt)[1] == pytest.approx(1.0 * 0.25)


def test_step_and_cosine_lr():
    opt = _opt(1.0)
    sched = optim.StepLR(opt, step_size=3, gamma=0.1)
    for e in range(8):
        assert _lrs(opt)[0] == pytest.approx(0.1 ** (e // 3))
        sched.step()
    opt = _opt(1.0)
    sched = optim.CosineAnnealingLR(opt, T_max=10, eta_min=0.1)
    for e in range(13):
        expect = 0.1 + 0.9 * (1 + math.cos(math.pi * min(e, 10) / 10)) / 2
        assert _lrs(opt)[0] == pytest.approx(expect)
        assert _lrs(opt)[1] == pytest.approx(0.1 + 9.9 * (expect - 0.1) / 0.9)
        sched.step()


def test_linear_warmup_then_cosine_and_state_round_trip():
    opt = _opt(1.0)
    sched = optim.LinearWarmup(opt, warmup_steps=4, start_factor=0.2,
                               scheduler=optim.CosineAnnealingLR(opt, T_max=6))
    seen = []
    for _ in range(12):
        seen.append(_lrs(opt)[0])
        sched.step()
    warm = [0.2 + 0.8 * e / 4 for e in range(4)]
    cos = [(1 + math.cos(math.pi * min(e, 6) / 6)) / 2 for e in range(8)]
    np.testing.assert_allclose(seen, warm + cos)

    opt2 = _opt(1.0)
    sched2 = optim.LinearWarmup(opt2, warmup_steps=4, start_factor=0.2,
                                scheduler=optim.CosineAnnealingLR(opt2, T_max=6))
    opt3 = _opt(1.0)
    for _ in range(5):
        sched2.step()
    sched3 = optim.LinearWarmup(opt3, warmup_steps=4, start_factor=0.2,
                                scheduler=optim.CosineAnnealingLR(opt3, T_max=6))
    sched3.load_state_dict(sched2.state_dict())
    assert _lrs(opt3) == _lrs(opt2)
    sched2.step()
    sched3.step()
    assert _lrs(opt3) == _lrs(opt2) and sched3.current_epoch == 6
    with pytest.raises(ValueError, match="unexpected keys"):
        sched3.load_state_dict({"bogus": 1})


@pytest.mark.gpu
def test_optimizers_and_clipping_on_gpu_match_cpu():
    if not mg.is_cuda_available():
        pytest.skip("needs CUDA")
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(np.float32)
    grads = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(3)]
    for cls, kw in [(optim.SGD, dict(lr=0.1, momentum=0.9)), (optim.Adam, dict(lr=0.01)),
                    (optim.LAMB, dict(lr=0.01, weight_decay=0.1))]:
        results = []
        for dev in ["cpu0", "gpu0"]:
            p = Parameter(init, device=dev)
            opt = cls([p], **kw)
            for g in grads:
                p.grad = mg.tensor(g, device=dev)
                optim.clip_grad_norm([p], 1.0)
                opt.step()
            assert str(p.device) == dev
            results.append(p.numpy())
        np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, kw", [(optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                     (optim.Adam, {"lr": 0.1})])
def test_in_place_updates_never_write_into_callers_arrays(cls, kw):
    # optimizers update parameters in place: a loaded state dict, a read-only array and the
    # gradient must all be left as they were
    net = M.Linear(3, 2)
    saved = net.state_dict()
    frozen = {k: v.copy() for k, v in saved.items()}
    net.load_state_dict(saved)
    readonly = np.ones((2,), np.float32)
    readonly.flags.writeable = False
    net.bias._data = readonly  # e.g. an array handed out by a memory-mapped checkpoint
    opt = cls(net.parameters(), **kw)
    gm = ad.GradManager().attach(net.parameters())
    with gm:
        gm.backward(net(mg.tensor(np.ones((4, 3), np.float32))).sum())
    grads = {id(p): p.grad.numpy().copy() for p in net.parameters()}
    opt.step()
    for k in saved:
        np.testing.assert_array_equal(saved[k], frozen[k], err_msg=k)
    np.testing.assert_array_equal(readonly, np.ones(2))
    for p in net.parameters():
        np.testing.assert_array_equal(p.grad.numpy(), grads[id(p)])
        assert not np.array_equal(p.numpy(), frozen["weight" if p.ndim == 2 else "bias"])


def test_zero_grad_fills_zeros_and_clear_grad_drops_everywhere():
    lin = M.Linear(3, 2)
    unused = Parameter(np.ones(2, np.float32))
    opt = optim.SGD([*lin.parameters(), unused], lr=0.1, weight_decay=0.5)
    gm = ad.GradManager().attach(lin.parameters())
    with gm:
        gm.backward(lin(mg.tensor(np.ones((4, 3), np.float32))).sum())
    grad_before = lin.weight.grad
    opt.zero_grad()
    np.testing.assert_array_equal(lin.weight.grad.numpy(), 0.0)
    assert lin.weight.grad is not grad_before and grad_before.numpy().any()  # a new zero array
    assert unused.grad is None  # no gradient stays no gradient
    w = lin.weight.numpy()
    opt.step()  # a zero gradient still steps: weight decay acts
    np.testing.assert_allclose(lin.weight.numpy(), w * (1 - 0.1 * 0.5), rtol=1e-6)
    lin.weight.grad = mg.tensor(np.ones((2, 3), np.float32))
    lin.zero_grad()  # the module's zero_grad means the same
    np.testing.assert_array_equal(lin.weight.grad.numpy(), 0.0)
    opt.clear_grad()
    assert all(p.grad is None for p in lin.parameters())
    w = lin.weight.numpy()
    opt.step()  # a cleared gradient skips the parameter
    np.testing.assert_array_equal(lin.weight.numpy(), w)


def test_optimizer_and_scheduler_reprs_show_hyper_parameters():
    a, b = Parameter(np.zeros(3, np.float32)), Parameter(np.zeros(2, np.float32))
    sgd = optim.SGD([a, b], lr=0.1, momentum=0.9)
    assert repr(sgd) == "SGD(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, params=2)"
    adam = optim.Adam([{"params": [a]}, {"params": [b], "weight_decay": 0.01}], lr=1e-3)
    assert repr(adam) == (
        "Adam(2 param groups\n"
        "  (0): lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0, params=1\n"
        "  (1): weight_decay=0.01, lr=0.001, betas=(0.9, 0.999), eps=1e-08, params=1\n)")
    sched = optim.MultiStepLR(sgd, milestones=[2, 4], gamma=0.5)
    assert repr(sched) == "MultiStepLR(milestones=[2, 4], gamma=0.5, current_epoch=0, lr=[0.1])"
    sched.step(), sched.step()
    assert repr(sched).endswith("current_epoch=2, lr=[0.05])")
    assert repr(optim.StepLR(sgd, step_size=3)).startswith("StepLR(step_size=3, gamma=0.1, ")
    cos = optim.CosineAnnealingLR(optim.SGD([a], lr=1.0), T_max=4)
    warm = optim.LinearWarmup(cos.optimizer, warmup_steps=2, scheduler=cos)
    assert repr(warm) == (
        "LinearWarmup(warmup_steps=2, start_factor=0.0, scheduler=CosineAnnealingLR(T_max=4, "
        "eta_min=0.0, current_epoch=-2, lr=[0]), current_epoch=0, lr=[0])")
