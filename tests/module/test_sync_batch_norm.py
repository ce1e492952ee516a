"""SyncBatchNorm in the module package: the StatsReducer seam the distributed runtime fills.

A one-process world must give plain BatchNorm; a reducer that stands for two ranks holding the same
batch must give the statistics of the doubled batch (checked against NumPy), which is what the
all-reduce of ``minigrad.distributed`` provides for real in tests/distributed.
"""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.module as M
from minigrad.module.normalization import StatsReducer, get_stats_reducer, set_stats_reducer


class TwoIdenticalRanks(StatsReducer):
    """Every rank holds the same batch: a sum over the group is twice the local value."""

    def world_size(self, group) -> int:
        return 2

    def sum(self, tensor, group):
        return tensor * 2.0


@pytest.fixture
def two_ranks():
    previous = set_stats_reducer(TwoIdenticalRanks())
    yield
    set_stats_reducer(previous)


def _batch():
    return np.random.default_rng(0).standard_normal((4, 3, 2, 2))


def test_one_process_world_is_plain_batch_norm():
    x = mg.tensor(_batch(), dtype="float64")
    sync, plain = M.SyncBatchNorm(3), M.BatchNorm2d(3)
    assert get_stats_reducer().world_size(None) == 1  # no process group in the test process
    np.testing.assert_array_equal(sync(x).numpy(), plain(x).numpy())
    np.testing.assert_array_equal(sync.running_var.numpy(), plain.running_var.numpy())
    assert M.SyncBatchNorm is M.normalization.SyncBatchNorm


def test_statistics_cover_every_rank_of_the_group(two_ranks):
    xb = _batch()
    bn = M.SyncBatchNorm(3, momentum=0.8)
    x = mg.tensor(xb, dtype="float64")
    gm = ad.GradManager().attach([x])
    with gm:
        y = bn(x)
        gm.backward((y * y).sum())
    mean = xb.mean(axis=(0, 2, 3), keepdims=True)
    var = xb.var(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y.numpy(), (xb - mean) / np.sqrt(var + 1e-5), rtol=1e-10)
    count = 2 * 4 * 2 * 2  # values per channel over both ranks
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.2 * mean, rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(),
                               0.8 + 0.2 * var * count / (count - 1), rtol=1e-6)
    assert x.grad is not None and x.grad.shape == xb.shape
    bn.eval()  # outside training the running statistics normalise, no reducer involved
    np.testing.assert_allclose(
        bn(x).numpy(),
        (xb - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5) * 1.0,
        rtol=1e-5)


def test_bad_input_and_bad_reducer(two_ranks):
    with pytest.raises(ValueError, match=r"SyncBatchNorm\(3\): expected input of shape \(N, C\), "
                                         r"\(N, C, L\) or \(N, C, H, W\) with C=3, got \(2, 4\)"):
        M.SyncBatchNorm(3)(mg.tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(TypeError, match="set_stats_reducer: expected a StatsReducer, got function"):
        set_stats_reducer(lambda t, g: t)
    assert "group" not in repr(M.SyncBatchNorm(3))
