"""Ring and Ulysses attention equal single-device attention in float64 — output, input gradients —
for N = 2, 3, 4, causal or not, contiguous or zigzag shards; the ring kernel's score blocks are
measured (never more than (L/N)² per head; masked blocks skipped, zigzag work balanced); errors are
raised on every rank. One launched job per N runs all of its cases."""

import itertools

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
from minigrad.distributed import comm
from minigrad.distributed import sequence_parallel as sp
from minigrad.testing.distributed import run_workers

B, D, DV = 2, 3, 4
CASES = list(itertools.product(("ring", "ulysses"), (False, True), (False, True)))


def _numpy_attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _reference(q, k, v, dout, causal):
    """Output (NumPy) and input gradients (minigrad's single-device attention) of <out, dout>."""
    ts = [mg.Tensor(a) for a in (q, k, v)]
    gm = ad.GradManager().attach(ts)
    with gm:
        out = F.scaled_dot_product_attention(*ts, is_causal=causal)
        gm.backward((out * mg.Tensor(dout)).sum())
    np.testing.assert_allclose(out.numpy(), _numpy_attention(q, k, v, causal), rtol=1e-12)
    return [_numpy_attention(q, k, v, causal)] + [t.grad.numpy() for t in ts]


def _attention_body(q, k, v, dout):
    """Every case on this rank: gathered output, summed input gradients, the score blocks."""
    results = {}
    for impl, causal, zigzag in CASES:
        ts = [mg.Tensor(a) for a in (q, k, v)]
        gm = ad.GradManager().attach(ts)
        attn = (sp.RingAttention(causal, zigzag) if impl == "ring"
                else sp.UlyssesAttention(causal, zigzag=zigzag))
        with sp.record_score_blocks() as blocks, gm:
            local = [sp.split_sequence(t, 2, zigzag) for t in ts]
            out = attn(*local)
            gm.backward((out * sp.split_sequence(mg.Tensor(dout), 2, zigzag)).sum())
        results[impl, causal, zigzag] = {
            "out": sp.gather_sequence(out.numpy(), 2, zigzag),
            # split's backward leaves each rank the gradient of its own tokens: sum them
            "grads": [comm.all_reduce(t.grad.numpy()) for t in ts],
            "blocks": list(blocks),
        }
    # overlap off: the same messages in the same order, so the same bits
    local = [mg.Tensor(sp.split_sequence(a, 2, True)) for a in (q, k, v)]
    results["no_overlap"] = [sp.ring_attention(*local, causal=True, zigzag=True, overlap=o).numpy()
                             for o in (True, False)]
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_attention_equals_single_device(world):
    heads, c = world, 4          # Ulysses needs heads divisible by N; zigzag needs even shards
    seq_len = c * world
    rng = np.random.default_rng(world)
    q, k = (rng.standard_normal((B, heads, seq_len, D)) for _ in range(2))
    v, dout = (rng.standard_normal((B, heads, seq_len, DV)) for _ in range(2))
    refs = {causal: _reference(q, k, v, dout, causal) for causal in (False, True)}
    res = run_workers(_attention_body, world, q, k, v, dout, timeout=120)
    for impl, causal, zigzag in CASES:
        out, dq, dk, dv = refs[causal]
        per_rank = [r[impl, causal, zigzag] for r in res]
        for r, got in enumerate(per_rank):
            case = f"{impl} causal={causal} zigzag={zigzag} rank {r}"
            np.testing.assert_allclose(got["out"], out, rtol=1e-10, atol=1e-12, err_msg=case)
            for name, g, ref in zip("qkv", got["grads"], (dq, dk, dv)):
                np.testing.assert_allclose(g, ref, rtol=1e-10, atol=1e-12,
                                           err_msg=f"d{name} {case}")
        if impl == "ulysses":
            assert all(not got["blocks"] for got in per_rank)
            continue
        for r, got in enumerate(per_rank):
            forward = [b for b in got["blocks"] if b.phase == "forward"]
            # measured: no score block larger than (L/N)^2 per head, for every batch and head
            assert all(b.shape[:2] == (B, heads) for b in got["blocks"])
            assert max(b.shape[2] * b.shape[3] for b in got["blocks"]) == c * c
            assert max(b.nbytes for b in got["blocks"]) == B * heads * c * c * 8
            if not causal:
                assert [b.source for b in forward] == [(r - t) % world for t in range(world)]
            elif zigzag:  # the diagonal and N-1 half blocks: the same work on every rank
                assert [b.shape[2:] for b in forward] == [(c, c)] + [
                    (c, c // 2) if (r - t) % world < r else (c // 2, c) for t in range(1, world)
                ]
            else:  # blocks of later ranks are skipped: rank r computes r + 1 of them
                assert [b.source for b in forward] == list(range(r, -1, -1))
            backward = [b for b in got["blocks"] if b.phase == "backward"]
            assert len(backward) == 2 * len(forward)  # P and dP per computed block
        if causal and zigzag:
            work = [sum(b.shape[2] * b.shape[3] for b in got["blocks"]) for got in per_rank]
            assert len(set(work)) == 1
    for r in res:
        np.testing.assert_array_equal(r["no_overlap"][0], r["no_overlap"][1])


def _error_body(heads):
    """Each error must reach every rank (no rank left waiting)."""
    rank = mg.distributed.get_rank()
    messages = []
    x = mg.Tensor(np.zeros((1, heads, 4, 2)))
    try:
        sp.UlyssesAttention()(x, x, x)
    except ValueError as exc:
        messages.append(str(exc))
    # rank 1 holds 6 tokens where the others hold 4: the ring detects it on every rank
    y = mg.Tensor(np.zeros((1, heads, 6 if rank == 1 else 4, 2)))
    try:
        sp.RingAttention()(y, y, y)
    except ValueError as exc:
        messages.append(str(exc))
    z = mg.Tensor(np.zeros((1, heads, 3, 2)))
    try:
        sp.RingAttention(zigzag=True)(z, z, z)
    except ValueError as exc:
        messages.append(str(exc))
    try:
        sp.RingAttention()(z, z, mg.Tensor(np.zeros((1, heads, 3, 2), np.float32)))
    except TypeError as exc:
        messages.append(str(exc))
    return messages


def test_errors_reach_every_rank():
    res = run_workers(_error_body, 4, 6, timeout=60, collective_timeout=20)
    for messages in res:
        assert len(messages) == 4, messages
        assert messages[0] == (
            "UlyssesAttention: heads=6 is not divisible by N=4 (the ranks of the sequence group); "
            "each rank attends over H/N whole heads"
        )
        assert "RingAttention: the shards differ across the sequence group" in messages[1]
        assert "(1, 6, 6, 2)" in messages[1] and "(1, 6, 4, 2)" in messages[1]
        assert "must be even; got 3 tokens" in messages[2]
        assert messages[3] == (
            "RingAttention: q, k, v must share one dtype, got float64, float64, float32"
        )


def test_single_rank_ring_is_exact_attention_without_communication():
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((2, 3, 8, D)) for _ in range(2))
    v, dout = (rng.standard_normal((2, 3, 8, DV)) for _ in range(2))
    for causal in (False, True):
        out, dq, dk, dv = _reference(q, k, v, dout, causal)
        ts = [mg.Tensor(a) for a in (q, k, v)]
        gm = ad.GradManager().attach(ts)
        with gm:
            got = sp.RingAttention(causal=causal)(*ts)
            gm.backward((got * mg.Tensor(dout)).sum())
        np.testing.assert_allclose(got.numpy(), out, rtol=1e-10, atol=1e-12)
        for t, ref in zip(ts, (dq, dk, dv)):
            np.testing.assert_allclose(t.grad.numpy(), ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"q \(2, 3, 8, 3\), k \(2, 3, 7, 3\)"):
        sp.RingAttention()(ts[0], mg.Tensor(k[:, :, :7]), ts[2])
    with pytest.raises(ValueError, match=r"must be \(batch, heads, tokens, head_dim\)"):
        sp.UlyssesAttention()(mg.Tensor(q[0]), ts[1], ts[2])
