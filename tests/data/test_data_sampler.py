"""Samplers: MegEngine-style rank sharding, per-epoch permutations, batching and errors."""

import math
import sys
import types

import numpy as np
import pytest

from minigrad import seams
from minigrad.data.sampler import (
    Infinite,
    RandomSampler,
    ReplacementSampler,
    SequentialSampler,
    StreamSampler,
)


def flat(batches):
    return [i for b in batches for i in b]


def reference_pad(indices, world):
    """Pad by repeating the head (cyclically, for tiny lists) to a multiple of world."""
    total = math.ceil(len(indices) / world) * world
    return [indices[k % len(indices)] for k in range(total)]


def interleave(shards):
    """Undo rank sharding: padded[r + k * world] = shards[r][k]."""
    world = len(shards)
    assert len({len(s) for s in shards}) == 1, "every rank must get the same number of samples"
    return [shards[k % world][k // world] for k in range(world * len(shards[0]))]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [3, 10, 11])
def test_sequential_shards_match_spec(world, n):
    ds = list(range(n))
    padded = reference_pad(list(range(n)), world)
    for rank in range(world):
        s = SequentialSampler(ds, batch_size=2, world_size=world, rank=rank)
        assert flat(s) == padded[rank::world]
        assert len(s) == math.ceil(len(padded) // world / 2) == len(list(s))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_random_same_permutation_across_ranks_new_each_epoch(world):
    n = 22
    ds = list(range(n))
    samplers = [RandomSampler(ds, batch_size=3, world_size=world, rank=r, seed=5)
                for r in range(world)]
    perms = []
    for _ in range(3):
        padded = interleave([flat(s) for s in samplers])
        perm = padded[:n]
        assert sorted(perm) == list(range(n))  # a permutation: disjoint shards up to padding
        assert padded[n:] == perm[: len(padded) - n]  # padding repeats the head
        perms.append(perm)
    assert perms[0] != perms[1] != perms[2] and perms[0] != perms[2]
    # set_epoch replays an epoch; the same seed on a new sampler gives the same sequence.
    samplers[0].set_epoch(1)
    assert flat(samplers[0]) == reference_pad(perms[1], world)[0::world]
    fresh = RandomSampler(ds, batch_size=3, world_size=world, rank=0, seed=5)
    assert flat(fresh) == reference_pad(perms[0], world)[0::world]
    other = RandomSampler(ds, batch_size=3, world_size=world, rank=0, seed=6)
    assert flat(other) != reference_pad(perms[0], world)[0::world]


def test_drop_last_and_len():
    ds = list(range(10))
    s = RandomSampler(ds, batch_size=4, drop_last=True, seed=0)
    batches = list(s)
    assert len(s) == 2 == len(batches) and all(len(b) == 4 for b in batches)
    s = RandomSampler(ds, batch_size=4, drop_last=False, seed=0)
    assert [len(b) for b in s] == [4, 4, 2] and len(s) == 3
    # Per rank: 10 samples over 3 ranks -> 4 each (2 padded); batch 3 -> 1 full batch if drop_last.
    s = SequentialSampler(ds, batch_size=3, drop_last=True, world_size=3, rank=2)
    assert len(s) == 1 and list(s) == [[2, 5, 8]]


def test_indices_argument():
    ds = list(range(10))
    assert flat(SequentialSampler(ds, batch_size=2, indices=[7, 1, 3])) == [7, 1, 3]
    assert sorted(flat(RandomSampler(ds, batch_size=2, indices=[7, 1, 3], seed=0))) == [1, 3, 7]
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 10\)"):
        SequentialSampler(ds, indices=[3, 10])


def test_replacement_sampler_weights_and_sharding():
    ds = list(range(4))
    weights = [0.0, 1.0, 2.0, 5.0]
    s = ReplacementSampler(ds, batch_size=100, num_samples=8000, weights=weights, seed=1)
    draws = np.array(flat(s))
    assert len(draws) == 8000 and len(s) == 80
    freq = np.bincount(draws, minlength=4) / len(draws)
    expected = np.array(weights) / sum(weights)
    assert freq[0] == 0
    assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected * (1 - expected) / 8000) + 1e-12)
    shards = [flat(ReplacementSampler(ds, 7, num_samples=21, world_size=2, rank=r, seed=3))
              for r in range(2)]
    padded = interleave(shards)
    assert len(padded) == 22 and padded[21:] == padded[:1]


