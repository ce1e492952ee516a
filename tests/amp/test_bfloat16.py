"""bfloat16 as a dtype (through ml_dtypes): creation, casting, elementwise and reduction ops keep
bfloat16 and match a float64 reference to bfloat16 rounding, gradients flow, matrix products
compute in float32 and round, checkpoints round-trip, and the errors name what is missing."""

from __future__ import annotations

import io

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
from minigrad.backend import dtypes

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
EPS = 2.0**-8  # bfloat16's unit roundoff (8 significant bits)

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
POS = np.abs(A) + 0.5


def _bf(x):
    return mg.tensor(x, dtype="bfloat16")


def _exact(x):
    """``x`` rounded to bfloat16, as float64 (the inputs the op really sees)."""
    return np.asarray(x, np.float32).astype(BF16).astype(np.float64)


def test_dtype_names_and_creation():
    assert mg.tensor([1.0, 2.0], dtype="bfloat16").dtype == BF16
    assert mg.tensor([1.0], dtype=mg.bfloat16).dtype == BF16
    assert mg.tensor([1.0], dtype="bf16").dtype == BF16
    assert mg.Parameter(A, dtype="bfloat16").dtype == BF16
    assert dtypes.is_floating(BF16) and not dtypes.is_floating(np.dtype(np.int16))
    assert dtypes.finfo(BF16).eps == 2.0**-7


def test_casting_rounds_and_round_trips():
    t = _bf(A)
    np.testing.assert_array_equal(t.astype("float32").numpy(), _exact(A).astype(np.float32))
    assert t.astype("float16").dtype == np.float16
    assert mg.tensor(A).astype("bfloat16").dtype == BF16


ELEMENTWISE = [
    ("add", lambda a, b: a + b, np.add, (A, B)),
    ("sub", lambda a, b: a - b, np.subtract, (A, B)),
    ("mul", lambda a, b: a * b, np.multiply, (A, B)),
    ("div", lambda a, b: a / b, np.divide, (A, POS)),
    ("scalar mul", lambda a: a * 2.5, lambda a: a * 2.5, (A,)),
    ("scalar div", lambda a: a / 3, lambda a: a / 3, (A,)),
    ("pow", lambda a: a**2, np.square, (A,)),
    ("neg", lambda a: -a, np.negative, (A,)),
    ("exp", F.exp, np.exp, (A,)),
    ("log", F.log, np.log, (POS,)),
    ("sqrt", F.sqrt, np.sqrt, (POS,)),
    ("tanh", F.tanh, np.tanh, (A,)),
    ("sigmoid", F.sigmoid, lambda a: 1 / (1 + np.exp(-a)), (A,)),
    ("relu", F.relu, lambda a: np.maximum(a, 0), (A,)),
    ("gelu", F.gelu, None, (A,)),
    ("maximum", F.maximum, np.maximum, (A, B)),
    ("clip", lambda a: F.clip(a, -0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), (A,)),
    ("sum", lambda a: F.sum(a, axis=1), lambda a: a.sum(axis=1), (A,)),
    ("mean", F.mean, np.mean, (A,)),
    ("max", lambda a: F.max(a, axis=0), lambda a: a.max(axis=0), (A,)),
    ("prod", lambda a: F.prod(a, axis=1), lambda a: a.prod(axis=1), (A,)),
    ("var", F.var, np.var, (A,)),
    ("softmax", lambda a: F.softmax(a, axis=1),
     lambda a: np.exp(a) / np.exp(a).sum(axis=1, keepdims=True), (A,)),
    ("layer_norm", lambda a: F.nn.layer_norm(a, (4,), affine=False),
     lambda a: (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5), (A,)),
]


@pytest.mark.parametrize("name,op,ref,args", ELEMENTWISE, ids=[e[0] for e in ELEMENTWISE])
def test_ops_keep_bfloat16_and_match_float64(name, op, ref, args):
    out = op(*[_bf(a) for a in args])
    assert out.dtype == BF16, name
    if ref is None:  # gelu: the float64 op as reference
        ref = lambda a: F.gelu(mg.tensor(a)).numpy()  # noqa: E731
    expected = np.asarray(ref(*[_exact(a) for a in args]), np.float64)
    got = out.numpy().astype(np.float64)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=4 * EPS, atol=4 * EPS * scale, err_msg=name)


