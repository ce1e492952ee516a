"""DataLoader.state_dict / load_state_dict: a resumed loader reads the next batch, not the
first."""

import numpy as np

from minigrad.data import DataLoader
from minigrad.data.dataset import ArrayDataset
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