def test_infinite_repeats_with_new_epochs():
    ds = list(range(6))
    inner = RandomSampler(ds, batch_size=6, seed=0)
    inf = Infinite(inner)
    assert inf.batch_size == 6 and inf.seed == 0 and len(inf) == sys.maxsize
    it = iter(inf)
    epochs = [next(it) for _ in range(4)]
    assert all(sorted(e) == list(range(6)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1
    ref = RandomSampler(ds, batch_size=6, seed=0)
    assert epochs == [b for _ in range(4) for b in ref]


@pytest.fixture
def job(monkeypatch):
    """Pretend to be rank ``job.rank`` of ``job.world`` (None: no process group) for samplers."""
    state = types.SimpleNamespace(world=None, rank=0)
    previous = seams.WORLD.install(
        lambda: None if state.world is None else (state.world, state.rank))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    yield state
    seams.WORLD.install(previous)


def test_default_world_comes_from_the_process_group(job):
    job.world, job.rank = 3, 1
    s = SequentialSampler(list(range(9)), batch_size=10)
    assert (s.world_size, s.rank) == (3, 1) and flat(s) == [1, 4, 7]
    r = RandomSampler(list(range(9)))  # seed=None must still agree across ranks
    r0 = RandomSampler(list(range(9)), rank=0)
    padded = interleave([flat(r0), flat(r), flat(RandomSampler(list(range(9)), rank=2))])
    assert sorted(padded) == list(range(9))
    assert RandomSampler(list(range(9)), world_size=3).rank == 1  # the group's own rank
    job.world = None
    s = SequentialSampler(list(range(9)))
    assert (s.world_size, s.rank) == (1, 0)


def test_missing_world_size_or_rank_is_an_error_not_a_guess(job, monkeypatch):
    # without a process group, half a position would silently make every process rank 0
    with pytest.raises(ValueError, match=r"RandomSampler: world_size=4 given without rank "
                                         r"\(no process group is initialised\); pass rank="):
        RandomSampler(list(range(8)), world_size=4)
    with pytest.raises(ValueError, match=r"SequentialSampler: rank=1 given without world_size"):
        SequentialSampler(list(range(8)), rank=1)
    job.world, job.rank = 2, 1
    with pytest.raises(ValueError, match=r"world_size=4 given without rank \(the process group "
                                         r"has world size 2\)"):
        StreamSampler(world_size=4)
    assert SequentialSampler(list(range(8)), world_size=1).rank == 0  # one rank: no ambiguity
    # a launched rank that builds its sampler before init_process_group would read everything
    job.world = None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match=r"RandomSampler: this process is rank 1 of 2 .* "
                                           r"call dist.init_process_group\(\) before"):
        RandomSampler(list(range(8)))
    assert RandomSampler(list(range(8)), world_size=2, rank=1).rank == 1  # explicit is fine


def test_epoch_is_the_current_pass(job):
    s = RandomSampler(list(range(6)), batch_size=6, seed=3)
    assert s.epoch == 0
    first = next(iter(s))
    assert s.epoch == 0  # while (and after) iterating epoch 0, epoch says 0
    it = iter(s)
    assert s.epoch == 1 and next(it) != first
    s.set_epoch(0)
    assert s.epoch == 0 and next(iter(s)) == first  # set_epoch(e): the next pass draws e
    assert s.epoch == 0 and next(iter(s)) != first and s.epoch == 1
    inf = Infinite(s)
    assert inf.epoch == 1


def test_reprs_show_position_batching_and_order(job):
    ds = list(range(10))
    assert repr(RandomSampler(ds, batch_size=4, world_size=2, rank=1, seed=7)) == (
        "RandomSampler(n=10, batch_size=4, drop_last=False, world_size=2, rank=1, shuffle=True, "
        "seed=7, epoch=0)")
    assert repr(SequentialSampler(ds, batch_size=3, drop_last=True)) == (
        "SequentialSampler(n=10, batch_size=3, drop_last=True, world_size=1, rank=0, "
        "shuffle=False)")
    assert "replacement=True, weighted=True" in repr(
        ReplacementSampler(ds, 2, weights=[1] * 10, seed=0))
    assert repr(StreamSampler(batch_size=8, world_size=4, rank=3)) == (
        "StreamSampler(batch_size=8, drop_last=False, world_size=4, rank=3)")
    assert repr(Infinite(SequentialSampler(ds))).startswith("Infinite(SequentialSampler(n=10")


def test_bad_arguments():
    ds = list(range(5))
    with pytest.raises(ValueError, match=r"RandomSampler: batch_size must be >= 1, got 0"):
        RandomSampler(ds, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        SequentialSampler(ds, batch_size=2.5)
    with pytest.raises(ValueError, match=r"rank must be < world_size \(2\), got rank 2"):
        SequentialSampler(ds, world_size=2, rank=2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        SequentialSampler(ds, world_size=0)
    with pytest.raises(ValueError, match="weights must have shape"):
        ReplacementSampler(ds, weights=[1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        ReplacementSampler(ds, weights=[1, -1, 1, 1, 1])
    with pytest.raises(TypeError, match="map-style dataset"):
        RandomSampler(iter(ds))
    with pytest.raises(TypeError, match="Infinite"):
        Infinite([1, 2])
    with pytest.raises(ValueError, match="rank must be <"):
        StreamSampler(world_size=2, rank=3)


def _shard_of_rank(n):
    s = RandomSampler(list(range(n)), batch_size=n, seed=1)  # no world_size/rank given
    return s.world_size, s.rank, flat(s)


def test_sampler_takes_its_shard_from_a_real_process_group():
    from minigrad.testing.distributed import run_workers

    out = run_workers(_shard_of_rank, 2, 7)
    assert [(w, r) for w, r, _ in out] == [(2, 0), (2, 1)]
    padded = interleave([shard for _, _, shard in out])
    assert sorted(padded[:7]) == list(range(7)) and padded[7:] == padded[:1]
