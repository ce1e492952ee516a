"""float32 master weights (``amp.master_weights``) and end-to-end mixed-precision training: a
tiny MLP trained with autocast (float16 and bfloat16) and loss scaling ends close to the float32
run from the same start."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.amp as amp
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim

C = np.array([1.0, -0.5, 0.25, 2.0], np.float32)  # exact in float16: the gradient of sum(w * C)
W0 = np.array([1.0, 0.5, -2.0, 3.0], np.float32)


def _sgd_steps(w, opt, steps):
    gm = ad.GradManager().attach([w])
    for _ in range(steps):
        with gm:
            gm.backward((w * mg.tensor(C, dtype=w.dtype)).sum())
        opt.step().clear_grad()


def test_twenty_sgd_steps_equal_float32_to_the_final_rounding():
    """lr * C is below float16's spacing near W0: plain float16 SGD stands still, the master copy
    takes every step, and the float16 parameter is the float32 run rounded."""
    w32 = mg.Parameter(W0)
    _sgd_steps(w32, optim.SGD([w32], lr=1e-4), 20)

    w16 = mg.Parameter(W0, dtype="float16")
    opt = amp.master_weights(optim.SGD([w16], lr=1e-4))
    _sgd_steps(w16, opt, 20)
    master = opt.param_groups[0]["params"][0]
    assert master.dtype == np.float32 and w16.dtype == np.float16
    np.testing.assert_array_equal(master.numpy(), w32.numpy())
    np.testing.assert_array_equal(w16.numpy(), w32.numpy().astype(np.float16))
    assert not np.array_equal(w16.numpy(), W0.astype(np.float16))  # it did move

    plain = mg.Parameter(W0, dtype="float16")
    _sgd_steps(plain, optim.SGD([plain], lr=1e-4), 20)
    np.testing.assert_array_equal(plain.numpy(), W0.astype(np.float16))  # float16 alone drifts


def test_master_weights_with_the_pytorch_spelling_unscale_in_float32():
    """``unscale_`` on the wrapper unscales the float32 master gradients: a gradient too small
    for float16 after unscaling (1e-8, below its smallest subnormal) still reaches the master."""
    w = mg.Parameter(np.zeros(2, np.float32), dtype="float16")
    opt = amp.master_weights(optim.SGD([w], lr=1.0))
    scaler = amp.GradScaler(init_scale=2.0**20)
    gm = ad.GradManager().attach([w])
    tiny = np.array([1e-8, 2e-8], np.float32)
    with gm:
        gm.backward(scaler.scale((w.astype("float32") * mg.tensor(tiny)).sum()))
    scaler.step(opt)
    scaler.update()
    master = opt.param_groups[0]["params"][0]
    np.testing.assert_allclose(-master.numpy(), tiny, rtol=2e-3)
    assert np.float16(tiny[0]) == 0  # float16 alone would have lost it


def test_master_weights_state_dict_round_trip_and_float32_parameters_pass_through():
    w16 = mg.Parameter(W0, dtype="float16")
    b32 = mg.Parameter(np.zeros(2, np.float32))
    opt = amp.master_weights(optim.Adam([w16, b32], lr=1e-2))
    assert opt.param_groups[0]["params"][1] is b32
    assert opt.model_parameters() == [w16, b32]
    gm = ad.GradManager().attach([w16, b32])
    for _ in range(3):
        with gm:
            gm.backward((w16 * mg.tensor(C, dtype="float16")).sum() + b32.sum())
        opt.step().clear_grad()
    state = opt.state_dict()
    w16b = mg.Parameter(W0, dtype="float16")
    b32b = mg.Parameter(b32.numpy())
    opt2 = amp.master_weights(optim.Adam([w16b, b32b], lr=1e-2)).load_state_dict(state)
    np.testing.assert_array_equal(w16b.numpy(), w16.numpy())
    np.testing.assert_array_equal(opt2.param_groups[0]["params"][0].numpy(),
                                  opt.param_groups[0]["params"][0].numpy())
    assert opt2.state_dict()["optimizer"]["state"][0]["step"] == 3


def test_master_weights_refuse_an_optimizer_with_state():
    w = mg.Parameter(W0, dtype="float16")
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    _sgd_steps(w, opt, 1)
    with pytest.raises(ValueError, match="wrap it before its first step"):
        amp.master_weights(opt)


# -- end to end -------------------------------------------------------------------------------


def _blobs(n=128, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    x = centers[y] + rng.standard_normal((n, 2)) * 0.7
    return mg.tensor(x.astype(np.float32)), mg.tensor(y)


def _train(mode, steps=120):
    mg.random.seed(7)
    net = M.Sequential(M.Linear(2, 32), M.ReLU(), M.Linear(32, 32), M.ReLU(), M.Linear(32, 3))
    opt = optim.Adam(net.parameters(), lr=1e-2)
    gm = ad.GradManager().attach(net.parameters())
    scaler = amp.GradScaler(init_scale=2.0**10, growth_interval=20, module=net)
    x, y = _blobs()
    losses = []
    for _ in range(steps):
        with gm:
            if mode == "float32":
                loss = F.nn.cross_entropy(net(x), y)
                gm.backward(loss)
            else:
                with amp.autocast(low_prec_dtype=mode):
                    loss = F.nn.cross_entropy(net(x), y)
                assert loss.dtype == np.float32
                scaler.backward(gm, loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    return losses, scaler


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_tiny_mlp_with_amp_reaches_the_float32_loss(low):
    ref, _ = _train("float32")
    got, scaler = _train(low)
    assert ref[-1] < 0.1 * ref[0]  # it learns (1.13 -> 0.028)
    final_ref, final_got = np.mean(ref[-10:]), np.mean(got[-10:])
    assert abs(final_got - final_ref) < 0.1 * final_ref, (final_got, final_ref)
    assert scaler.scale_factor >= 2.0**10  # no collapse: it grew or stayed
