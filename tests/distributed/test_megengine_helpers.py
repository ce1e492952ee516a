"""MegEngine's distributed helpers that its programs call: ``dist.helper.param_pack_split`` /
``param_pack_concat`` / ``get_device_count_by_fork``, ``dist.group_start`` / ``group_end`` and
``Group.key`` (issue 27)."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.autodiff import GradManager
from minigrad.testing.distributed import run_workers


def test_param_pack_split_and_concat_as_documented():
    a = mg.tensor(np.arange(10, dtype=np.float32))
    b, c = dist.helper.param_pack_split(a, [0, 1, 1, 10], [(1,), (3, 3)])
    np.testing.assert_array_equal(b.numpy(), [0.0])
    np.testing.assert_array_equal(c.numpy(), np.arange(1, 10, dtype=np.float32).reshape(3, 3))
    offsets = dist.helper.get_offsets([(1,), (3, 3)])
    assert offsets == [0, 1, 1, 10]
    packed = dist.helper.param_pack_concat([b, c], mg.tensor(offsets, dtype="int32"), offsets)
    np.testing.assert_array_equal(packed.numpy(), a.numpy())
    # gaps between the pieces are zeros (aligned packs)
    gapped = dist.helper.param_pack_concat([b, c], [0, 1, 3, 12])
    np.testing.assert_array_equal(gapped.numpy(), np.r_[0.0, 0.0, 0.0, np.arange(1, 10)])
    with pytest.raises(ValueError, match=r"\[1, 9\) holds 8 values, shape \(3, 3\) needs 9"):
        dist.helper.param_pack_split(a, [0, 1, 1, 9], [(1,), (3, 3)])
    with pytest.raises(ValueError, match="offsets must hold 2 \\* 2 values"):
        dist.helper.param_pack_concat([b, c], [0, 1, 1])


def test_param_pack_is_differentiable():
    w = mg.Parameter(np.arange(5, dtype=np.float32))
    gm = GradManager().attach([w])
    with gm:
        x, y = dist.helper.param_pack_split(w, [0, 2, 2, 5], [(2,), (3,)])
        packed = dist.helper.param_pack_concat([y * 2, x * 3], [0, 3, 4, 6])
        gm.backward(F.sum(packed * mg.tensor(np.arange(1, 7, dtype=np.float32))))
    # packed = [2*w2, 2*w3, 2*w4, 0, 3*w0, 3*w1] weighted by 1..6
    np.testing.assert_allclose(w.grad.numpy(), [15.0, 18.0, 2.0, 4.0, 6.0])


def test_get_device_count_by_fork_counts_like_get_device_count():
    assert dist.helper.get_device_count_by_fork("cpu") == 1
    assert dist.helper.get_device_count_by_fork("gpu") == mg.get_device_count("gpu")


def _exchange():
    rank = dist.get_rank()
    peer = 1 - rank
    group = dist.new_group([0, 1])
    dist.group_start()
    F.distributed.remote_send(mg.tensor(np.full(3, rank + 1.0, np.float32)), peer)
    got = F.distributed.remote_recv(peer, (3,), "float32")
    dist.group_end()
    try:
        dist.group_end()
    except RuntimeError as exc:
        unbalanced = str(exc)
    else:
        unbalanced = None
    return got.numpy(), group.key, dist.WORLD.key, unbalanced


def test_group_start_end_exchange_and_group_key():
    out = run_workers(_exchange, 2)
    for rank, (got, key, world_key, unbalanced) in enumerate(out):
        np.testing.assert_array_equal(got, np.full(3, 2.0 - rank))  # the peer's value
        assert key == "0,1" and world_key == "0,1"
        assert "no group_start() is open" in unbalanced
