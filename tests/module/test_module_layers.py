"""Every layer against a NumPy float64 reference, gradients by finite differences, bad input."""

import math
from collections import OrderedDict

import numpy as np
import pytest
from module_test_helpers import layer_check_grad, needs, to_float64
from numpy_references import ref_conv2d, ref_pool

import minigrad as mg
import minigrad.module as M

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape)


def _run(layer, x):
    return layer(mg.tensor(x, dtype="float64")).numpy()


# -- Linear ---------------------------------------------------------------------------------------
def test_linear_forward_backward_and_init():
    mg.random.seed(3)
    lin = M.Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    bound = 1 / math.sqrt(5)
    assert np.abs(lin.weight.numpy()).max() <= bound and np.abs(lin.bias.numpy()).max() <= bound
    w0 = lin.weight.numpy()
    mg.random.seed(3)
    np.testing.assert_array_equal(M.Linear(5, 3).weight.numpy(), w0)  # reproducible
    to_float64(lin)
    x = _x(2, 4, 5)
    np.testing.assert_allclose(_run(lin, x), x @ lin.weight.numpy().T + lin.bias.numpy(),
                               rtol=1e-12)
    layer_check_grad(lin, x, params=["weight", "bias"])
    assert M.Linear(5, 3, bias=False).bias is None


def test_linear_bad_input_names_layer_and_shapes():
    with pytest.raises(ValueError, match=r"Linear\(in_features=5, out_features=3\): expected "
                                         r"input of shape \(\.\.\., 5\), got \(2, 4\)"):
        M.Linear(5, 3)(mg.tensor(np.zeros((2, 4), np.float32)))


# -- convolutions ---------------------------------------------------------------------------------
@needs("conv2d")
@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, padding=2),
                                dict(groups=2, stride=(1, 2), padding=(0, 1))])
