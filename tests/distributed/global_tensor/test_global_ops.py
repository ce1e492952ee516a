"""Ops on global tensors: each row of the SBP table (package docstring) on 2, 3 and 4 ranks with
uneven shapes (some pieces empty) gives the single-process result, the documented output SBP, and
the single-process gradients of its inputs. One launched job per world size runs every row."""

import numpy as np
import pytest
from global_tensor_helpers import assemble, make_global, sbp_of

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.testing.distributed import run_workers

N, D, C = 5, 7, 4  # uneven over 2, 3 and 4 ranks
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, D))
Y = RNG.standard_normal((N, D))
V = RNG.standard_normal((D,))
W = RNG.standard_normal((D, 3))
WL = RNG.standard_normal((3, D))  # linear weight (out, in)
BL = RNG.standard_normal((3,))
SQ = RNG.standard_normal((D, D))
R1 = RNG.standard_normal((1, D))
A3 = RNG.standard_normal((3, N, 4))
B3 = RNG.standard_normal((3, 4, 2))
T3 = RNG.standard_normal((N, 2, 3))
LOGITS = RNG.standard_normal((N, C))
LABELS = RNG.integers(0, C, N).astype("int32")

# (row, fn, inputs as (array, sbp name), expected output sbp name(s))
CASES = [
    ("elementwise S0 + S1", lambda x, y: x + y, [(X, "S0"), (Y, "S1")], "S0"),
    ("elementwise broadcast", lambda x, v: x * v, [(X, "S1"), (V, "B")], "S1"),
    ("elementwise unary", lambda x: F.exp(F.relu(x)), [(X, "S1")], "S1"),
    ("elementwise gelu", lambda x: F.gelu(x), [(X, "S0")], "S0"),
    ("comparison", lambda x: x > 0.1, [(X, "S0")], "S0"),
    ("where", lambda x, y: F.where(x > 0, x, y), [(X, "S0"), (Y, "B")], "S0"),
    ("astype", lambda x: x.astype("float32").astype("float64"), [(X, "S1")], "S1"),
    ("add P + P", lambda x, y: x + y, [(X, "P"), (Y, "P")], "P"),
    ("add P + B", lambda x, y: x - y, [(X, "P"), (Y, "B")], "P"),
    ("mul P * B", lambda x, y: x * y, [(X, "P"), (Y, "B")], "P"),
    ("mul P * P", lambda x, y: x * y, [(X, "P"), (Y, "P")], "P"),
    ("div P / B", lambda x, y: x / (y * y + 1.0), [(X, "P"), (Y, "B")], "P"),
    ("neg P", lambda x: -x, [(X, "P")], "P"),
    ("P + scalar", lambda x: x + 1.0, [(X, "P")], "B"),
    ("nonlinear P", lambda x: F.exp(x), [(X, "P")], "B"),
    ("matmul (S0, B)", lambda a, b: a @ b, [(X, "S0"), (W, "B")], "S0"),
    ("matmul (B, S1)", lambda a, b: a @ b, [(X, "B"), (W, "S1")], "S1"),
    ("matmul (S1, S0)", lambda a, b: a @ b, [(X, "S1"), (W, "S0")], "P"),
    ("matmul (B, B)", lambda a, b: a @ b, [(X, "B"), (W, "B")], "B"),
    ("matmul (P, B)", lambda a, b: a @ b, [(X, "P"), (W, "B")], "P"),
    ("matmul S0 @ S1 (b gathered)", lambda a, b: a @ b, [(X, "S0"), (SQ, "S1")], "S0"),
    ("matmul batch", lambda a, b: F.matmul(a, b), [(A3, "S0"), (B3, "S0")], "S0"),
    ("linear (S0, B, B)", F.linear, [(X, "S0"), (WL, "B"), (BL, "B")], "S0"),
    ("linear (B, S0, S0)", F.linear, [(X, "B"), (WL, "S0"), (BL, "S0")], "S1"),
    ("linear (S1, S1, B)", F.linear, [(X, "S1"), (WL, "S1"), (BL, "B")], "P"),
    ("linear (P, B, B)", F.linear, [(X, "P"), (WL, "B"), (BL, "B")], "P"),
    ("linear (B, B, B)", F.linear, [(X, "B"), (WL, "B"), (BL, "B")], "B"),
    ("sum over the split axis", lambda x: x.sum(axis=0), [(X, "S0")], "P"),
    ("sum over another axis", lambda x: x.sum(axis=1, keepdims=True), [(X, "S0")], "S0"),
    ("sum of P", lambda x: x.sum(axis=1), [(X, "P")], "P"),
    ("mean over all", lambda x: x.mean(), [(X, "S1")], "P"),
    ("mean over another axis", lambda x: x.mean(axis=0), [(X, "S1")], "S0"),
    ("prod over another axis", lambda x: (x * 0.5 + 1.0).prod(axis=1), [(X, "S0")], "S0"),
    ("prod over the split axis", lambda x: (x * 0.5 + 1.0).prod(axis=0), [(X, "S0")], "B"),
    ("argmax over another axis", lambda x: F.argmax(x, axis=1), [(X, "S0")], "S0"),
    ("argmax over the split axis", lambda x: F.argmax(x, axis=0), [(X, "S0")], "B"),
    ("softmax, split elsewhere", lambda x: F.softmax(x, axis=1), [(X, "S0")], "S0"),
    ("softmax over the split axis", lambda x: F.softmax(x, axis=1), [(X, "S1")], "B"),
    ("logsoftmax", lambda x: F.logsoftmax(x, axis=0), [(X, "S1")], "S1"),
    ("layer_norm", lambda x, w, b: F.nn.layer_norm(x, D, True, w, b), [(X, "S0"), (V, "B"),
                                                                       (V * 0.5, "B")], "S0"),
    ("layer_norm, split normalised", lambda x: F.nn.layer_norm(x, D, False), [(X, "S1")], "B"),
    ("cross_entropy mean", lambda p, y: F.nn.cross_entropy(p, y), [(LOGITS, "S0"),
                                                                   (LABELS, "S0")], "P"),
    ("cross_entropy sum", lambda p, y: F.nn.cross_entropy(p, y, reduction="sum"),
     [(LOGITS, "S0"), (LABELS, "B")], "P"),
    ("cross_entropy none", lambda p, y: F.nn.cross_entropy(p, y, reduction="none"),
     [(LOGITS, "S0"), (LABELS, "S0")], "S0"),
    ("cross_entropy broadcast", lambda p, y: F.nn.cross_entropy(p, y), [(LOGITS, "B"),
                                                                        (LABELS, "B")], "B"),
    ("cross_entropy class split", lambda p, y: F.nn.cross_entropy(p, y), [(LOGITS, "S1"),
                                                                          (LABELS, "B")], "B"),
    ("reshape keeping the split", lambda x: x.reshape(N, D, 1), [(X, "S0")], "S0"),
    ("flatten", lambda t: F.flatten(t, 1), [(T3, "S0")], "S0"),
    ("reshape merging the split", lambda x: x.reshape(-1), [(X, "S1")], "B"),
    ("reshape of P", lambda x: x.reshape(D, N), [(X, "P")], "P"),
    ("transpose", lambda x: x.T, [(X, "S0")], "S1"),
    ("broadcast_to", lambda r: F.broadcast_to(r, (N, D)), [(R1, "S1")], "S1"),
    ("sum_to, kept axis", lambda x: F.sum_to(x, (1, D)), [(X, "S1")], "S1"),
    ("sum_to, summed axis", lambda x: F.sum_to(x, (1, D)), [(X, "S0")], "P"),
    ("getitem, split axis whole", lambda x: x[:, 2:5], [(X, "S0")], "S0"),
    ("getitem, int index", lambda x: x[:, 1], [(X, "S0")], "S0"),
    ("getitem on the split axis", lambda x: x[1:4], [(X, "S0")], "B"),
    ("getitem of P", lambda x: x[1:4, ::2], [(X, "P")], "P"),
    ("concat elsewhere", lambda a, b: F.concat([a, b], axis=1), [(X, "S0"), (Y, "S0")], "S0"),
    ("concat on the split axis", lambda a, b: F.concat([a, b], axis=0), [(X, "S0"), (Y, "S0")],
     "B"),
    ("split elsewhere", lambda x: F.split(x, 2, axis=0), [(X, "S1")], ["S1", "S1"]),
    ("other op (cumsum)", lambda x: F.cumsum(x, axis=1), [(X, "S0")], "B"),
    ("other op (max)", lambda x: F.max(x, axis=1), [(X, "S0")], "B"),
]


