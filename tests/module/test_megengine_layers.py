"""Layers and layer options added for MegEngine compatibility: BatchNorm(freeze=True), InstanceNorm,
ConvTranspose2d(output_padding=), Conv3d, M.Elemwise, MegEngine's grouped-weight layout (and its
fan-in/fan-out rule), and loading a state_dict laid out as MegEngine writes it. Each test's
docstring names the documented MegEngine behaviour it checks."""

from __future__ import annotations

import numpy as np
import pytest
from module_test_helpers import layer_check_grad, to_float64
from numpy_references import ref_conv2d, ref_conv_transpose2d

import minigrad as mg
import minigrad.functional as F
import minigrad.module as M
from minigrad.module import init

RNG = np.random.default_rng(7)


def _x(*shape):
    return RNG.standard_normal(shape)


def _run(layer, *xs):
    return layer(*[mg.tensor(x, dtype="float64") for x in xs]).numpy()


def test_batchnorm_freeze_uses_and_keeps_running_stats():
    """freeze=True (MegEngine): even in training, normalise with the running statistics, leave
    them unchanged and give weight/bias no gradient; the input still gets one."""
    bn = M.BatchNorm2d(3, freeze=True)
    to_float64(bn)
    rm, rv = _x(1, 3, 1, 1), np.abs(_x(1, 3, 1, 1)) + 0.5
    w, b = _x(1, 3, 1, 1), _x(1, 3, 1, 1)
    for t, v in ((bn.running_mean, rm), (bn.running_var, rv), (bn.weight, w), (bn.bias, b)):
        t._data[...] = v
    x = mg.tensor(_x(4, 3, 2, 2))
    gm = mg.GradManager().attach([x, bn.weight, bn.bias])
    assert bn.training
    with gm:
        y = bn(x)
        gm.backward(y.sum())
    np.testing.assert_allclose(y.numpy(), (x.numpy() - rm) / np.sqrt(rv + 1e-5) * w + b,
                               rtol=1e-12)
    np.testing.assert_array_equal(bn.running_mean.numpy(), rm)
    np.testing.assert_array_equal(bn.running_var.numpy(), rv)
    assert bn.weight.grad is None and bn.bias.grad is None
    dx = np.broadcast_to(w / np.sqrt(rv + 1e-5), (4, 3, 2, 2))
    np.testing.assert_allclose(x.grad.numpy(), dx)
    bn1 = M.BatchNorm1d(3, freeze=True)
    assert bn1(mg.tensor(np.ones((2, 3), np.float32))).shape == (2, 3)
    with pytest.raises(ValueError, match="freeze=True needs track_running_stats=True"):
        M.BatchNorm2d(3, track_running_stats=False, freeze=True)


