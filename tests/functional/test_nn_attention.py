"""scaled_dot_product_attention and multi_head_attention against NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad


def _t(a, device, dtype="float64"):
    return mg.tensor(a, dtype=dtype, device=device)


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    lq, lk = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((lq, lk), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_and_grad(causal, device, rng):
    q = rng.standard_normal((2, 3, 5, 4))
    k = rng.standard_normal((2, 3, 5, 4))
    v = rng.standard_normal((2, 3, 5, 6))
    got = F.scaled_dot_product_attention(_t(q, device), _t(k, device), _t(v, device),
                                         is_causal=causal)
    np.testing.assert_allclose(got.numpy(), ref_sdpa(q, k, v, causal=causal), rtol=1e-10)
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               q, k, v, device=device)


def test_sdpa_masks_scale_and_broadcast(device, rng):
    q = rng.standard_normal((2, 4, 3))
    k = rng.standard_normal((1, 6, 3))  # broadcasts over the batch
    v = rng.standard_normal((1, 6, 2))
    bmask = rng.random((4, 6)) > 0.3
    bmask[:, 0] = True  # every query keeps at least one key
    got = F.scaled_dot_product_attention(_t(q, device), _t(k, device), _t(v, device),
                                         attn_mask=_t(bmask, device, "bool"), scale=0.7)
    np.testing.assert_allclose(got.numpy(), ref_sdpa(q, k, v, bmask, scale=0.7), rtol=1e-10)
    fmask = rng.standard_normal((4, 6))
    got = F.scaled_dot_product_attention(_t(q, device), _t(k, device), _t(v, device),
                                         attn_mask=_t(fmask, device))
    np.testing.assert_allclose(got.numpy(), ref_sdpa(q, k, v, fmask), rtol=1e-10)
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, _t(bmask, device, "bool")),
               q, k, v, device=device)


def test_sdpa_mask_with_more_leading_axes(device, rng):
    # a per-example mask (N, 1, L, S) over heads-only q/k/v (H, L, E): the output gains the N axis
    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    mask = rng.standard_normal((3, 1, 4, 4))
    got = F.scaled_dot_product_attention(_t(q, device), _t(k, device), _t(v, device),
                                         attn_mask=_t(mask, device))
    np.testing.assert_allclose(got.numpy(), ref_sdpa(q, k, v, mask), rtol=1e-10)
    check_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, _t(mask, device)),
               q, k, v, device=device)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_second_order(causal, device, rng, double_grad):
    q, k, v = (rng.standard_normal((2, 3, 2)) for _ in range(3))
    double_grad(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                q, k, v, device=device)


def test_sdpa_dropout_is_seeded_and_errors(device, rng):
    q = _t(rng.standard_normal((2, 4, 3)), device)
    mg.random.seed(3)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).numpy()
    mg.random.seed(3)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, F.scaled_dot_product_attention(q, q, q).numpy())
    with pytest.raises(ValueError, match="scaled_dot_product_attention: incompatible shapes"):
        F.scaled_dot_product_attention(q, _t(np.zeros((2, 4, 5)), device), q)


def _ref_mha(xq, xk, xv, h, w_in, b_in, w_out, b_out, causal):
    e = xq.shape[-1]
    q = xq @ w_in[:e].T + b_in[:e]
    k = xk @ w_in[e : 2 * e].T + b_in[e : 2 * e]
    v = xv @ w_in[2 * e :].T + b_in[2 * e :]
    d = e // h
    outs = [ref_sdpa(q[..., i * d : (i + 1) * d], k[..., i * d : (i + 1) * d],
                     v[..., i * d : (i + 1) * d], causal=causal) for i in range(h)]
    return np.concatenate(outs, -1) @ w_out.T + b_out


@pytest.mark.parametrize("self_attn", [True, False])
def test_multi_head_attention(self_attn, device, rng):
    n, length, e, h = 2, 5, 8, 2
    x = rng.standard_normal((n, length, e))
    mem = x if self_attn else rng.standard_normal((n, 3, e))
    w_in, b_in = rng.standard_normal((3 * e, e)) * 0.3, rng.standard_normal(3 * e)
    w_out, b_out = rng.standard_normal((e, e)) * 0.3, rng.standard_normal(e)
    causal = self_attn
    xt = _t(x, device)
    mt = xt if self_attn else _t(mem, device)
    got = F.multi_head_attention(xt, mt, mt, h, _t(w_in, device), _t(b_in, device),
                                 _t(w_out, device), _t(b_out, device), is_causal=causal)
    ref = _ref_mha(x, mem, mem, h, w_in, b_in, w_out, b_out, causal)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-9, atol=1e-12)
    if self_attn:
        fn = lambda x, wi, bi, wo, bo: F.multi_head_attention(x, x, x, h, wi, bi, wo, bo,
                                                              is_causal=True)
        check_grad(fn, x, w_in, b_in, w_out, b_out, device=device)
    else:
        fn = lambda x, m, wi, bi, wo, bo: F.multi_head_attention(x, m, m, h, wi, bi, wo, bo)
        check_grad(fn, x, mem, w_in, b_in, w_out, b_out, device=device)


def test_multi_head_attention_errors(device):
    x = _t(np.zeros((2, 3, 6)), device)
    with pytest.raises(ValueError, match="num_heads=4 must divide the embedding size 6"):
        F.multi_head_attention(x, x, x, 4, _t(np.zeros((18, 6)), device))
    with pytest.raises(ValueError, match=r"in_proj_weight has shape \(12, 6\)"):
        F.multi_head_attention(x, x, x, 2, _t(np.zeros((12, 6)), device))


def test_attention_bias_has_one_boolean_meaning(default_device):
    like = mg.tensor(np.zeros((1,)), dtype="float64")
    keep = np.array([[True, False], [False, True]])
    bias = F.nn.attention_bias(2, 2, keep, like=like).numpy()
    np.testing.assert_array_equal(bias, [[0.0, -np.inf], [-np.inf, 0.0]])  # True = may attend
    causal = F.nn.attention_bias(2, 3, is_causal=True, like=like).numpy()
    np.testing.assert_array_equal(causal, [[0, -np.inf, -np.inf], [0, 0, -np.inf]])
    pad = F.nn.attention_bias(2, 3, key_padding_mask=np.array([[False, False, True]]),
                              like=like).numpy()
    assert pad.shape == (1, 1, 1, 3)  # (N, 1, 1, S): over heads and queries
    np.testing.assert_array_equal(pad[0, 0, 0], [0.0, 0.0, -np.inf])  # True = padding
    assert F.nn.attention_bias(2, 2, like=like) is None
    with pytest.raises(ValueError, match=r"attention_bias: attn_mask shape \(3, 2\) does not "
                                         r"broadcast to \(2, 2\)"):
        F.nn.attention_bias(2, 2, np.ones((3, 2), bool), like=like)


def test_module_and_functional_read_a_boolean_mask_the_same_way(rng, default_device):
    import minigrad.module as M

    mha = M.MultiHeadAttention(4, 1, bias=False)
    mha.out_proj.weight.set_value(np.eye(4, dtype=np.float32))
    mha.in_proj_weight.set_value(np.tile(np.eye(4, dtype=np.float32), (3, 1)))  # q = k = v = x
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    keep = np.array([[True, False, False], [True, True, False], [False, True, True]])
    out, _ = mha(mg.tensor(x), attn_mask=keep)
    ref = ref_sdpa(x.astype(np.float64), x, x, mask=keep)  # True = may attend
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    same = F.scaled_dot_product_attention(mg.tensor(x), mg.tensor(x), mg.tensor(x), keep)
    np.testing.assert_allclose(same.numpy(), out.numpy(), rtol=1e-5, atol=1e-6)


def _three_node_self_attention(x, h, w_in, b_in, mask, causal):
    """multi_head_attention's self-attention as the separate split / attention / merge nodes
    (what it computes when the fused node cannot be used), without the output projection."""
    from minigrad.functional import attention  # noqa: PLC0415  (the unfused nodes, for reference)

    q, k, v = attention._SplitHeads()(F.linear(x, w_in, b_in), h, 3)
    return attention._MergeHeads()(F.scaled_dot_product_attention(q, k, v, mask, causal))


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_self_attention_is_bitwise_the_three_nodes(mask_kind, causal, dtype, device, rng):
    """Self-attention is one node (split, attention and merge fused); its output and every
    gradient equal, bit for bit, those of the three separate nodes."""
    n, length, e, h = 2, 6, 8, 2
    x = rng.standard_normal((n, length, e))
    w_in, b_in = rng.standard_normal((3 * e, e)) * 0.3, rng.standard_normal(3 * e)
    mask = {"none": None, "bool": rng.random((length, length)) > 0.3,
            "float": rng.standard_normal((n, 1, length, length))}[mask_kind]
    if mask is not None and mask.dtype == bool:
        mask[:, 0] = True  # every query sees a key
    results = []
    for fused in (True, False):
        xt, wt, bt = (mg.Parameter(a.astype(dtype), device=device) for a in (x, w_in, b_in))
        mt = None if mask is None else mg.tensor(mask if mask.dtype == bool
                                                 else mask.astype(dtype), device=device)
        gm = mg.GradManager().attach([xt, wt, bt])
        with gm:
            if fused:
                out = F.multi_head_attention(xt, xt, xt, h, wt, bt, attn_mask=mt,
                                             is_causal=causal)
            else:
                out = _three_node_self_attention(xt, h, wt, bt, mt, causal)
            gm.backward((out * out).sum())
        results.append([out.numpy()] + [p.grad.numpy() for p in (xt, wt, bt)])
    for got, want in zip(*results):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_fused_self_attention_copies_less_on_a_gpu():
    """On the fake CuPy the fused self-attention's backward writes dq, dk, dv into one array:
    no per-part copies (``setitem``) and no ``empty`` of the merged gradient remain."""
    from fakes import fake_cupy  # noqa: PLC0415

    rng = np.random.default_rng(0)
    with fake_cupy.installed(1) as fake:
        x = mg.Parameter(rng.standard_normal((2, 4, 8)).astype("float32"), device="gpu0")
        w = mg.Parameter(rng.standard_normal((24, 8)).astype("float32"), device="gpu0")
        gm = mg.GradManager().attach([x, w])
        with gm:
            out = F.multi_head_attention(x, x, x, 2, w, is_causal=True)
            fake.clear()
            gm.backward(out.sum())
        launches = [e for e in fake.events if e.startswith("launch ")]
    assert not [e for e in launches if "setitem" in e], launches
    assert sum("ascontiguousarray" in e for e in launches) == 3, launches