def _run(fn, arrays, make):
    """fn on tensors made by ``make``; the float inputs are attached and get gradients from
    sum(sin(out)) over the float outputs."""
    xs = [make(a, name) for a, name in arrays]
    floats = [x for x in xs if x.dtype.kind == "f"]
    gm = ad.GradManager().attach(floats)
    with gm:
        out = fn(*xs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        diff = [o for o in outs if o.dtype.kind == "f"]
        if diff:
            loss = F.sin(diff[0]).sum()
            for o in diff[1:]:
                loss = loss + F.sin(o).sum()
            gm.backward(loss)
    return outs, [x.grad for x in floats]


def _dtype(a):
    return "float64" if a.dtype.kind == "f" else "int32"


def _global_rows(n):
    P = mg.placement("cpu", list(range(n)))
    out = []
    for _, fn, arrays, _ in CASES:
        outs, grads = _run(fn, arrays, lambda a, s: make_global(a, (s,), P, dtype=_dtype(a)))
        out.append(dict(
            out=[o.to_local().numpy() for o in outs], sbp=[o.sbp for o in outs],
            shape=[o.shape for o in outs],
            grads=[None if g is None else g.to_local().numpy() for g in grads],
            grad_sbp=[None if g is None else g.sbp for g in grads]))
    return dist.get_rank(), out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_row_of_the_table_matches_one_process(n):
    results = dict(run_workers(_global_rows, n, n, timeout=120))
    mesh = list(range(n))
    for i, (name, fn, arrays, expected) in enumerate(CASES):
        outs, grads = _run(fn, arrays, lambda a, s: mg.tensor(a, dtype=_dtype(a)))
        expected = expected if isinstance(expected, list) else [expected]
        row = {r: results[r][i] for r in results}
        for j, (ref, want) in enumerate(zip(outs, expected)):
            assert row[0]["sbp"][j] == (sbp_of(want),), (name, row[0]["sbp"][j])
            assert row[0]["shape"][j] == ref.shape, name
            got = assemble({r: row[r]["out"][j] for r in row}, (want,), mesh, ref.shape)
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
        floats = [(a, s) for a, s in arrays if a.dtype.kind == "f"]
        for k, ((a, s), ref) in enumerate(zip(floats, grads)):
            if ref is None:
                continue
            assert row[0]["grad_sbp"][k] == (sbp_of(s),), name
            got = assemble({r: row[r]["grads"][k] for r in row}, (s,), mesh, a.shape)
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name}: gradient of input {k}")


