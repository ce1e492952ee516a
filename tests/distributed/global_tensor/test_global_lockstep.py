"""Ranks that run different global ops (a rank-dependent branch) get an error naming the op on
every rank, at once or within the collective timeout, instead of a hang."""

import time

import numpy as np
from global_tensor_helpers import make_global, sbp_of

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
from minigrad.distributed.comm.group import GroupContext
from minigrad.distributed.global_tensor import LockstepError, is_lockstep_check_enabled
from minigrad.testing.distributed import run_workers


def _diverge(kind):
    rank = dist.get_rank()
    P = mg.placement("cpu", [0, 1, 2])
    x = mg.randn(6, 4, placement=P, sbp=mg.sbp.split(0))
    start = time.monotonic()
    try:
        if kind == "extra op" and rank == 0:
            x = x * 2.0  # only rank 0 runs this op
        if kind == "other redistribution" and rank == 1:
            return x.to_global(sbp=mg.sbp.split(1)).shape
        if kind == "missing rank" and rank == 2:
            return "left"  # never joins the all-gather below
        return x.to_global(sbp=mg.sbp.broadcast).shape
    except LockstepError as exc:
        return str(exc), time.monotonic() - start


def test_a_rank_dependent_op_raises_on_every_rank():
    for rank, (msg, _) in enumerate(run_workers(_diverge, 3, "extra op")):
        assert "global ops diverged on placement" in msg, rank
        assert "rank 0 ran #1 new tensor (6, 4) (S(0)) then #2 Mul (6, 4) (S(0)) then #3 " \
               "to_global (6, 4) (S(0)) -> (B)" in msg, msg
        assert "rank 1 ran #1 new tensor (6, 4) (S(0)) then #2 to_global" in msg, msg
        assert "rank-dependent branch" in msg


def test_a_different_redistribution_raises_on_every_rank():
    out = run_workers(_diverge, 3, "other redistribution")
    for rank, (msg, _) in enumerate(out):
        assert "rank 1 ran #1 new tensor (6, 4) (S(0)) then #2 to_global (6, 4) (S(0)) -> " \
               "(S(1))" in msg, (rank, msg)
        assert "rank 0 ran #1 new tensor (6, 4) (S(0)) then #2 to_global (6, 4) (S(0)) -> " \
               "(B)" in msg, (rank, msg)


def test_a_rank_that_never_arrives_makes_the_others_raise_within_the_timeout():
    out = run_workers(_diverge, 3, "missing rank", collective_timeout=3, timeout=120)
    assert out[2] == "left"
    for msg, elapsed in out[:2]:
        assert "did not all arrive" in msg and "to_global (6, 4)" in msg
        assert elapsed < 60  # far below the job's 120 s: the collective timeout ended it


def _collectives_per_redistribution():
    """With the lockstep check on: the collectives (calls that take a sequence number in any
    group) of each 1-D redistribution, forward and backward."""
    assert is_lockstep_check_enabled()
    P = mg.placement("cpu", [0, 1, 2])
    calls = []
    original = GroupContext.next_seq

    def counting(self):
        calls.append(tuple(self.ranks))
        return original(self)

    out = {}
    for src, dst in [("S0", "B"), ("P", "B"), ("P", "S1"), ("S0", "S1"), ("S1", "S0")]:
        x = make_global(np.arange(35.0).reshape(5, 7), (src,), P)
        gm = ad.GradManager().attach([x])
        with gm:
            GroupContext.next_seq = counting
            try:
                y = x.to_global(sbp=sbp_of(dst))
                forward = list(calls)
                calls.clear()
                gm.backward(y.to_local().sum())
            finally:
                GroupContext.next_seq = original
        out[(src, dst)] = (forward, list(calls))
        calls.clear()
    return out


def test_one_collective_per_redistribution_with_the_check_on():
    # the digests ride in the fingerprint of the redistribution's own collective: no second
    # round (an all-gather of digests before it, as before)
    # (a broadcast result's backward adds to_local's replicated-gradient check: its own small
    # all-gather, not a second round of the redistribution)
    for per_rank in run_workers(_collectives_per_redistribution, 3):
        for pair, (forward, backward) in per_rank.items():
            assert forward == [(0, 1, 2)], (pair, forward)
            assert backward == [(0, 1, 2)] * (2 if pair[1] == "B" else 1), (pair, backward)
