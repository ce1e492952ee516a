"""Shape and indexing ops: forward against NumPy, backward against finite differences, errors.

Each row: name, ``fn(device, *tensors)``, NumPy reference ``ref(*arrays)``, input shapes. Index
arrays are fixed constants so that the reference and minigrad see the same ones.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad

_R = np.random.default_rng(1)
IDX_GATHER = _R.integers(0, 4, (3, 5))  # picks along axis 1 of a (3, 4) input, with repeats
IDX_SCATTER = np.stack(
    [_R.permutation(4)[:3] for _ in range(2)]
)  # unique per row: (2, 3) into (2, 4)
IDX_ONE_HOT = _R.integers(0, 5, (3,))
MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, True]])
ROWS = np.array([2, 0, 2, 1])  # repeated rows: gradients must accumulate


def _take(axis, idx):
    return lambda a: np.take_along_axis(a, idx, axis)


def _put(a, src):
    out = a.copy()
    np.put_along_axis(out, IDX_SCATTER, src, 1)
    return out


def _t(d, arr):
    return mg.tensor(arr, device=d)


SHAPE_OPS = [
    ("reshape", lambda d, x: F.reshape(x, (2, 6)), lambda a: a.reshape(2, 6), [(3, 4)]),
    ("reshape_-1", lambda d, x: x.reshape(2, -1, 2), lambda a: a.reshape(2, -1, 2), [(3, 4)]),
    ("reshape_scalar", lambda d, x: x.reshape(1, 1), lambda a: a.reshape(1, 1), [()]),
    ("flatten", lambda d, x: F.flatten(x), lambda a: a.reshape(-1), [(2, 3, 4)]),
    ("flatten_1", lambda d, x: x.flatten(1), lambda a: a.reshape(2, 12), [(2, 3, 4)]),
    ("flatten_1_2", lambda d, x: F.flatten(x, 1, 2), lambda a: a.reshape(2, 12, 1), [(2, 3, 4, 1)]),
    (
        "transpose",
        lambda d, x: F.transpose(x, (2, 0, 1)),
        lambda a: a.transpose(2, 0, 1),
        [(2, 3, 4)],
    ),
    ("transpose_none", lambda d, x: F.transpose(x), lambda a: a.transpose(), [(2, 3, 4)]),
    ("T", lambda d, x: x.T, lambda a: a.T, [(3, 4)]),
    ("swapaxes", lambda d, x: F.swapaxes(x, 0, -1), lambda a: np.swapaxes(a, 0, -1), [(2, 3, 4)]),
    ("expand_dims", lambda d, x: F.expand_dims(x, 0), lambda a: a[None], [(3, 4)]),
    ("expand_dims_neg", lambda d, x: F.expand_dims(x, -1), lambda a: a[..., None], [(3, 4)]),
    (
        "expand_dims_multi",
        lambda d, x: F.expand_dims(x, (0, 2)),
        lambda a: np.expand_dims(a, (0, 2)),
        [(3, 4)],
    ),
    ("squeeze", lambda d, x: F.squeeze(x), lambda a: np.squeeze(a), [(1, 3, 1, 2)]),
    ("squeeze_axis", lambda d, x: F.squeeze(x, 2), lambda a: np.squeeze(a, 2), [(1, 3, 1, 2)]),
    (
        "broadcast_to",
        lambda d, x: F.broadcast_to(x, (2, 3, 4)),
        lambda a: np.broadcast_to(a, (2, 3, 4)),
        [(3, 1)],
    ),
    (
        "broadcast_scalar",
        lambda d, x: F.broadcast_to(x, (2, 2)),
        lambda a: np.broadcast_to(a, (2, 2)),
        [()],
    ),
    (
        "sum_to",
        lambda d, x: F.sum_to(x, (3, 1)),
        lambda a: a.sum(0).sum(-1, keepdims=True),
        [(2, 3, 4)],
    ),
    (
        "concat",
        lambda d, *xs: F.concat(xs, axis=1),
        lambda *a: np.concatenate(a, 1),
        [(2, 3), (2, 1), (2, 4)],
    ),
    (
        "concat_neg",
        lambda d, *xs: F.concat(xs, axis=-1),
        lambda *a: np.concatenate(a, -1),
        [(2, 2, 3), (2, 2, 2)],
    ),
    ("stack", lambda d, *xs: F.stack(xs), lambda *a: np.stack(a), [(2, 3), (2, 3)]),
    ("stack_2", lambda d, *xs: F.stack(xs, axis=2), lambda *a: np.stack(a, 2), [(2, 3)] * 3),
    ("split_n", lambda d, x: F.split(x, 3, axis=1), lambda a: np.split(a, 3, 1), [(2, 6)]),
    ("split_at", lambda d, x: F.split(x, [1, 3]), lambda a: np.split(a, [1, 3]), [(5, 2)]),
    ("repeat", lambda d, x: F.repeat(x, 2, axis=1), lambda a: np.repeat(a, 2, 1), [(2, 3)]),
    ("repeat_flat", lambda d, x: F.repeat(x, 3), lambda a: np.repeat(a, 3), [(2, 2)]),
    ("tile", lambda d, x: F.tile(x, (2, 3)), lambda a: np.tile(a, (2, 3)), [(2, 3)]),
    ("tile_grow", lambda d, x: F.tile(x, (2, 1, 2)), lambda a: np.tile(a, (2, 1, 2)), [(3,)]),
    (
        "pad",
        lambda d, x: F.pad(x, ((1, 2), (0, 1))),
        lambda a: np.pad(a, ((1, 2), (0, 1))),
        [(2, 3)],
    ),
    (
        "pad_value",
        lambda d, x: F.pad(x, ((2, 0),), constant_value=1.5),
        lambda a: np.pad(a, ((2, 0),), constant_values=1.5),
        [(3,)],
    ),
    ("gather", lambda d, x: F.gather(x, 1, _t(d, IDX_GATHER)), _take(1, IDX_GATHER), [(3, 4)]),
    (
        "gather_0",
        lambda d, x: F.gather(x, 0, _t(d, IDX_GATHER.T[:2] % 3)),
        _take(0, IDX_GATHER.T[:2] % 3),
        [(3, 3)],
    ),
    ("scatter", lambda d, x, s: F.scatter(x, 1, _t(d, IDX_SCATTER), s), _put, [(2, 4), (2, 3)]),
    (
        "indexing_one_hot",
        lambda d, x: F.indexing_one_hot(x, _t(d, IDX_ONE_HOT)),
        lambda a: a[np.arange(3), IDX_ONE_HOT],
        [(3, 5)],
    ),
    (
        "indexing_one_hot_keep",
        lambda d, x: F.indexing_one_hot(x, _t(d, IDX_ONE_HOT), keepdims=True),
        lambda a: a[np.arange(3), IDX_ONE_HOT][:, None],
        [(3, 5)],
    ),
    ("cumsum", lambda d, x: F.cumsum(x, 1), lambda a: np.cumsum(a, 1), [(3, 4)]),
    ("cumsum_0", lambda d, x: F.cumsum(x, 0), lambda a: np.cumsum(a, 0), [(3, 4)]),
    ("sort", lambda d, x: F.sort(x)[0], lambda a: np.sort(a, -1), [(3, 5)]),
    ("sort_desc", lambda d, x: F.sort(x, descending=True)[0], lambda a: -np.sort(-a, -1), [(3, 5)]),
    ("topk", lambda d, x: F.topk(x, 2)[0], lambda a: np.sort(a, -1)[:, :2], [(3, 5)]),
    (
        "topk_desc",
        lambda d, x: F.topk(x, 3, descending=True)[0],
        lambda a: -np.sort(-a, -1)[:, :3],
        [(3, 5)],
    ),
    (
        "topk_kth",
        lambda d, x: F.topk(x, 2, kth_only=True)[0],
        lambda a: np.sort(a, -1)[:, 1],
        [(3, 5)],
    ),
    # indexing (x[...] goes through F.getitem)
    ("index_int", lambda d, x: x[1], lambda a: a[1], [(3, 4)]),
    ("index_neg_int", lambda d, x: x[-1, 2], lambda a: a[-1, 2], [(3, 4)]),
    ("index_slice", lambda d, x: x[1:, ::2], lambda a: a[1:, ::2], [(3, 4)]),
    ("index_neg_step", lambda d, x: x[::-1, 3:0:-2], lambda a: a[::-1, 3:0:-2], [(3, 4)]),
    ("index_none_ellipsis", lambda d, x: x[None, ..., 1], lambda a: a[None, ..., 1], [(2, 3, 4)]),
    ("index_int_array", lambda d, x: x[ROWS], lambda a: a[ROWS], [(3, 4)]),
    ("index_int_tensor", lambda d, x: x[_t(d, ROWS)], lambda a: a[ROWS], [(3, 4)]),
    ("index_list", lambda d, x: x[[0, 0, 2]], lambda a: a[[0, 0, 2]], [(3, 4)]),
    (
        "index_array_pair",
        lambda d, x: x[ROWS, [0, 1, 0, 3]],
        lambda a: a[ROWS, [0, 1, 0, 3]],
        [(3, 4)],
    ),
    ("index_slice_array", lambda d, x: x[:, [3, 1, 1]], lambda a: a[:, [3, 1, 1]], [(3, 4)]),
    ("index_bool", lambda d, x: x[MASK], lambda a: a[MASK], [(3, 4)]),
    ("index_bool_tensor", lambda d, x: x[_t(d, MASK)], lambda a: a[MASK], [(3, 4)]),
    ("index_bool_rows", lambda d, x: x[MASK[:, 0]], lambda a: a[MASK[:, 0]], [(3, 4)]),
]
IDS = [r[0] for r in SHAPE_OPS]


def _inputs(shapes, rng):
    return [rng.standard_normal(s) for s in shapes]


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("name,fn,ref,shapes", SHAPE_OPS, ids=IDS)
def test_forward(name, fn, ref, shapes, device, rng):
    xs = [a.astype(np.float32) for a in _inputs(shapes, rng)]
    outs = _as_list(fn(device, *[mg.tensor(a, device=device) for a in xs]))
    expects = _as_list(ref(*xs))
    assert len(outs) == len(expects)
    for out, expect in zip(outs, expects, strict=True):
        assert out.dtype == np.float32
        assert out.shape == np.shape(expect), f"{name}: shape {out.shape} != {np.shape(expect)}"
        np.testing.assert_allclose(out.numpy(), expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,fn,ref,shapes", SHAPE_OPS, ids=IDS)
def test_grad(name, fn, ref, shapes, device, rng):
    check_grad(lambda *xs: fn(device, *xs), *_inputs(shapes, rng), device=device)


@pytest.mark.parametrize("name,fn,ref,shapes", SHAPE_OPS, ids=IDS)
def test_noncontiguous(name, fn, ref, shapes, device, rng):
    """Feed every input as a transposed view (built in-graph, so the op sees strided data)."""
    xs = [rng.standard_normal(s[::-1]) for s in shapes]

    def f(*ts):
        return fn(device, *[t.T for t in ts])

    outs = _as_list(f(*[mg.tensor(a, device=device) for a in xs]))
    for out, expect in zip(outs, _as_list(ref(*[a.T for a in xs])), strict=True):
        np.testing.assert_allclose(out.numpy(), expect, rtol=1e-12)
    check_grad(f, *xs, device=device)


def test_repeated_integer_index_accumulates_grad(device):
    x = mg.tensor(np.zeros((3, 2), np.float32), device=device)
    gm = mg.GradManager().attach(x)
    with gm:
        gm.backward(x[ROWS].sum())
    np.testing.assert_array_equal(
        x.grad.numpy(), np.bincount(ROWS, minlength=3)[:, None] * np.ones(2)
    )


def test_sort_and_topk_indices(device, rng):
    x = rng.standard_normal((3, 6)).astype(np.float32)
    t = mg.tensor(x, device=device)
    vals, idx = F.sort(t, descending=True)
    np.testing.assert_array_equal(idx.numpy(), np.argsort(-x, -1, kind="stable"))
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(F.argsort(t).numpy(), np.argsort(x, -1, kind="stable"))
    _, top = F.topk(t, 2)
    np.testing.assert_array_equal(top.numpy(), np.argsort(x, -1, kind="stable")[:, :2])
    np.testing.assert_array_equal(np.take_along_axis(x, idx.numpy(), -1), vals.numpy())


def test_integer_tensors_keep_dtype(device):
    x = mg.tensor(np.arange(12, dtype=np.int32).reshape(3, 4), device=device)
    for out, expect in [
        (x.reshape(4, 3), np.arange(12).reshape(4, 3)),
        (x.T, np.arange(12).reshape(3, 4).T),
        (F.concat([x, x], 1), np.tile(np.arange(12).reshape(3, 4), (1, 2))),
        (F.cumsum(x, 1), np.cumsum(np.arange(12).reshape(3, 4), 1)),
        (x[MASK], np.arange(12).reshape(3, 4)[MASK]),
    ]:
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out.numpy(), expect)


SHAPE_ERRORS = [
    (
        lambda x: F.reshape(x, (5, 2)),
        ValueError,
        r"reshape: cannot reshape a tensor of shape \(3, 4\) into \(5, 2\)",
    ),
    (lambda x: x.reshape(-1, -1), ValueError, r"reshape: .*\(-1, -1\)"),
    (
        lambda x: F.broadcast_to(x, (4, 4)),
        ValueError,
        r"broadcast_to: cannot broadcast shape \(3, 4\) to \(4, 4\)",
    ),
    (lambda x: F.transpose(x, (0, 0)), ValueError, r"transpose: pattern \(0, 0\)"),
    (lambda x: F.squeeze(x, 0), ValueError, r"squeeze: axis 0 has size 3"),
    (lambda x: F.concat([x, x.T]), ValueError, r"concat: tensor 1 has shape \(4, 3\)"),
    (lambda x: F.stack([x, x.T]), ValueError, r"stack: all tensors must have the same shape"),
    (
        lambda x: F.split(x, 5, axis=1),
        ValueError,
        r"split: axis 1 of size 4 cannot be split into 5",
    ),
    (
        lambda x: F.gather(x, 1, mg.tensor(np.full((3, 4), 4), device=x.device)).numpy(),
        IndexError,
        r"gather: index out of range for axis 1 of size 4",
    ),
    (
        lambda x: F.gather(x, 1, mg.tensor(np.zeros((3, 4)), device=x.device)),
        TypeError,
        r"gather: index must be an integer tensor",
    ),
    (
        lambda x: F.scatter(
            x,
            1,
            mg.tensor(np.zeros((3, 2), np.int32), device=x.device),
            mg.tensor(np.zeros((3, 3)), device=x.device),
        ),
        ValueError,
        r"scatter: source shape \(3, 3\) must equal index shape \(3, 2\)",
    ),
    (lambda x: x[5], IndexError, r"getitem: index 5 is invalid for shape \(3, 4\)"),
    (lambda x: x[np.ones(3, bool)[:2]], IndexError, r"getitem: .* for shape \(3, 4\)"),
    (
        lambda x: F.pad(x, ((1, 1), (0, 0), (1, 1))),  # fewer entries pad the leading axes
        ValueError,
        r"pad: pad_width has 3 entries for a tensor of rank 2",
    ),
    (lambda x: F.topk(x, 5), ValueError, r"topk: k=5 out of range for last axis of size 4"),
    (lambda x: F.cumsum(x, 2), ValueError, r"cumsum: axis 2 is out of range"),
    (lambda x: F.expand_dims(x, 3), ValueError, r"expand_dims: axis 3 is out of range .* rank 3"),
    (lambda x: F.swapaxes(x, 0, 2), ValueError, r"swapaxes: axis 2 is out of range .* rank 2"),
    (
        lambda x: F.gather(x, 0, mg.tensor(np.zeros((2, 5), np.int32), device=x.device)),
        ValueError,
        r"gather: index shape \(2, 5\) exceeds input shape \(3, 4\) outside axis 0",
    ),
]


@pytest.mark.parametrize("fn,exc,msg", SHAPE_ERRORS, ids=[e[2][:28] for e in SHAPE_ERRORS])
def test_errors_name_the_op_and_shapes(fn, exc, msg, device):
    x = mg.tensor(np.ones((3, 4), np.float32), device=device)
    with pytest.raises(exc, match=msg):
        fn(x)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("concat", lambda a, b: F.concat([a, b])),
        ("stack", lambda a, b: F.stack([a, b])),
        ("gather", lambda a, b: F.gather(b, 0, mg.tensor(np.zeros((1, 2), "int32"),
                                                          device="cpu0"))),
        ("einsum", lambda a, b: F.einsum("ij,jk->ik", a, b)),
        ("where", lambda a, b: F.where(mg.tensor(np.ones((2, 2), bool)), a, b)),
    ],
)
def test_mixed_devices_name_the_op(name, fn, fake_gpu_tensor):
    a = mg.tensor(np.ones((2, 2), np.float32), device="cpu0")
    with pytest.raises(RuntimeError, match=rf"{name}: .*cpu0.*gpu0|{name}: .*gpu0.*cpu0"):
        fn(a, fake_gpu_tensor((2, 2)))


def test_broadcast_to_none_keeps_the_input_axis():
    """MegEngine: a None in the target shape keeps the input's size on that axis (aligned from the
    right); None where the input has no axis is an error naming the position."""
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    np.testing.assert_array_equal(F.broadcast_to(mg.tensor(x), (1, None, 3)).numpy(), x)
    y = F.broadcast_to(mg.tensor(x), (4, 1, None, 3))
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(x, (4, 1, 2, 3)))
    y = F.broadcast_to(mg.tensor(x), (mg.tensor(2), None, 2, 3))
    assert y.shape == (2, 1, 2, 3)
    with pytest.raises(ValueError, match="None at position 0"):
        F.broadcast_to(mg.tensor(x), (None, 1, 2, 3))


def test_functional_tensor_is_megengine_module_path():
    """``from megengine.functional.tensor import ones`` is MegEngine's path for the creation and
    shape ops."""
    from minigrad.functional.tensor import broadcast_to, ones, zeros

    assert ones is F.ones and zeros is F.zeros and broadcast_to is F.broadcast_to


def test_concat_and_stack_with_device_gather_inputs_from_several_devices():
    """MegEngine: ``device=`` copies every input there, so inputs may live on different devices
    (the gradient flows back to each); without it they must share one."""
    a = mg.tensor(np.ones((2, 2), np.float32), device="cpu0")
    b = mg.tensor(np.full((2, 2), 2.0, np.float32), device="cpu1")
    for fn, shape in [(F.concat, (4, 2)), (F.stack, (2, 2, 2))]:
        out = fn([a, b], device="cpu1")
        assert str(out.device) == "cpu1" and out.shape == shape
        np.testing.assert_array_equal(out.numpy().reshape(4, 2)[2:], 2.0)
        with pytest.raises(RuntimeError, match="different devices"):
            fn([a, b])
    gm = mg.autodiff.GradManager().attach([a, b])
    with gm:
        gm.backward((F.concat([a, b], device="cpu1") * 3).sum())
    np.testing.assert_array_equal(a.grad.numpy(), 3.0)
    assert str(a.grad.device) == "cpu0"