def test_matrix_products_compute_in_float32_and_round():
    a, b = _bf(A), _bf(B.T.copy())
    out = F.matmul(a, b)
    assert out.dtype == BF16
    exact = (_exact(A).astype(np.float32) @ _exact(B.T).astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(out.numpy(), exact)
    assert F.linear(a, _bf(B)).dtype == BF16
    x = _bf(RNG.standard_normal((1, 2, 5, 5)))
    assert F.conv2d(x, _bf(RNG.standard_normal((3, 2, 3, 3)))).dtype == BF16


def test_gradients_flow_in_bfloat16():
    w = mg.Parameter(A, dtype="bfloat16")
    gm = ad.GradManager().attach([w])
    with gm:
        gm.backward((F.tanh(w) * 3.0).sum())
    assert w.grad.dtype == BF16
    expected = 3.0 * (1 - np.tanh(_exact(A)) ** 2)
    np.testing.assert_allclose(w.grad.numpy().astype(np.float64), expected, atol=8 * EPS * 3)


def test_checkpoint_round_trip_keeps_bits():
    w = mg.Parameter(A, dtype="bfloat16")
    buf = io.BytesIO()
    mg.save({"w": w, "raw": w.numpy()}, buf)
    buf.seek(0)
    back = mg.load(buf)
    assert isinstance(back["w"], mg.Parameter) and back["w"].dtype == BF16
    assert back["raw"].dtype == BF16
    np.testing.assert_array_equal(back["w"].numpy().view(np.uint16), w.numpy().view(np.uint16))
    np.testing.assert_array_equal(back["raw"].view(np.uint16), w.numpy().view(np.uint16))


def test_missing_ml_dtypes_is_named(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ml_dtypes(name, *args, **kwargs):
        if name == "ml_dtypes":
            raise ImportError("no")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(dtypes, "_BFLOAT16", None)
    monkeypatch.setattr(builtins, "__import__", no_ml_dtypes)
    with pytest.raises(ImportError, match="bfloat16 needs the ml_dtypes package"):
        mg.tensor([1.0], dtype="bfloat16")


def test_bfloat16_on_a_gpu_is_refused_with_a_reason():
    from fakes import fake_cupy

    with fake_cupy.installed(1):
        with pytest.raises(TypeError, match="bfloat16 on gpu0: CuPy has no bfloat16 arrays"):
            mg.tensor([1.0], dtype="bfloat16", device="gpu0")
        with pytest.raises(TypeError, match="CuPy has no bfloat16"):
            mg.tensor(np.ones(2, BF16), device="gpu0")


def test_a_bfloat16_array_made_outside_minigrad_is_noticed_in_a_fresh_process():
    """The products skip their bfloat16 test until minigrad has met bfloat16 (``dtypes.SEEN``):
    an ml_dtypes array wrapped as the first thing of a process must switch it on."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import numpy as np, ml_dtypes, minigrad as mg, minigrad.functional as F\n"
            "a = mg.tensor(np.ones((2, 2), ml_dtypes.bfloat16))\n"
            "print(F.matmul(a, a).dtype, F.linear(a, a).dtype)\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                         check=True).stdout
    assert out.split() == ["bfloat16", "bfloat16"]


def test_long_sums_accumulate_in_float32_forward_and_backward():
    # ml_dtypes adds bfloat16 in bfloat16: 50,000 values in [0, 1) would sum to 256. The sum,
    # a broadcast's gradient (SumTo) and linear's bias gradient must keep float32 accuracy
    n = 50_000
    v = np.random.default_rng(3).random(n)
    vb = v.astype(BF16)
    exact = vb.astype(np.float64).sum()
    assert abs(float(_bf(v).sum().item()) - exact) <= exact * EPS
    assert abs(float(F.mean(_bf(v)).item()) - exact / n) <= exact / n * EPS
    b = mg.Parameter(np.zeros((1, 1)), dtype="bfloat16")
    bias = mg.Parameter(np.zeros(1), dtype="bfloat16")
    w = mg.Parameter(np.ones((1, 1)), dtype="bfloat16")
    gm = ad.GradManager().attach([b, bias, w])
    dy = mg.tensor(vb.reshape(n, 1))
    with gm:
        y = F.broadcast_to(b, (n, 1)) + F.linear(_bf(np.zeros((n, 1))), w, bias)
        gm.backward(y, dy)
    for p in (b, bias):
        assert p.grad.dtype == BF16
        assert abs(float(p.grad.numpy().astype(np.float64).sum()) - exact) <= exact * EPS
