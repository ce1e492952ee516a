"""The flat-buffer utility every packed collective uses: layout, views, padding, shards, reuse."""

import numpy as np
import pytest

from minigrad.distributed.comm.flat_buffer import (
    BufferPool,
    FlatBuffer,
    ScratchPool,
    group_by_layout,
)


def _arrays():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s) for s in [(2, 3), (5,), (), (1, 4)]]


def test_pack_views_and_unpack_round_trip():
    arrays = _arrays()
    flat = FlatBuffer.of(arrays)
    assert flat.data.size == 6 + 5 + 1 + 4
    np.testing.assert_array_equal(flat.data, np.concatenate([a.reshape(-1) for a in arrays]))
    for a, v in zip(arrays, flat.views()):
        assert v.shape == a.shape
        np.testing.assert_array_equal(v, a)
    flat.data *= 2  # views see writes to the buffer
    np.testing.assert_array_equal(flat.view(1), arrays[1] * 2)
    out = [np.zeros_like(a) for a in arrays]
    flat.unpack_into(out)
    for a, o in zip(arrays, out):
        np.testing.assert_array_equal(o, a * 2)


def test_padding_is_zero_and_shards_cover_the_arrays():
    arrays = _arrays()  # 16 elements
    flat = FlatBuffer.of(arrays, pad_to=3)
    assert flat.data.size == 18 and flat.size == 16
    np.testing.assert_array_equal(flat.data[16:], 0)
    assert [flat.shard(i, 3).size for i in range(3)] == [6, 6, 6]
    # segments: which elements of which array each shard holds, padding left out
    covered = {j: [] for j in range(len(arrays))}
    for i in range(3):
        shard = flat.shard(i, 3)
        pos = 0
        for j, a, b in flat.segments(i, 3):
            np.testing.assert_array_equal(shard[pos : pos + b - a], arrays[j].reshape(-1)[a:b])
            covered[j].extend(range(a, b))
            pos += b - a
    for j, a in enumerate(arrays):
        assert covered[j] == list(range(a.size))
    with pytest.raises(ValueError, match="equal shards"):
        flat.shard(0, 4)


def test_group_by_layout_keeps_first_seen_order():
    a, b, c = np.ones(2, np.float32), np.ones(3, np.float64), np.ones(1, np.float32)
    groups = group_by_layout([a, b, c])
    assert list(groups) == [("float32", "cpu"), ("float64", "cpu")]
    assert groups[("float32", "cpu")][1] is c


def test_pool_reuses_a_buffer_only_when_no_view_is_alive():
    arrays = _arrays()
    pool = BufferPool()
    first = pool.get("k", arrays)
    data = first.data
    del data
    assert pool.get("k", arrays) is first  # nothing views it: reused, refilled
    views = first.views()
    second = pool.get("k", arrays)
    assert second is not first  # a view is alive: a fresh buffer
    np.testing.assert_array_equal(views[0], arrays[0])
    assert pool.get("k", arrays[:2]) is not second  # another layout: a fresh buffer
    with pytest.raises(ValueError, match="laid out for 4 arrays, got 2"):
        FlatBuffer.of(arrays).pack(arrays[:2])


def test_pool_allocates_host_buffers_with_the_given_function():
    # the data-parallel callback passes comm.shared_empty: buffers the all-reduce reads in place
    calls = []

    def host_empty(count, dtype):
        calls.append((count, np.dtype(dtype).name))
        return np.frombuffer(bytearray(count * np.dtype(dtype).itemsize), dtype)

    arrays = _arrays()
    pool = BufferPool(host_empty=host_empty)
    first = pool.get("k", arrays)
    assert calls == [(sum(a.size for a in arrays), "float64")]
    assert isinstance(first.data.base, memoryview)  # the function's array, not np.empty's
    for view, a in zip(first.views(), arrays):
        np.testing.assert_array_equal(view, a)
    del view
    assert pool.get("k", arrays) is first and len(calls) == 1  # free again: reused
    views = first.views()
    assert pool.get("k", arrays) is not first and len(calls) == 2  # a view of it is alive
    del views


def test_scratch_is_reused_when_free_kept_per_user_and_grown_when_small():
    made = []
    pool = ScratchPool(lambda count, dtype, owner: made.append((count, owner)) or
                       np.empty(count, dtype))
    a = pool.get("g", 10, "float32")
    first = id(a.base)  # the kept buffer (an id: a reference would keep it busy)
    del a
    b = pool.get("g", 6, "float32")
    assert id(b.base) == first and b.shape == (6,)  # free again: a prefix of the same buffer
    c = pool.get("g", 6, "float32")
    second = id(c.base)
    assert second != first  # b still views the first one: a second buffer
    del b, c
    for _ in range(3):  # two users at a time, as a transfer in flight and the next one packed
        x, y = pool.get("g", 8, "float32"), pool.get("g", 4, "float32")
        assert {id(x.base), id(y.base)} == {first, second}
        del x, y
    assert made == [(10, "g"), (6, "g")]
    big = pool.get("g", 20, "float32")  # both free and too small: the larger one is replaced
    assert big.size == 20 and made[-1] == (20, "g")
    assert pool.get("g", 6, "float32").base is not big.base  # the 6-element one is still kept
    assert len(made) == 3
    assert pool.get("h", 3, "float64").dtype == np.float64 and made[-1] == (3, "h")
