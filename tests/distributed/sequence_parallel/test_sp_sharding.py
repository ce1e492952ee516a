"""Sequence sharding: layouts, positions, split/gather (and their gradients), the ring block plan,
and the errors, on one process and across ranks."""


import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
from minigrad.distributed import sequence_parallel as sp
from minigrad.distributed.sequence_parallel.sharding import check_sequence_length
from minigrad.testing.distributed import run_workers


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("zigzag", [False, True])
def test_shards_partition_the_sequence(world, zigzag):
    seq_len = 4 * world
    held = [p for r in range(world) for a, b in sp.shard_ranges(seq_len, r, world, zigzag)
            for p in range(a, b)]
    assert sorted(held) == list(range(seq_len))
    c = seq_len // world
    for r in range(world):
        ranges = sp.shard_ranges(seq_len, r, world, zigzag)
        assert sum(b - a for a, b in ranges) == c
        if zigzag:  # chunks r and 2N-1-r of 2N
            assert ranges == [(r * c // 2, (r + 1) * c // 2),
                              ((2 * world - 1 - r) * c // 2, (2 * world - r) * c // 2)]
        else:
            assert ranges == [(r * c, (r + 1) * c)]


def test_length_errors_name_length_ranks_and_layout():
    with pytest.raises(ValueError, match=r"L=10 is not divisible by N=3 \(N=3 ranks, contiguous"):
        check_sequence_length("split_sequence", 10, 3, False)
    with pytest.raises(ValueError, match=r"L=6 is not divisible by 2N=4 \(N=2 ranks, zigzag"):
        check_sequence_length("split_sequence", 6, 2, True)
    check_sequence_length("split_sequence", 8, 2, True)


def _visible(rank, source, world, c, zigzag):
    """Brute force: which (query, key) pairs of the block are visible under the causal mask."""
    seq_len = world * c
    pos = [np.concatenate([np.arange(a, b) for a, b in sp.shard_ranges(seq_len, r, world, zigzag)])
           for r in range(world)]
    return pos[rank][:, None] >= pos[source][None, :]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_block_plan_computes_exactly_the_visible_part(world, zigzag):
    c = 6
    work = []
    for rank in range(world):
        elements = 0
        for source in range(world):
            visible = _visible(rank, source, world, c, zigzag)
            plan = sp.ring_block_plan(rank, source, world, c, True, zigzag)
            if plan is None:
                assert not visible.any()
                continue
            region = np.zeros_like(visible)
            region[plan.rows, plan.cols] = True
            assert not (visible & ~region).any(), "a visible pair is not computed"
            inside = visible[plan.rows, plan.cols]
            if plan.diagonal:
                assert source == rank and (inside == np.tril(np.ones_like(inside))).all()
            else:
                assert inside.all(), "a computed block holds masked pairs: it should be cut"
            elements += inside.size
        work.append(elements)
        full = sp.ring_block_plan(rank, (rank + 1) % world, world, c, False, zigzag)
        assert (full.rows, full.cols, full.diagonal) == (slice(0, c), slice(0, c), False)
    if zigzag:  # the same work on every rank: the diagonal plus N-1 half blocks
        assert work == [c * c + (world - 1) * c * c // 2] * world
    else:       # rank r computes r + 1 full blocks
        assert work == [(r + 1) * c * c for r in range(world)]


def test_single_process_split_and_gather_are_identities():
    x = np.arange(12.0).reshape(2, 6)
    assert sp.split_sequence(x, 1) is x
    assert sp.gather_sequence(x, 1, zigzag=True) is x
    assert sp.sequence_positions(6, zigzag=True).tolist() == list(range(6))
    ids, labels = sp.split_lm_batch(np.arange(14).reshape(2, 7))
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
    assert labels.tolist() == [[1, 2, 3, 4, 5, 6], [8, 9, 10, 11, 12, 13]]
    with pytest.raises(ValueError, match=r"expected tokens of shape \(B, L \+ 1\)"):
        sp.split_lm_batch(np.arange(5))


def _sharding_body(x, seed_grad):
    """Every rank: split (Tensor and array), gather back, gradients of both, positions, errors."""
    from minigrad.distributed import comm

    out = {}
    for zigzag in (False, True):
        t = mg.Tensor(x)
        gm = ad.GradManager().attach([t])
        with gm:
            local = sp.split_sequence(t, 1, zigzag)
            full = sp.gather_sequence(local * 2.0, 1, zigzag)
            gm.backward((full * mg.Tensor(seed_grad)).sum())
        out[zigzag] = {
            "local": local.numpy(),
            "array_local": sp.split_sequence(x, 1, zigzag),
            "full": full.numpy(),
            "array_full": sp.gather_sequence(sp.split_sequence(x, 1, zigzag), 1, zigzag),
            "grad_sum": comm.all_reduce(t.grad.numpy()),
            "grad_local": t.grad.numpy(),
            "positions": sp.sequence_positions(x.shape[1], zigzag),
        }
    errors = []
    n = sp.sequence_group().size
    for call in (lambda: sp.split_sequence(np.zeros((2, 2 * n + 2)), 1, True),
                 lambda: sp.split_sequence(np.zeros((2, n + 1)), 1),
                 lambda: sp.split_sequence(np.zeros((2, 8)), 2),
                 lambda: sp.gather_sequence(np.zeros((2, 3)), 1, True)):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_split_and_gather_across_ranks(world):
    rng = np.random.default_rng(world)
    seq_len = 4 * world
    x = rng.standard_normal((2, seq_len, 3))
    seed_grad = rng.standard_normal((2, seq_len, 3))
    res = run_workers(_sharding_body, world, x, seed_grad, timeout=60)
    for zigzag in (False, True):
        for r, out in enumerate(res):
            o = out[zigzag]
            pos = np.concatenate([np.arange(a, b) for a, b in
                                  sp.shard_ranges(seq_len, r, world, zigzag)])
            np.testing.assert_array_equal(o["positions"], pos)
            np.testing.assert_array_equal(o["local"], x[:, pos])
            np.testing.assert_array_equal(o["array_local"], x[:, pos])
            np.testing.assert_array_equal(o["full"], 2 * x)
            np.testing.assert_array_equal(o["array_full"], x)
            # loss = sum over ranks of <gather(2 * split(x)), g>: d/dx = 2 * N * g in total;
            # each rank holds the part of its own tokens (split pads, gather reduce-scatters)
            np.testing.assert_allclose(o["grad_sum"], 2 * world * seed_grad, rtol=1e-12)
            expect_local = np.zeros_like(x)
            expect_local[:, pos] = 2 * world * seed_grad[:, pos]
            np.testing.assert_allclose(o["grad_local"], expect_local, rtol=1e-12)
    for out in res:  # the same clear errors on every rank
        assert out["errors"] == [
            f"split_sequence: sequence length L={2 * world + 2} is not divisible by "
            f"2N={2 * world} (N={world} ranks, zigzag layout)",
            f"split_sequence: sequence length L={world + 1} is not divisible by N={world} "
            f"(N={world} ranks, contiguous layout)",
            "split_sequence: axis 2 is out of range for a 2-D input (2, 8)",
            "gather_sequence: a zigzag shard holds two equal chunks, but axis 1 has 3 tokens "
            "(odd) on this rank",
        ]


def _default_groups():
    before = (sp.sequence_group().ranks, sp.gradient_group().ranks)  # no context yet: WORLD
    ctx = dist.init_parallel(dict(tensor=dict(size=2, mode="sequence")))
    after = (sp.sequence_group().ranks, sp.gradient_group().ranks)
    return before, after, ctx.group("sequence").ranks, ctx.group("sequence_dp").ranks


def test_default_groups_follow_the_sequence_parallel_context():
    """Without a context the sequence helpers use WORLD; after ``init_parallel`` with tensor mode
    "sequence" they use the context's sequence and sequence x data groups."""
    for rank, (before, after, seq, seq_dp) in enumerate(run_workers(_default_groups, 4)):
        assert before == ([0, 1, 2, 3], [0, 1, 2, 3])
        assert after == (seq, seq_dp)
        assert len(seq) == 2 and rank in seq and sorted(seq_dp) == [0, 1, 2, 3]