def test_conv2d_matches_loops_and_gradcheck(kw):
    mg.random.seed(0)
    conv = M.Conv2d(4, 6, 3, **kw)
    g = conv.groups  # MegEngine's layout: (groups, out/groups, in/groups, kh, kw) when grouped
    assert conv.weight.shape == ((6, 4, 3, 3) if g == 1 else (g, 6 // g, 4 // g, 3, 3))
    assert conv.bias.shape == (1, 6, 1, 1)
    to_float64(conv)
    x = _x(2, 4, 7, 6)
    expect = ref_conv2d(x, conv.weight.numpy().reshape(6, 4 // g, 3, 3), conv.bias.numpy(),
                        conv.stride, conv.padding, conv.dilation, conv.groups)
    np.testing.assert_allclose(_run(conv, x), expect, rtol=1e-10, atol=1e-12)
    layer_check_grad(conv, x, params=["weight", "bias"])


@needs("conv1d")
def test_conv1d_matches_conv2d_reference():
    conv = M.Conv1d(3, 4, 3, stride=2, padding=1)
    to_float64(conv)
    x = _x(2, 3, 9)
    w, b = conv.weight.numpy(), conv.bias.numpy()
    expect = ref_conv2d(x[..., None], w[..., None], b.reshape(-1), (2, 1), (1, 0), (1, 1), 1)
    np.testing.assert_allclose(_run(conv, x), expect[..., 0], rtol=1e-10, atol=1e-12)
    layer_check_grad(conv, x, params=["weight"])


@needs("conv_transpose2d")
def test_conv_transpose2d_is_the_adjoint_of_conv2d():
    mg.random.seed(1)
    up = M.ConvTranspose2d(4, 6, 3, stride=2, padding=1, bias=False)
    assert up.weight.shape == (4, 6, 3, 3)
    to_float64(up)
    x = _x(2, 4, 5, 5)
    y = _run(up, x)
    # <conv_transpose(x), z> == <x, conv(z)> with the same weight read as (out=4, in=6)
    z = _x(*y.shape)
    conv_z = ref_conv2d(z, up.weight.numpy(), None, (2, 2), (1, 1), (1, 1), 1)
    assert np.vdot(y, z) == pytest.approx(np.vdot(x, conv_z), rel=1e-10)
    layer_check_grad(up, x, params=["weight"])


@needs("conv2d")
def test_conv_bad_input_names_layer_and_shapes():
    with pytest.raises(ValueError, match=r"Conv2d\(3, 8, kernel_size=\(3, 3\)\): expected input of "
                                         r"shape \(N, 3, \*, \*\), got \(2, 4, 8, 8\)"):
        M.Conv2d(3, 8, 3)(mg.tensor(np.zeros((2, 4, 8, 8), np.float32)))
    with pytest.raises(ValueError, match="divisible by groups"):
        M.Conv2d(3, 8, 3, groups=2)


# -- normalisation --------------------------------------------------------------------------------
@needs("batch_norm")
def test_batchnorm2d_train_eval_and_running_stats():
    bn = M.BatchNorm2d(3)
    to_float64(bn)
    bn.weight._data[...] = [[[[1.0]], [[2.0]], [[0.5]]]]
    bn.bias._data[...] = [[[[0.0]], [[1.0]], [[-1.0]]]]
    x = _x(4, 3, 5, 5) * 2 + 1
    mu, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
    w, b = bn.weight.numpy(), bn.bias.numpy()
    np.testing.assert_allclose(_run(bn, x), (x - mu) / np.sqrt(var + 1e-5) * w + b, rtol=1e-10)
    unbiased = x.var(axis=(0, 2, 3), ddof=1, keepdims=True)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mu, rtol=1e-10)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * unbiased, rtol=1e-10)
    bn.eval()
    rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
    np.testing.assert_allclose(_run(bn, x), (x - rm) / np.sqrt(rv + 1e-5) * w + b, rtol=1e-10)
    np.testing.assert_array_equal(bn.running_mean.numpy(), rm)  # eval leaves the stats alone
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var"]
    bn.train()
    layer_check_grad(bn, x, params=["weight", "bias"])


@needs("batch_norm")
@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 6)])
def test_batchnorm1d_and_untracked(shape):
    bn = M.BatchNorm1d(3, affine=False, track_running_stats=False)
    assert list(bn.named_tensors()) == []
    x = _x(*shape)
    axes = (0,) if len(shape) == 2 else (0, 2)
    mu, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    bn.eval()  # no running stats: batch statistics even in eval
    np.testing.assert_allclose(_run(bn, x), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-8)
    with pytest.raises(ValueError, match=r"BatchNorm1d\(3\): expected input of shape"):
        M.BatchNorm1d(3)(mg.tensor(np.zeros((2, 4), np.float32)))


