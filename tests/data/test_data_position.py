"""DataLoader.state_dict / load_state_dict: a resumed loader reads the next batch, not the
first."""

import numpy as np
import pytest

from minigrad.data import DataLoader
from minigrad.data.dataset import ArrayDataset, StreamDataset
from minigrad.data.sampler import Infinite, RandomSampler


def _loader(infinite=False):
    ds = ArrayDataset(np.arange(20.0))
    sampler = RandomSampler(ds, batch_size=3, seed=5)
    return DataLoader(ds, Infinite(sampler) if infinite else sampler)


def _first(batch):
    return batch[0].tolist()


def test_resume_mid_epoch_continues_with_the_next_batch():
    loader = _loader()
    list(loader)  # epoch 0 done
    it = iter(loader)  # epoch 1
    seen = [_first(next(it)) for _ in range(2)]
    state = loader.state_dict()
    rest = [_first(b) for b in it] + [_first(b) for b in loader]  # epoch 1 rest, epoch 2
    fresh = _loader()
    fresh.load_state_dict(state)
    resumed = [_first(b) for b in fresh] + [_first(b) for b in fresh]
    assert resumed == rest and seen[0] not in resumed[:1]


def test_resume_after_a_complete_pass_starts_the_next_epoch():
    loader = _loader()
    list(loader)
    state = loader.state_dict()
    expected = [_first(b) for b in loader]
    fresh = _loader()
    fresh.load_state_dict(state)
    assert [_first(b) for b in fresh] == expected


def test_resume_infinite_sampler_across_epochs():
    loader = _loader(infinite=True)
    it = iter(loader)
    for _ in range(9):  # 6 batches per epoch: into the second epoch
        next(it)
    state = loader.state_dict()
    expected = [_first(next(it)) for _ in range(8)]
    fresh = _loader(infinite=True)
    fresh.load_state_dict(state)
    it2 = iter(fresh)
    assert [_first(next(it2)) for _ in range(8)] == expected
    assert fresh.state_dict()["batches"] == 17


def test_a_stream_loader_says_why_it_has_no_position_and_what_to_do():
    class Numbers(StreamDataset):
        def __iter__(self):
            yield from (np.array([float(i)]) for i in range(4))

    loader = DataLoader(Numbers())
    why = r"a StreamDataset has no position .* read in order, without indices.* Leave this loader"
    with pytest.raises(TypeError, match=r"DataLoader.state_dict: " + why):
        loader.state_dict()
    with pytest.raises(TypeError, match=r"DataLoader.load_state_dict: " + why):
        loader.load_state_dict({"sampler": {}, "batches": 0})