def _linear_on_3d_batches():
    """OneFlow: ``Linear`` on a (N, L, K) batch split along dim 0 stays split (data parallel),
    forward and backward, whenever the ranks divide N evenly; otherwise it is still right."""
    P = mg.placement("cpu", list(range(dist.get_world_size())))
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((3, 5)), rng.standard_normal(3)
    out = {}
    for n in (4, 3):
        x_full = rng.standard_normal((n, 2, 5))
        x = mg.tensor(x_full).to_global(P, mg.sbp.broadcast).to_global(sbp=mg.sbp.split(0))
        wg = mg.Parameter(w).to_global(P, mg.sbp.broadcast)
        bg = mg.Parameter(b).to_global(P, mg.sbp.broadcast)
        gm = ad.GradManager().attach([wg, bg])
        with gm:
            y = F.linear(x, wg, bg)
            gm.backward((y * y).sum())
        whole = y.to_global(sbp=mg.sbp.broadcast).to_local().numpy()
        out[n] = dict(sbp=str(y.sbp), local=y.to_local().shape, whole=whole,
                      ref=x_full @ w.T + b,
                      dw=wg.grad.to_global(sbp=mg.sbp.broadcast).to_local().numpy(),
                      ref_dw=2 * np.einsum("nlo,nli->oi", x_full @ w.T + b, x_full))
    return out


def test_linear_on_a_3d_batch_split_along_dim_0_stays_split():
    for out in run_workers(_linear_on_3d_batches, 2):
        even, odd = out[4], out[3]
        assert even["sbp"] == str(mg.sbp.split(0)) or "split(dim=0)" in even["sbp"]
        assert even["local"] == (2, 2, 3)  # each rank computes its half of the batch only
        for case in (even, odd):
            np.testing.assert_allclose(case["whole"], case["ref"], rtol=1e-12)
            np.testing.assert_allclose(case["dw"], case["ref_dw"], rtol=1e-10)