@needs("layer_norm")
def test_layernorm():
    ln = M.LayerNorm((4, 5))
    to_float64(ln)
    ln.weight._data[...] = _x(4, 5)
    ln.bias._data[...] = _x(4, 5)
    x = _x(3, 4, 5)
    mu, var = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    expect = (x - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy() + ln.bias.numpy()
    np.testing.assert_allclose(_run(ln, x), expect, rtol=1e-10)
    layer_check_grad(ln, x, params=["weight", "bias"])
    with pytest.raises(ValueError, match=r"LayerNorm\(\(4, 5\)\)"):
        ln(mg.tensor(np.zeros((3, 5, 4))))


@needs("group_norm")
def test_groupnorm():
    gn = M.GroupNorm(2, 4)
    to_float64(gn)
    gn.weight._data[...] = _x(4)
    x = _x(3, 4, 2, 3)
    g = x.reshape(3, 2, -1)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    expect = norm.reshape(x.shape) * gn.weight.numpy().reshape(1, 4, 1, 1)
    np.testing.assert_allclose(_run(gn, x), expect, rtol=1e-10)
    layer_check_grad(gn, x, params=["weight", "bias"])


# -- dropout, embedding, activations, pooling, shape layers ---------------------------------------
@needs("dropout")
def test_dropout_scaling_and_eval_identity():
    mg.random.seed(0)
    drop = M.Dropout(0.25)
    x = np.ones((200, 100), np.float32)
    y = drop(mg.tensor(x)).numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    assert abs(1 - kept.mean() - 0.25) < 0.01
    mg.random.seed(0)
    np.testing.assert_array_equal(M.Dropout(0.25)(mg.tensor(x)).numpy(), y)  # reproducible
    drop.eval()
    t = mg.tensor(x)
    assert drop(t) is t
    with pytest.raises(ValueError, match="drop_prob"):
        M.Dropout(1.5)


@needs("embedding")
def test_embedding_lookup_and_grad():
    emb = M.Embedding(10, 4)
    to_float64(emb)
    ids = np.array([[1, 3, 3], [9, 0, 1]], np.int32)
    np.testing.assert_array_equal(emb(mg.tensor(ids)).numpy(), emb.weight.numpy()[ids])
    layer_check_grad(emb, ids, params=["weight"])
    with pytest.raises(IndexError, match=r"Embedding\(10, 4\): ids must be in \[0, 10\)"):
        emb(mg.tensor(np.array([10], np.int32)))
    w = _x(3, 2)
    np.testing.assert_array_equal(M.Embedding.from_pretrained(w).weight.numpy(),
                                  w.astype(np.float32))


ACTIVATIONS = [
    (M.ReLU(), lambda x: np.maximum(x, 0), "relu"),
    (M.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x), "leaky_relu"),
    (M.GELU(), lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))), "gelu"),
    (M.SiLU(), lambda x: x / (1 + np.exp(-x)), "silu"),
    (M.Sigmoid(), lambda x: 1 / (1 + np.exp(-x)), "sigmoid"),
    (M.Tanh(), np.tanh, "tanh"),
    (M.Softmax(axis=1), lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True), "softmax"),
]


@pytest.mark.parametrize("layer,ref,fname", ACTIVATIONS, ids=[a[2] for a in ACTIVATIONS])
def test_activations(layer, ref, fname):
    import minigrad.functional as F

    if not hasattr(F, fname):
        pytest.skip(f"F.{fname} not available yet")
    x = _x(3, 5) + 0.05  # keep away from the kinks at 0
    np.testing.assert_allclose(_run(layer, x), ref(x), rtol=1e-7, atol=1e-12)
    layer_check_grad(layer, x)


