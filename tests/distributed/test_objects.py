"""The safe object encoding behind broadcast_object_list / all_gather_object: exact round trips,
clear refusals, and no way to make a receiver unpickle anything."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed.runtime.objects import decode, encode
from minigrad.testing.distributed import run_workers

SAMPLE = {
    "none": None,
    "flags": [True, False],
    "ints": (0, -7, 2**80, -(2**70)),
    "floats": [0.1, -0.0, float("inf"), -float("inf"), 1e-310],
    "text": "naïve ✓",
    "raw": b"\x00\xff\x80",
    "nested": {"a": [(), [], {}], "b": ({"c": (1, "2")},)},
    "arrays": [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array(3.5, np.float64),
        np.zeros((0, 4), np.int16),
        np.array([1, 2], dtype=">i4"),
        np.array(["ab", "c"]),
        np.array([b"x", b"yz"]),
        np.array(["2024-01-02"], dtype="datetime64[D]"),
        np.array([True, False]),
        np.array([1 + 2j], np.complex64),
        np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2],  # not contiguous
    ],
    "scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), np.uint8(200), np.str_("s")],
}


def identity(obj):
    """Everything that must survive a round trip: exact types, dtypes (with byte order), shapes,
    bytes, float bit patterns, key order."""
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, np.generic):
        return (type(obj).__name__, obj.dtype.str, obj.tobytes())
    if isinstance(obj, dict):
        return ("dict", tuple((k, identity(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(identity(v) for v in obj))
    if isinstance(obj, float):
        return ("float", obj.hex())
    return (type(obj).__name__, obj)


def assert_identical(a, b) -> None:
    assert identity(a) == identity(b)


def test_round_trip_keeps_types_and_dtypes_exactly():
    assert_identical(decode(encode(SAMPLE)), SAMPLE)
    assert np.isnan(decode(encode(float("nan"))))


class Custom:
    pass


@pytest.mark.parametrize(
    "obj, name",
    [
        ({1, 2}, "builtins.set"),
        (Custom(), "Custom"),
        ([1, {"k": object()}], "builtins.object at the top level[1]['k']"),
        (np.array([object()], dtype=object), "numpy.ndarray"),
        (np.zeros(2, dtype=[("a", "i4")]), "numpy.ndarray"),
        (bytearray(b"x"), "builtins.bytearray"),
    ],
)
def test_other_types_are_refused_clearly(obj, name):
    with pytest.raises(TypeError, match="never pickles") as info:
        encode(obj)
    assert name in str(info.value)


def test_non_string_keys_are_refused():
    with pytest.raises(TypeError, match="dict key of type int"):
        encode({1: "a"})


class Boom:
    ran = False

    def __reduce__(self):
        return (setattr, (Boom, "ran", True))


def test_pickles_and_garbage_are_never_unpickled():
    for data in (pickle.dumps(Boom()), pickle.dumps([1, 2]), b"", b"MGOBJ1\x00"):
        with pytest.raises(ValueError):
            decode(data)
    assert Boom.ran is False
    good = encode([1, np.ones(2)])
    for bad in (good[:-1], good + b"x", good.replace(b'"int"', b'"eval"')):
        with pytest.raises(ValueError):
            decode(bad)


def _object_collectives():
    r = dist.get_rank()
    objs = [SAMPLE, r] if r == 0 else [None, None]
    dist.broadcast_object_list(objs)
    assert_identical(objs, [SAMPLE, 0])  # here: pickling results back to pytest loses '>i4'
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": r, "w": np.full(r + 1, r, np.float16)})
    errors = []
    try:  # refused on the sender; the receivers raise too instead of waiting
        dist.broadcast_object_list([Custom()] if r == 0 else [None])
    except TypeError as exc:
        errors.append(str(exc))
    try:
        dist.all_gather_object([None, None], {1, 2} if r == 1 else "fine")
    except TypeError as exc:
        errors.append(str(exc))
    box = ["resync"] if r == 0 else [None]
    dist.broadcast_object_list(box)  # the group still works
    errors.append(box[0])
    return objs, gathered, errors


def test_broadcast_object_list_and_all_gather_object():
    res = run_workers(_object_collectives, 2, timeout=60)
    for objs, gathered, _ in res:
        assert objs[1] == 0 and objs[0]["ints"] == SAMPLE["ints"]
        for j, got in enumerate(gathered):
            assert_identical(got, {"rank": j, "w": np.full(j + 1, j, np.float16)})
    for _, _, errors in res:
        assert "Custom" in errors[0] and "never pickles" in errors[0]
        assert "builtins.set" in errors[1] and errors[2] == "resync"
    assert "rank 0 could not send its objects" in res[1][2][0]
    assert "rank 1 could not send its objects" in res[0][2][1]
