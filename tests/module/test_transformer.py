"""The transformer of ``minigrad.module.transformer`` (the single-device model the tensor- and
sequence-parallel LMs are configurations of) against NumPy float64, by finite differences, its
causality, and the layer factory it is built from."""

import numpy as np
import pytest
from module_test_helpers import layer_check_grad, to_float64

import minigrad as mg
import minigrad.module as M

RNG = np.random.default_rng(5)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _ref_attention(attn, x, causal):
    """NumPy multi-head self-attention with ``attn``'s parameters: x (B, T, dim)."""
    b, t, dim = x.shape
    h, d = attn.num_heads, dim // attn.num_heads
    qkv = x @ attn.qkv.weight.numpy().T + attn.qkv.bias.numpy()
    q, k, v = qkv.reshape(b, t, 3, h, d).transpose(2, 0, 3, 1, 4)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if causal:
        scores = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, scores)
    out = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, t, dim)
    return out @ attn.proj.weight.numpy().T + attn.proj.bias.numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_numpy(causal):
    mg.random.seed(0)
    attn = M.SelfAttention(8, 2, causal=causal)
    to_float64(attn)
    attn.qkv.bias._data[...] = RNG.standard_normal(24)  # nonzero biases reach the output
    x = RNG.standard_normal((2, 5, 8))
    np.testing.assert_allclose(attn(mg.tensor(x)).numpy(), _ref_attention(attn, x, causal),
                               rtol=1e-10, atol=1e-12)
    layer_check_grad(attn, x, params=["qkv.weight", "proj.weight"])


def test_block_and_lm_gradients_match_finite_differences():
    mg.random.seed(1)
    block = M.TransformerBlock(8, 2, mlp_ratio=2, causal=True)
    to_float64(block)
    layer_check_grad(block, RNG.standard_normal((2, 4, 8)),
                     params=["ln1.weight", "attn.qkv.weight", "mlp.fc1.weight", "mlp.fc2.bias"])
    lm = M.TransformerLM(11, 8, 2, num_layers=2, max_len=6, mlp_ratio=2)
    to_float64(lm)
    ids = RNG.integers(0, 11, (2, 5))
    layer_check_grad(lm, params=["pos.weight", "blocks.1.attn.proj.weight", "head.weight"],
                     call=lambda m: m(ids))


def test_lm_is_causal_and_uses_positions():
    mg.random.seed(2)
    lm = M.TransformerLM(11, 8, 2, num_layers=2, max_len=8)
    to_float64(lm)
    ids = RNG.integers(0, 11, (1, 6))
    changed = ids.copy()
    changed[0, 4] = (ids[0, 4] + 1) % 11
    a, b = lm(ids).numpy(), lm(changed).numpy()
    assert a.shape == (1, 6, 11)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])  # earlier tokens do not see token 4
    assert np.abs(a[:, 4:] - b[:, 4:]).min() > 0
    same = np.full((1, 6), 3)
    logits = lm(same).numpy()
    assert np.abs(logits[0, 1] - logits[0, 2]).max() > 1e-6  # same token, different position
    mg.random.seed(2)
    bidirectional = M.TransformerLM(11, 8, 2, num_layers=2, max_len=8, causal=False)
    to_float64(bidirectional)
    assert np.abs(bidirectional(ids).numpy()[:, :4] - bidirectional(changed).numpy()[:, :4]).max(
    ) > 1e-6


def test_dot_product_attention_dropout_path_equals_the_fused_path_and_drops():
    q, k, v = (mg.tensor(RNG.standard_normal((2, 2, 5, 4))) for _ in range(3))
    core = M.DotProductAttention(causal=True, dropout=M.Dropout(0.5))
    fused = core.eval()(q, k, v).numpy()
    core.train()
    core.dropout.drop_prob = 1e-300  # the composed path, nothing dropped
    np.testing.assert_allclose(core(q, k, v).numpy(), fused, rtol=1e-12, atol=1e-12)
    core.dropout.drop_prob = 0.5
    w = core.weights(q, k).numpy()
    assert (w == 0).any() and np.triu(w[0, 0], 1).max() == 0  # dropped, still causal


class _Recording(M.TransformerLayers):
    """The single-device layers, recording each call; its attention core is plain averaging."""

    def __init__(self):
        self.calls = []

    def linear(self, in_features, out_features, bias=True, chunks=1):
        self.calls.append(("linear", in_features, out_features, chunks))
        return super().linear(in_features, out_features, bias, chunks)

    def layer_norm(self, dim):
        self.calls.append(("layer_norm", dim))
        return super().layer_norm(dim)

    def dropout(self, drop_prob):
        self.calls.append(("dropout", drop_prob))
        return super().dropout(drop_prob)

    def local_heads(self, num_heads):
        self.calls.append(("local_heads", num_heads))
        return num_heads

    def attention_core(self, causal, dropout):
        self.calls.append(("attention_core", causal, dropout))
        return _MeanOfValues()


class _MeanOfValues(M.Module):
    """A stand-in attention core: every query gets the mean of the values."""

    def forward(self, q, k, v):
        return v.mean(axis=2, keepdims=True) + q * 0


def test_block_is_built_from_its_factory_in_order_and_runs_its_core():
    layers = _Recording()
    mg.random.seed(4)
    block = M.TransformerBlock(8, 2, mlp_ratio=2, dropout=0.25, causal=True, layers=layers)
    assert layers.calls == [
        ("layer_norm", 8), ("linear", 8, 24, 3), ("local_heads", 2),
        ("attention_core", True, 0.25), ("linear", 8, 8, 1), ("dropout", 0.25),
        ("layer_norm", 8), ("linear", 8, 16, 1), ("linear", 16, 8, 1), ("dropout", 0.25),
    ]
    assert isinstance(block.attn.core, _MeanOfValues)
    to_float64(block)
    block.eval()
    x = RNG.standard_normal((1, 4, 8))
    attn = block.attn
    qkv = block.ln1(mg.tensor(x)).numpy() @ attn.qkv.weight.numpy().T + attn.qkv.bias.numpy()
    v_mean = qkv[..., 16:].mean(axis=1, keepdims=True).repeat(4, axis=1)
    want = attn.proj.weight.numpy() @ v_mean[0].T
    got = attn(block.ln1(mg.tensor(x))).numpy()[0] - attn.proj.bias.numpy()
    np.testing.assert_allclose(got, want.T, rtol=1e-10, atol=1e-12)


def test_errors_name_the_layer_expected_and_actual():
    with pytest.raises(ValueError, match="SelfAttention: dim 10 is not divisible by num_heads 4"):
        M.SelfAttention(10, 4)
    lm = M.TransformerLM(11, 8, 2, num_layers=1, max_len=4)
    with pytest.raises(ValueError, match="TransformerLM: sequence length 5 exceeds max_len 4"):
        lm(np.zeros((1, 5), np.int64))
    with pytest.raises(ValueError, match=r"TransformerLM: ids must be \(batch, tokens\), got"):
        lm(np.zeros(3, np.int64))