@needs("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
def test_pooling_layers():
    x = _x(2, 3, 7, 7)
    np.testing.assert_allclose(_run(M.MaxPool2d(3, 2, 1), x), ref_pool(x, 3, 2, 1, "max", 0))
    np.testing.assert_allclose(_run(M.AvgPool2d(3, 2, 1), x), ref_pool(x, 3, 2, 1, "avg", False),
                               rtol=1e-10)
    np.testing.assert_allclose(_run(M.AvgPool2d(3, 2, 1, mode="average"), x),
                               ref_pool(x, 3, 2, 1, "avg", True), rtol=1e-10)
    layer_check_grad(M.MaxPool2d(2), x)
    layer_check_grad(M.AvgPool2d(3, 2, 1), x)
    ad = _run(M.AdaptiveAvgPool2d((3, 2)), x)
    rows = [(math.floor(i * 7 / 3), math.ceil((i + 1) * 7 / 3)) for i in range(3)]
    cols = [(math.floor(j * 7 / 2), math.ceil((j + 1) * 7 / 2)) for j in range(2)]
    expect = np.stack([np.stack([x[:, :, r0:r1, c0:c1].mean((2, 3)) for c0, c1 in cols], -1)
                       for r0, r1 in rows], -2)
    np.testing.assert_allclose(ad, expect, rtol=1e-10)
    with pytest.raises(ValueError, match=r"MaxPool2d: expected input of shape \(N, C, H, W\)"):
        M.MaxPool2d(2)(mg.tensor(np.zeros((3, 4), np.float32)))


def test_flatten_identity():
    x = _x(2, 3, 4)
    assert _run(M.Flatten(), x).shape == (2, 12)
    np.testing.assert_array_equal(_run(M.Flatten(0), x), x.reshape(-1))
    t = mg.tensor(x)
    assert M.Identity()(t) is t


# -- attention ------------------------------------------------------------------------------------
def ref_mha(q, k, v, mha, mask=None):
    e, h = mha.embed_dim, mha.num_heads
    d = e // h
    w, b = mha.in_proj_weight.numpy(), mha.in_proj_bias.numpy()
    out = np.zeros(q.shape)
    n, length = q.shape[:2]
    heads_w = []
    for bi in range(n):
        qp, kp, vp = (t[bi] @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e]
                      for i, t in enumerate((q, k, v)))
        outs, ws = [], []
        for hi in range(h):
            sl = slice(hi * d, (hi + 1) * d)
            s = qp[:, sl] @ kp[:, sl].T / math.sqrt(d)
            if mask is not None:
                s = np.where(mask[bi], -np.inf, s)
            a = np.exp(s - s.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ws.append(a)
            outs.append(a @ vp[:, sl])
        wo, bo = mha.out_proj.weight.numpy(), mha.out_proj.bias.numpy()
        out[bi] = np.concatenate(outs, -1) @ wo.T + bo
        heads_w.append(np.mean(ws, 0))
    return out, np.stack(heads_w)


def test_multi_head_attention_matches_reference():
    mg.random.seed(0)
    mha = M.MultiHeadAttention(8, 2)
    to_float64(mha)
    mha.out_proj.bias._data[...] = _x(8)
    mha.in_proj_bias._data[...] = _x(24)
    q, kv = _x(2, 5, 8), _x(2, 6, 8)
    out, w = mha(mg.tensor(q), mg.tensor(kv), mg.tensor(kv), need_weights=True)
    eo, ew = ref_mha(q, kv, kv, mha)
    np.testing.assert_allclose(out.numpy(), eo, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), ew, rtol=1e-10, atol=1e-12)
    # causal self-attention + key padding
    pad = np.array([[False] * 5, [False] * 3 + [True] * 2])
    causal = np.triu(np.ones((5, 5), bool), 1)
    out, _ = mha(mg.tensor(q), is_causal=True, key_padding_mask=pad)
    eo, _ = ref_mha(q, q, q, mha, mask=causal[None] | pad[:, None, :])
    np.testing.assert_allclose(out.numpy(), eo, rtol=1e-10, atol=1e-12)
    # sequence-first layout gives the same numbers transposed
    mha.batch_first = False
    out_sf, _ = mha(mg.tensor(q.transpose(1, 0, 2)), is_causal=True, key_padding_mask=pad)
    np.testing.assert_allclose(out_sf.numpy().transpose(1, 0, 2), eo, rtol=1e-10, atol=1e-12)
    mha.batch_first = True
    layer_check_grad(mha, q, params=["in_proj_weight", "out_proj.weight"],
                     call=lambda m, x: m(x, is_causal=True)[0])
    with pytest.raises(ValueError, match=r"MultiHeadAttention\(embed_dim=8\): expected query"):
        mha(mg.tensor(_x(2, 5, 7)))


# -- Sequential -----------------------------------------------------------------------------------
def test_sequential_construction_indexing_slicing():
    a, b, c = M.Linear(3, 4), M.ReLU(), M.Linear(4, 2)
    seq = M.Sequential(a, b, c)
    assert len(seq) == 3 and list(seq) == [a, b, c] and seq[0] is a and seq[-1] is c
    head = seq[1:]
    assert isinstance(head, M.Sequential) and list(head) == [b, c]
    assert [n for n, _ in head.named_parameters()] == ["2.weight", "2.bias"]
    x = mg.tensor(_x(5, 3).astype(np.float32))
    np.testing.assert_array_equal(seq(x).numpy(), head(a(x)).numpy())
    named = M.Sequential(OrderedDict([("fc", a), ("act", b)]))
    assert [n for n, _ in named.named_parameters()] == ["fc.weight", "fc.bias"]
    assert named[0] is a and named.fc is a
    named.append(c)
    assert list(named.state_dict()) == ["fc.weight", "fc.bias", "2.weight", "2.bias"]
    with pytest.raises(IndexError, match="out of range for 3 layers"):
        seq[3]
    with pytest.raises(TypeError, match="must be a Module, got int"):
        M.Sequential(a, 3)
