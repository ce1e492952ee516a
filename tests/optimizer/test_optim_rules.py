"""Every optimizer against an independent NumPy float64 re-implementation of its update rule."""

import numpy as np
import pytest
from minigrad.tensor import Parameter

import minigrad as mg
import minigrad.optimizer as optim

SHAPES = [(3, 4), (5,)]
STEPS = 6


def _grads(seed):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(s) for s in SHAPES] for _ in range(STEPS)]


def _init(seed=0):
    rng = np.random.default_rng(100 + seed)
    return [rng.standard_normal(s) for s in SHAPES]


# -- references (written in the PyTorch formulation where it differs in form) ----------------------
def ref_sgd(p, grads, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
    buf = None
    for g in grads:
        d = g + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def ref_adam(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g**2
        denom = np.sqrt(v) / np.sqrt(1 - betas[1] ** t) + eps
        p = p - (lr / (1 - betas[0] ** t)) * m / denom
    return p


def ref_adagrad(p, grads, lr, lr_decay=0.0, eps=1e-10, weight_decay=0.0):
    s = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g = g + weight_decay * p
        s += g * g
        p = p - lr / (1 + (t - 1) * lr_decay) * g / np.sqrt(s + eps)
    return p


def ref_adadelta(p, grads, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
    s = np.zeros_like(p)
    u = np.zeros_like(p)
    for g in grads:
        g = g + weight_decay * p
        s = rho * s + (1 - rho) * g * g
        d = np.sqrt(u + eps) / np.sqrt(s + eps) * g
        u = rho * u + (1 - rho) * d * d
        p = p - lr * d
    return p


def ref_lamb(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, always_adapt=False,
             bias_correction=True):
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        mh, vh = (m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)) if bias_correction else (m, v)
        u = mh / (np.sqrt(vh) + eps) + weight_decay * p
        r = 1.0
        if weight_decay or always_adapt:
            pn, un = np.linalg.norm(p), np.linalg.norm(u)
            r = pn / un if pn > 0 and un > 0 else 1.0
        p = p - lr * r * u
    return p


CASES = [
    (optim.SGD, ref_sgd, dict(lr=0.1)),
    (optim.SGD, ref_sgd, dict(lr=0.05, momentum=0.9, weight_decay=1e-2)),
    (optim.SGD, ref_sgd, dict(lr=0.05, momentum=0.8, nesterov=True)),
    (optim.Adam, ref_adam, dict(lr=1e-2)),
    (optim.Adam, ref_adam, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (optim.AdamW, lambda p, g, **kw: ref_adam(p, g, decoupled=True, **kw),
     dict(lr=1e-2, weight_decay=0.1)),
    (optim.Adagrad, ref_adagrad, dict(lr=0.1)),
    (optim.Adagrad, ref_adagrad, dict(lr=0.1, lr_decay=0.05, weight_decay=0.01)),
    (optim.Adadelta, ref_adadelta, dict(lr=1.0)),
    (optim.Adadelta, ref_adadelta, dict(lr=0.5, rho=0.8, weight_decay=0.01)),
    (optim.LAMB, ref_lamb, dict(lr=1e-2)),
    (optim.LAMB, ref_lamb, dict(lr=1e-2, weight_decay=0.1)),
    (optim.LAMB, ref_lamb, dict(lr=1e-2, always_adapt=True, bias_correction=False)),
]


@pytest.mark.parametrize("cls,ref,kw", CASES, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in
                                                   enumerate(CASES)])
def test_update_rule_matches_float64_reference(cls, ref, kw, device):
    init = _init()
    grads = _grads(1)
    params = [Parameter(a, dtype="float64", device=device) for a in init]
    opt = cls(params, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = mg.tensor(g, dtype="float64", device=device)
        assert opt.step() is opt
        opt.clear_grad()
        assert all(p.grad is None for p in params)
    for i, p in enumerate(params):
        expect = ref(init[i], [g[i] for g in grads], **kw)
        np.testing.assert_allclose(p.numpy(), expect, rtol=1e-10, atol=1e-12)
        assert not np.allclose(expect, init[i])  # the test would notice a no-op optimizer


@pytest.mark.parametrize("cls,ref,kw", CASES[1::3])
def test_float32_params_stay_float32_and_track_reference(cls, ref, kw, device):
    init = _init()
    grads = _grads(2)
    params = [Parameter(a.astype(np.float32), device=device) for a in init]
    opt = cls(params, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = mg.tensor(g.astype(np.float32), device=device)
        opt.step()
    for i, p in enumerate(params):
        assert p.dtype == np.float32
        expect = ref(init[i].astype(np.float32).astype(np.float64), [g[i] for g in grads], **kw)
        np.testing.assert_allclose(p.numpy(), expect, rtol=1e-4, atol=1e-5)


def test_param_groups_have_their_own_hyperparameters():
    init = _init()
    grads = _grads(3)
    a, b = (Parameter(x, dtype="float64") for x in init)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5, "momentum": 0.5}], lr=0.1)
    for g in grads:
        a.grad, b.grad = mg.tensor(g[0], dtype="float64"), mg.tensor(g[1], dtype="float64")
        opt.step()
    np.testing.assert_allclose(a.numpy(), ref_sgd(init[0], [g[0] for g in grads], lr=0.1))
    np.testing.assert_allclose(
        b.numpy(), ref_sgd(init[1], [g[1] for g in grads], lr=0.5, momentum=0.5))
    c = Parameter(np.ones(2))
    opt.add_param_group({"params": c, "lr": 0.0})
    assert opt.param_groups[2]["momentum"] == 0.0 and len(opt.param_groups) == 3


def test_params_without_grad_are_skipped():
    a, b = Parameter(np.ones(3)), Parameter(np.ones(3))
    opt = optim.Adam([a, b], lr=0.1, weight_decay=0.5)
    a.grad = mg.tensor(np.ones(3))
    opt.step()
    np.testing.assert_array_equal(b.numpy(), 1.0)
    assert not np.allclose(a.numpy(), 1.0)
    assert list(opt.state_dict()["state"]) == [0]


def test_bad_construction_is_reported():
    with pytest.raises(TypeError, match="SGD: can only optimize Parameters, but parameter 1 of "
                                        "group 0 is a Tensor"):
        optim.SGD([Parameter(np.ones(2)), mg.tensor(np.ones(2))], lr=0.1)
    p = Parameter(np.ones(2))
    with pytest.raises(ValueError, match="more than one"):
        optim.SGD([p, p], lr=0.1)
    with pytest.raises(ValueError, match="'lr' is required"):
        optim.SGD([p])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([], lr=0.1)
    with pytest.raises(ValueError, match="lr must be >= 0, got -1"):
        optim.Adam([p], lr=-1)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], lr=0.1, betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