def test_instance_norm_layer():
    """M.InstanceNorm(C): each (sample, channel) plane normalised (biased variance), then the
    per-channel weight (init 1) and bias (init 0); affine=False has no parameters."""
    norm = M.InstanceNorm(3)
    assert norm.weight.shape == (3,) and norm.bias.shape == (3,)
    to_float64(norm)
    norm.weight._data[...] = [1.0, 2.0, -0.5]
    norm.bias._data[...] = [0.0, 1.0, 3.0]
    x = _x(2, 3, 4, 5)
    xhat = (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)
    want = xhat * np.array([1.0, 2.0, -0.5])[:, None, None] + np.array([0.0, 1.0, 3.0])[:, None,
                                                                                         None]
    np.testing.assert_allclose(_run(norm, x), want, rtol=1e-10)
    layer_check_grad(norm, x, params=["weight", "bias"])
    bare = M.InstanceNorm(3, affine=False)
    assert bare.weight is None and list(bare.parameters()) == []
    np.testing.assert_allclose(_run(bare, x), xhat, rtol=1e-10)
    with pytest.raises(ValueError, match=r"InstanceNorm\(3\): expected input of shape"):
        bare(mg.tensor(np.zeros((2, 4, 3, 3))))


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose2d_output_padding(groups):
    """ConvTranspose2d(output_padding=): output (H - 1) * s - 2p + d(k - 1) + output_padding + 1,
    the extra bottom/right rows filled by the transposed convolution itself; grouped weights are
    MegEngine's (groups, in/groups, out/groups, kh, kw)."""
    up = M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=groups)
    assert up.output_padding == (1, 1)
    assert up.weight.shape == ((4, 6, 3, 3) if groups == 1 else (2, 2, 3, 3, 3))
    to_float64(up)
    x = _x(2, 4, 4, 3)
    y = _run(up, x)
    assert y.shape == (2, 6, 8, 6)
    w = up.weight.numpy().reshape(4, 6 // groups, 3, 3)
    want = ref_conv_transpose2d(x, w, (2, 2), (1, 1), (1, 1), (1, 1), groups)
    np.testing.assert_allclose(y, want + up.bias.numpy(), rtol=1e-10, atol=1e-12)
    layer_check_grad(up, x, params=["weight", "bias"])
    assert "output_padding=(1, 1)" in repr(up)


@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_conv_weights_use_megengine_layout_and_fans(groups):
    """MegEngine stores grouped and depthwise Conv2d/Conv1d weights as (groups, out/groups,
    in/groups, *kernel), and its calculate_fan_in_and_fan_out reads such a weight per group
    (fan_out = out/groups * prod(kernel), not out * prod(kernel) as PyTorch)."""
    conv = M.Conv2d(4, 8, (3, 2), groups=groups)
    assert conv.weight.shape == (groups, 8 // groups, 4 // groups, 3, 2)
    assert init.calculate_fan_in_and_fan_out(conv.weight) == (4 // groups * 6, 8 // groups * 6)
    bound = np.sqrt(2.0 / (1 + 5)) * np.sqrt(3.0 / (4 // groups * 6))  # Kaiming, a = sqrt(5)
    assert np.abs(conv.weight.numpy()).max() <= bound
    to_float64(conv)
    x = _x(2, 4, 5, 5)
    want = ref_conv2d(x, conv.weight.numpy().reshape(8, 4 // groups, 3, 2), conv.bias.numpy(),
                      groups=groups)
    np.testing.assert_allclose(_run(conv, x), want, rtol=1e-10, atol=1e-12)
    c1 = M.Conv1d(4, 8, 3, groups=groups)
    assert c1.weight.shape == (groups, 8 // groups, 4 // groups, 3)
    to_float64(c1)
    x1 = _x(2, 4, 7)
    w1 = c1.weight.numpy().reshape(8, 4 // groups, 3, 1)
    want1 = ref_conv2d(x1[..., None], w1, c1.bias.numpy().reshape(-1), groups=groups)[..., 0]
    np.testing.assert_allclose(_run(c1, x1), want1, rtol=1e-10, atol=1e-12)


def test_megengine_state_dict_loads():
    """A state_dict as MegEngine writes it: depthwise Conv2d weight (groups, 1, 1, kh, kw), bias
    (1, C, 1, 1), and BatchNorm tensors flattened to (C,) — loads into the same minigrad model and
    computes what the arrays say."""

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 3, 3, padding=1, groups=3)
            self.bn = M.BatchNorm2d(3)

        def forward(self, x):
            return self.bn(self.conv(x))

    sd = {"conv.weight": _x(3, 1, 1, 3, 3), "conv.bias": _x(1, 3, 1, 1), "bn.weight": _x(3),
          "bn.bias": _x(3), "bn.running_mean": _x(3), "bn.running_var": np.abs(_x(3)) + 0.5}
    net = Net()
    to_float64(net)
    net.load_state_dict(sd)
    net.eval()
    x = _x(2, 3, 5, 4)
    conv = ref_conv2d(x, sd["conv.weight"].reshape(3, 1, 3, 3), sd["conv.bias"], pad=(1, 1),
                      groups=3)
    c = lambda k: sd[k].reshape(1, 3, 1, 1)  # noqa: E731
    want = (conv - c("bn.running_mean")) / np.sqrt(c("bn.running_var") + 1e-5) * c(
        "bn.weight") + c("bn.bias")
    np.testing.assert_allclose(_run(net, x), want, rtol=1e-10)
    with pytest.raises(ValueError, match=r"mismatch for 'bn.weight': expected \(1, 3, 1, 1\)"):
        net.load_state_dict({**sd, "bn.weight": _x(4)})


def test_conv3d_layer():
    """M.Conv3d(in, out, k): weight (out, in/groups, kd, kh, kw) (grouped: a leading groups axis),
    bias (1, out, 1, 1, 1), output equal to F.conv3d."""
    conv = M.Conv3d(4, 6, (2, 3, 1), stride=(1, 2, 1), padding=1, groups=2)
    assert conv.weight.shape == (2, 3, 2, 2, 3, 1) and conv.bias.shape == (1, 6, 1, 1, 1)
    to_float64(conv)
    x = _x(1, 4, 3, 5, 2)
    want = F.conv3d(mg.tensor(x), conv.weight, conv.bias, (1, 2, 1), 1, groups=2).numpy()
    np.testing.assert_allclose(_run(conv, x), want, rtol=1e-12)
    layer_check_grad(conv, x, params=["weight"])


def test_elemwise_layer():
    """M.Elemwise(method) applies MegEngine's Elemwise mode to its arguments (any case)."""
    a, b, c = _x(3, 4), _x(3, 4), _x(3, 4)
    np.testing.assert_allclose(_run(M.Elemwise("ADD"), a, b), a + b)
    np.testing.assert_allclose(_run(M.Elemwise("fuse_add_relu"), a, b), np.maximum(a + b, 0))
    np.testing.assert_allclose(_run(M.Elemwise("FUSE_MUL_ADD3"), a, b, c), a * b + c)
    np.testing.assert_allclose(_run(M.Elemwise("LOG_SUM_EXP"), a, b), np.logaddexp(a, b))
    np.testing.assert_allclose(_run(M.Elemwise("H_SWISH"), a), a * np.clip(a + 3, 0, 6) / 6)
    layer_check_grad(M.Elemwise("FUSE_ADD_TANH"), a, b)
    with pytest.raises(ValueError, match="Elemwise: unknown method 'FOO'"):
        M.Elemwise("FOO")


def test_prelu_slope_is_learned_per_channel():
    """PReLU(x) = max(x, 0) + a * min(x, 0); one slope (shape (1,)) or one per NCHW channel
    (shape (1, C, 1, 1)), initialised to ``init``; the slope's gradient is sum(min(x, 0))."""
    x = np.array([[[[-1.0, 2.0]], [[-3.0, -4.0]]]], np.float32)  # (1, 2, 1, 2)
    shared = M.PReLU()
    assert shared.weight.shape == (1,) and float(shared.weight.numpy()[0]) == 0.25
    np.testing.assert_allclose(shared(mg.tensor(x)).numpy(), np.where(x > 0, x, 0.25 * x))
    per_channel = M.PReLU(num_parameters=2, init=0.5)
    per_channel.weight.set_value(np.array([0.1, 0.2], np.float32).reshape(1, 2, 1, 1))
    gm = mg.autodiff.GradManager().attach(per_channel.parameters())
    with gm:
        y = per_channel(mg.tensor(x))
        gm.backward(y.sum())
    ref = np.where(x > 0, x, np.array([0.1, 0.2]).reshape(1, 2, 1, 1) * x)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(per_channel.weight.grad.numpy().ravel(), [-1.0, -7.0])


def test_batchnorm_of_an_empty_batch_is_empty():
    """A (0, C, 0) batch gives a (0, C, 0) output (MegEngine), not a reshape error."""
    bn = M.BatchNorm1d(4)
    out = bn(mg.tensor(np.zeros((0, 4, 0), np.float32)))
    assert out.shape == (0, 4, 0)


def test_repr_lists_every_name_of_a_shared_module():
    """A module held by two attributes is printed under both names, as MegEngine and PyTorch do
    (the parameters are still listed once)."""

    class Shared(M.Module):
        def __init__(self):
            super().__init__()
            self.a = M.Linear(2, 2)
            self.b = self.a

    text = repr(Shared())
    assert "(a): Linear" in text and "(b): Linear" in text
    assert len(list(Shared().parameters())) == 2


def test_batchnorm_track_running_stats_can_be_switched_after_construction():
    """MegEngine: with track_running_stats turned off after construction the layer normalises
    with batch statistics and leaves the running ones untouched; turning it on for a layer built
    without them is an error naming the layer."""
    bn = M.BatchNorm2d(3)
    bn.track_running_stats = False
    bn.eval()
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(6, 3, 2, 2)).astype(np.float32)
    y = bn(mg.tensor(x)).numpy()
    mean, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    bn.train()
    bn(mg.tensor(x))
    np.testing.assert_array_equal(bn.running_mean.numpy(), 0)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    bare = M.BatchNorm2d(3, track_running_stats=False)
    bare.track_running_stats = True
    with pytest.raises(ValueError, match=r"BatchNorm2d\(3\): track_running_stats was set"):
        bare(mg.tensor(x))
