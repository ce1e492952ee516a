"""Collator structure handling and the dataset helpers."""

from collections import namedtuple

import numpy as np
import pytest

from minigrad.data.collator import Collator
from minigrad.data.dataset import ArrayDataset, ConcatDataset, Dataset, StreamDataset

Pair = namedtuple("Pair", ["x", "y"])


def test_collate_arrays_scalars_tuples():
    rng = np.random.default_rng(0)
    imgs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
    out = Collator().apply([(im, i, float(i) / 2, np.int32(i)) for i, im in enumerate(imgs)])
    assert isinstance(out, tuple) and len(out) == 4
    np.testing.assert_array_equal(out[0], np.array(imgs))
    assert out[0].dtype == np.float32 and out[0].shape == (4, 2, 3)
    np.testing.assert_array_equal(out[1], [0, 1, 2, 3])
    assert out[1].dtype.kind == "i" and out[2].dtype == np.float64
    assert out[3].dtype == np.int32


def test_collate_dicts_namedtuples_lists_strings():
    batch = [{"img": np.full((2,), i), "meta": Pair(i, [i, "s"])} for i in range(3)]
    out = Collator()(batch)
    np.testing.assert_array_equal(out["img"], [[0, 0], [1, 1], [2, 2]])
    assert isinstance(out["meta"], Pair)
    np.testing.assert_array_equal(out["meta"].x, [0, 1, 2])
    assert isinstance(out["meta"].y, list)
    np.testing.assert_array_equal(out["meta"].y[0], [0, 1, 2])
    assert out["meta"].y[1] == ["s", "s", "s"]


def test_collate_errors_name_the_field():
    with pytest.raises(ValueError, match=r"batch\[0\].*same shape.*\(2,\).*\(3,\)"):
        Collator().apply([(np.zeros(2), 1), (np.zeros(3), 2)])
    with pytest.raises(ValueError, match="different keys"):
        Collator().apply([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="length 2"):
        Collator().apply([(1, 2), (1, 2, 3)])
    with pytest.raises(ValueError, match="empty batch"):
        Collator().apply([])
    with pytest.raises(TypeError, match="type object"):
        Collator().apply([object(), object()])


def test_array_dataset():
    a, b = np.arange(10).reshape(5, 2), np.arange(5) * 10
    ds = ArrayDataset(a, b)
    assert len(ds) == 5
    x, y = ds[-1]
    np.testing.assert_array_equal(x, [8, 9])
    assert y == 40
    with pytest.raises(IndexError, match="index 5 out of range for length 5"):
        ds[5]
    with pytest.raises(ValueError, match=r"same length, got \[5, 4\]"):
        ArrayDataset(a, b[:4])


def test_concat_dataset():
    d1, d2 = ArrayDataset(np.arange(3)), ArrayDataset(np.arange(10, 15))
    cat = d1 + d2
    assert isinstance(cat, ConcatDataset) and len(cat) == 8
    assert [int(cat[i][0]) for i in range(8)] == [0, 1, 2, 10, 11, 12, 13, 14]
    assert int(cat[-1][0]) == 14
    with pytest.raises(IndexError):
        cat[8]

    class Stream(StreamDataset):
        def __iter__(self):
            yield 1

    with pytest.raises(TypeError, match="not map-style"):
        ConcatDataset([d1, Stream()])
    with pytest.raises(TypeError, match="can only be iterated"):
        Stream()[0]


def test_dataset_is_abstract():
    with pytest.raises(TypeError):
        Dataset()
