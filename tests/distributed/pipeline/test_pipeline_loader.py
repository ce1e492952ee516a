"""RepeatingLoader: an endless iterator over a finite loader."""

import numpy as np
import pytest

from minigrad.data import DataLoader, RandomSampler
from minigrad.data.dataset import ArrayDataset
from minigrad.distributed.pipeline import RepeatingLoader


def test_two_and_a_half_epochs_never_raise_and_repeat_in_order():
    data = ArrayDataset(np.arange(8, dtype="float32").reshape(4, 2), np.arange(4))
    loader = DataLoader(data)                      # 4 batches of one item
    data_iter = iter(RepeatingLoader(loader))
    items = [int(next(data_iter)[1][0]) for _ in range(10)]
    assert items == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_every_epoch_restarts_the_loader_so_a_random_sampler_reshuffles():
    data = ArrayDataset(np.arange(16))
    loader = DataLoader(data, sampler=RandomSampler(data, batch_size=16, seed=3))
    data_iter = iter(RepeatingLoader(loader))
    first, second = (next(data_iter)[0] for _ in range(2))
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(16))
    assert first.tolist() != second.tolist()


def test_an_empty_loader_is_an_error():
    with pytest.raises(ValueError, match="yields no items"):
        next(RepeatingLoader([]))
