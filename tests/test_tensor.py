"""The Tensor API: construction and dtype defaults, operators and promotion, indexing (with
gradients), ``__setitem__``, NumPy interop, devices, conversions and repr."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import minigrad as mg
from minigrad.testing import check_grad

# -- construction ---------------------------------------------------------------------------------

DEFAULT_DTYPES = [
    (1.5, np.float32),
    (3, np.int32),
    (True, np.bool_),
    ([1.0, 2], np.float32),
    ([[1, 2], [3, 4]], np.int32),
    ([True, False], np.bool_),
    (np.array([1.0, 2.0]), np.float64),  # arrays keep their dtype
    (np.array([1, 2], np.int64), np.int64),
    (np.array([1, 2], np.uint8), np.uint8),
    (np.array([1.0], np.float16), np.float16),
    (np.float64(2.0), np.float64),
]


@pytest.mark.parametrize("data,dtype", DEFAULT_DTYPES, ids=lambda v: type(v).__name__)
def test_default_dtypes(data, dtype, device):
    t = mg.tensor(data, device=device)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), np.asarray(data))
    assert t.shape == np.shape(data) and t.ndim == np.ndim(data) and t.size == np.size(data)


@pytest.mark.parametrize(
    "dtype",
    [
        "float16",
        "float32",
        "float64",
        "int32",
        "int64",
        "uint8",
        "bool",
        np.float32,
        mg.float64,
        "float",
        "int",
        "half",
        "double",
    ],
)
def test_dtype_argument(dtype, device):
    t = mg.tensor([0, 1, 2], dtype=dtype, device=device)
    aliases = {"float": "float32", "int": "int32", "half": "float16", "double": "float64"}
    expect = np.dtype(aliases.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    assert t.dtype == expect
    np.testing.assert_array_equal(t.numpy(), np.array([0, 1, 2]).astype(expect))


def test_construction_copies_its_input(device):
    a = np.zeros(3, np.float32)
    t = mg.tensor(a, device=device)
    a[0] = 5
    assert t.numpy()[0] == 0
    u = mg.tensor(t)
    t[1] = 7  # outside recording: fine
    assert u.numpy()[1] == 0 and t.numpy()[1] == 7
    out = t.numpy()
    out[2] = 9  # numpy() hands out a copy
    assert t.numpy()[2] == 0


def test_empty_and_from_tensor_with_dtype(device):
    assert mg.Tensor().shape == (0,)
    assert mg.tensor([], device=device).dtype == np.float32
    t = mg.tensor(mg.tensor([1.5, 2.5], device=device), dtype="float16")
    assert t.dtype == np.float16 and t.device == device


def test_parameter_is_float():
    p = mg.Parameter([1.0, 2.0])
    assert isinstance(p, mg.Tensor) and p.dtype == np.float32
    assert repr(p).startswith("Parameter(")
    # MegEngine: integer data becomes a float32 parameter; an explicit integer dtype is refused
    for data in (3, [1, 2], np.array([[1, 2]], np.int64), True):
        q = mg.Parameter(data)
        assert q.dtype == np.float32
        np.testing.assert_array_equal(q.numpy(), np.asarray(data, np.float32))
    with pytest.raises(TypeError, match="Parameter: parameters must be float, got dtype int32"):
        mg.Parameter([1, 2], dtype="int32")


# -- operators ------------------------------------------------------------------------------------

OPERATORS = [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("pow", operator.pow),
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
    ("eq", operator.eq),
    ("ne", operator.ne),
]


@pytest.mark.parametrize("name,op", OPERATORS, ids=[o[0] for o in OPERATORS])
def test_binary_operators_all_operand_kinds(name, op, device, rng):
    a = rng.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (3,)).astype(np.float32)
    ta, tb = mg.tensor(a, device=device), mg.tensor(b, device=device)
    for got, want in [
        (op(ta, tb), op(a, b)),  # tensor (+) tensor
        (op(ta, 1.5), op(a, np.float32(1.5))),  # tensor (+) python scalar
        (op(1.5, tb), op(np.float32(1.5), b)),  # python scalar (+) tensor
        (op(ta, b), op(a, b)),  # tensor (+) ndarray
        (op(a, tb), op(a, b)),  # ndarray (+) tensor: Tensor wins (__array_priority__)
    ]:
        assert isinstance(got, mg.Tensor)
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_unary_and_integer_operators(device):
    i = mg.tensor([7, -7, 3], device=device)
    x = np.array([7, -7, 3], np.int32)
    np.testing.assert_array_equal((-i).numpy(), -x)
    np.testing.assert_array_equal(abs(i).numpy(), np.abs(x))
    np.testing.assert_array_equal((+i).numpy(), x)
    np.testing.assert_array_equal((i // 2).numpy(), x // 2)
    np.testing.assert_array_equal((i % 3).numpy(), x % 3)
    np.testing.assert_array_equal((20 // i).numpy(), 20 // x)
    b = mg.tensor([True, False, True], device=device)
    c = mg.tensor([True, True, False], device=device)
    np.testing.assert_array_equal((b & c).numpy(), [True, False, False])
    np.testing.assert_array_equal((b | c).numpy(), [True, True, True])
    np.testing.assert_array_equal((b ^ c).numpy(), [False, True, True])
    np.testing.assert_array_equal((~b).numpy(), [False, True, False])


def test_matmul_operators(device, rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    ta, tb = mg.tensor(a, device=device), mg.tensor(b, device=device)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-12)
    np.testing.assert_allclose((a @ tb).numpy(), a @ b, rtol=1e-12)
    np.testing.assert_allclose((ta @ b).numpy(), a @ b, rtol=1e-12)


PROMOTION = [  # (tensor dtype, other operand, result dtype)
    ("int32", 2, "int32"),
    ("int32", 2.5, "float32"),  # int tensor with a float scalar -> float32 (not float64)
    ("int64", 2.5, "float32"),
    ("uint8", 3, "uint8"),
    ("uint8", 0.5, "float32"),
    ("float16", 2.5, "float16"),  # a Python float does not widen the tensor
    ("float16", 3, "float16"),
    ("float64", 2, "float64"),
    ("bool", True, "bool"),
    ("float32", np.float64(2.0), "float32"),  # NumPy scalars count as Python scalars
    ("int32", np.array([1.5]), "float64"),  # an array is a tensor operand: NumPy promotion
    ("float16", ("float32", [1.0]), "float32"),
    ("int32", ("float16", [1.0]), "float64"),  # NumPy: float16 cannot hold every int32
    ("int32", ("int64", [1]), "int64"),
    ("uint8", ("int32", [1]), "int32"),
    ("bool", ("float32", [1.0]), "float32"),
]


@pytest.mark.parametrize("dtype,other,expect", PROMOTION, ids=str)
def test_promotion_rules(dtype, other, expect, device):
    t = mg.tensor(np.array([1, 2, 3]).astype(dtype), device=device)
    if isinstance(other, tuple):
        other = mg.tensor(np.array(other[1], dtype=other[0]), device=device)
    assert (t + other).dtype == np.dtype(expect)
    assert (other + t).dtype == np.dtype(expect)
    assert (t * other).dtype == np.dtype(expect)


# -- indexing with gradients ----------------------------------------------------------------------

INDICES = [
    ("int", 1),
    ("slice", (slice(None), slice(1, None, 2))),
    ("neg_step", (slice(None, None, -1),)),
    ("ellipsis_none", (Ellipsis, None, 0)),
    ("int_array_repeats", np.array([2, 0, 2])),
    ("two_int_arrays", (np.array([0, 2, 2]), np.array([1, 3, 1]))),
    ("list", [1, 1]),
    (
        "bool_mask",
        np.array(
            [[True, False, True, False], [False, False, False, True], [True, True, True, True]]
        ),
    ),
    ("bool_rows", np.array([True, False, True])),
    ("bool_and_slice", (np.array([True, False, True]), slice(0, 2))),
]


@pytest.mark.parametrize("as_tensor", [False, True], ids=["array", "tensor"])
@pytest.mark.parametrize("name,index", INDICES, ids=[i[0] for i in INDICES])
def test_getitem_forward_and_grad(name, index, as_tensor, device, rng):
    x = rng.standard_normal((3, 4))

    def wrap(i):
        return mg.tensor(i, device=device) if as_tensor and isinstance(i, np.ndarray) else i

    idx = tuple(wrap(i) for i in index) if isinstance(index, tuple) else wrap(index)
    out = mg.tensor(x, device=device)[idx]
    np.testing.assert_array_equal(out.numpy(), x[index])
    check_grad(lambda t: t[idx], x, device=device)
    # the gradient is exactly the count of times each element was picked
    t = mg.tensor(x, device=device)
    gm = mg.GradManager().attach(t)
    with gm:
        gm.backward(t[idx].sum())
    counts = np.zeros_like(x)
    np.add.at(counts, index, 1.0)
    np.testing.assert_array_equal(t.grad.numpy(), counts)


def test_index_with_scalar_int_tensor(device):
    x = mg.tensor([10.0, 20.0, 30.0], device=device)
    assert x[mg.tensor(2, device=device)].item() == 30.0
    assert [1, 2, 3][mg.tensor(1)] == 2  # __index__
    with pytest.raises(
        TypeError, match="only integer tensors can be used as an index, got float32"
    ):
        [1, 2, 3][mg.tensor(1.0)]


# -- __setitem__ ----------------------------------------------------------------------------------


def test_setitem_matches_numpy(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = mg.tensor(x, device=device)
    ref = x.copy()
    for index, value in [
        (0, 5.0),
        ((slice(None), 1), np.array([7.0, 8.0, 9.0], np.float32)),
        ((slice(None), 2), mg.tensor([1.0, 2.0, 3.0], device=device)),
        (np.array([True, False, True]), -1.0),
        (mg.tensor(x > 0.5, device=device), 0.25),
        (([0, 2], [3, 3]), 4.0),
    ]:
        t[index] = value
        ref[index.numpy() if isinstance(index, mg.Tensor) else index] = (
            value.numpy() if isinstance(value, mg.Tensor) else value
        )
        np.testing.assert_array_equal(t.numpy(), ref)


def test_setitem_refused_while_recording():
    p = mg.Parameter(np.zeros(3, np.float32))
    gm = mg.GradManager().attach(p)
    with gm:
        with pytest.raises(
            RuntimeError, match="Tensor.__setitem__: cannot modify a tensor in place"
        ):
            p[0] = 1.0
    p[0] = 1.0  # fine once recording stopped
    assert p.numpy()[0] == 1.0


# -- conversions and interop ----------------------------------------------------------------------


def test_numpy_interop(device):
    t = mg.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    out = t.numpy()
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    if t.device == "cpu0":
        np.testing.assert_array_equal(np.asarray(t), out)
        np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), out.astype(np.float64))


def test_scalar_conversions(device):
    assert mg.tensor(2.5, device=device).item() == 2.5
    assert mg.tensor([[4]], device=device).item() == 4
    assert float(mg.tensor([1.5], device=device)) == 1.5
    assert int(mg.tensor([3], device=device)) == 3
    assert bool(mg.tensor([0.0], device=device)) is False
    with pytest.raises(ValueError, match=r"Tensor.item: only one-element tensors .* shape \(2,\)"):
        mg.tensor([1.0, 2.0], device=device).item()
    with pytest.raises(ValueError, match="truth value of a tensor with 2 elements is ambiguous"):
        bool(mg.tensor([1.0, 2.0], device=device))


def test_len_iter(device):
    t = mg.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=device)
    assert len(t) == 3
    rows = list(t)
    assert len(rows) == 3 and rows[2].tolist() == [5.0, 6.0]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(mg.tensor(1.0, device=device))


def test_repr(device):
    r = repr(mg.tensor([1.0, 2.5], device=device))
    assert r == f"Tensor([1. , 2.5], dtype=float32, device={mg.backend.as_device(device)})"
    assert "dtype=int32" in repr(mg.tensor([[1, 2]], device=device))


def test_to_device_copies_and_is_differentiable(device, rng):
    x = rng.standard_normal((2, 3))
    t = mg.tensor(x, device="cpu0")
    moved = t.to(device)
    assert moved.device == device and moved is not t
    np.testing.assert_array_equal(moved.numpy(), x)
    assert t.cpu().device == "cpu0"
    check_grad(lambda v: (v.to(device) * 2.0).to("cpu0"), x)


def test_detach_shares_memory_and_cuts_the_graph(device):
    x = mg.Parameter([1.0, 2.0], device=device)
    gm = mg.GradManager().attach(x)
    with gm:
        y = x * 3.0
        d = y.detach()
        assert not d.requires_grad and y.requires_grad
        gm.backward((y + d * 100.0).sum())
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_set_value_keeps_dtype_and_checks_shape(device):
    t = mg.tensor([1.0, 2.0], device=device)
    t.set_value(np.array([5, 6], np.int64))
    assert t.dtype == np.float32 and t.tolist() == [5.0, 6.0]
    with pytest.raises(
        ValueError, match=r"set_value: shape \(3,\) does not match tensor shape \(2,\)"
    ):
        t.set_value([1.0, 2.0, 3.0])


def test_set_shares_memory_and_checks_shape_and_dtype(device):
    t = mg.tensor([1.0, 2.0], device=device)
    source = t.xp.asarray(np.array([5.0, 6.0], np.float32))
    assert t.set_(source) is t and t.data is source
    source[0] = 7.0  # no copy: the tensor sees writes to the shared memory
    assert t.tolist() == [7.0, 6.0]
    with pytest.raises(ValueError, match=r"set_: expected \(2,\) float32, got \(3,\) float32"):
        t.set_(t.xp.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"set_: expected \(2,\) float32, got \(2,\) float64"):
        t.set_(t.xp.zeros(2, np.float64))


def test_methods_delegate_to_functional(device, rng):
    x = rng.standard_normal((2, 3, 4))
    t = mg.tensor(x, device=device)
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1))
    np.testing.assert_allclose(t.mean((0, 2), True).numpy(), x.mean((0, 2), keepdims=True))
    np.testing.assert_allclose(t.max(-1).numpy(), x.max(-1))
    np.testing.assert_allclose(t.min().numpy(), x.min())
    np.testing.assert_allclose(t.prod(0).numpy(), x.prod(0))
    np.testing.assert_allclose(t.var(2).numpy(), x.var(2))
    np.testing.assert_allclose(t.std(2).numpy(), x.std(2))
    np.testing.assert_array_equal(t.argmax(1).numpy(), x.argmax(1))
    np.testing.assert_array_equal(t.argmin(1).numpy(), x.argmin(1))
    np.testing.assert_array_equal(t.transpose(2, 0, 1).numpy(), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(t.transpose((1, 0, 2)).numpy(), x.transpose(1, 0, 2))
    np.testing.assert_array_equal(t.reshape((4, 6)).numpy(), x.reshape(4, 6))
    np.testing.assert_array_equal(t.flatten().numpy(), x.ravel())


# -- MegEngine compatibility ----------------------------------------------------------------------


def test_tensor_is_the_tensor_class():
    assert mg.tensor is mg.Tensor
    t = mg.tensor([1, 2])
    assert isinstance(t, mg.tensor) and t.dtype == np.int32 and t.tolist() == [1, 2]
    assert isinstance(mg.Parameter([1.0]), mg.tensor)


def test_tensors_and_parameters_take_ad_hoc_attributes():
    p = mg.Parameter([1.0, 2.0])
    p.grad_backup = mg.tensor([3.0, 4.0])
    assert p.grad_backup.tolist() == [3.0, 4.0]
    t = mg.tensor([1.0])
    t.tag = "activation"
    assert t.tag == "activation" and not hasattr(mg.tensor([1.0]), "tag")
    y = t * 2  # results of ops are plain tensors again
    y.note = 1
    assert y.note == 1


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv,
                                operator.pow, operator.matmul])
def test_operators_with_none_raise_type_error(op):
    t = mg.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="unsupported operand None"):
        op(t, None)
    with pytest.raises(TypeError, match="unsupported operand None"):
        op(None, t)


def test_tensor_backward_outside_a_recording_raises():
    with pytest.raises(RuntimeError, match="Tensor.backward: this tensor"):
        (mg.tensor([1.0]) * 2).backward()


def test_megengine_tensor_methods_user_code_reads():
    """``reset_zero``, ``format``, ``<<``/``>>`` and ``copy.deepcopy`` (an EMA copy of a model)."""
    import copy

    import minigrad.module as M

    t = mg.tensor(np.array([1, 2, 4], dtype=np.int32))
    np.testing.assert_array_equal((t << 2).numpy(), [4, 8, 16])
    np.testing.assert_array_equal((t >> 1).numpy(), [0, 1, 2])
    np.testing.assert_array_equal((1 << t).numpy(), [2, 4, 16])
    np.testing.assert_array_equal((16 >> t).numpy(), [8, 4, 1])
    assert t.format == "default"
    w = mg.Parameter(np.ones((2, 2), np.float32))
    assert w.reset_zero() is w and w.dtype == np.float32
    np.testing.assert_array_equal(w.numpy(), np.zeros((2, 2)))
    net = M.Sequential(M.Linear(2, 3), M.BatchNorm1d(3))
    net[0].bias.requires_grad_(False)
    net[0].weight.grad = mg.tensor(np.full((3, 2), 5.0, np.float32))
    ema = copy.deepcopy(net)
    assert type(ema[0].weight) is mg.Parameter and ema[0].weight is not net[0].weight
    for (name, a), (_, b) in zip(net.named_tensors(), ema.named_tensors(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert not ema[0].bias.requires_grad and ema[0].weight.requires_grad
    np.testing.assert_array_equal(ema[0].weight.grad.numpy(), 5.0)
    ema[0].weight.reset_zero()
    assert net[0].weight.numpy().any()  # independent storage


def test_unnamed_tensor_name_is_empty_string():
    """MegEngine: a tensor built without a name has name "" (results of ops too); a name given
    or assigned is kept."""
    x = mg.tensor([1.0])
    assert x.name == "" and (x + 1).name == ""
    x.name = "x"
    assert x.name == "x" and mg.tensor(0, name="y").name == "y"


def test_numpy_operator_functions_on_tensors_return_tensors():
    """MegEngine: ``np.add(t, a)``, ``np.equal(a, t)`` and the other NumPy functions that are
    operators give Tensors, as ``t + a`` does (differentiable, on the tensor's device); other
    NumPy functions still compute on the arrays."""
    x = np.array([1, 2, 3], np.int32)
    t, y = mg.tensor(x, device="cpu0"), np.array([1, 0, 3], np.int32)
    for fn in (np.add, np.subtract, np.multiply, np.equal, np.less, np.greater_equal):
        got = fn(t, y)
        assert isinstance(got, mg.Tensor) and got.device == t.device
        np.testing.assert_array_equal(got.numpy(), fn(x, y))
        np.testing.assert_array_equal(fn(y, t).numpy(), fn(y, x))
    w = mg.tensor([2.0, 3.0])
    gm = mg.autodiff.GradManager().attach([w])
    with gm:
        gm.backward(np.multiply(np.array([4.0, 5.0]), w).sum())
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 5.0])
    assert isinstance(np.exp(mg.tensor([0.0])), np.ndarray)
    out = np.zeros(3, np.int32)
    np.add(t, y, out=out)
    np.testing.assert_array_equal(out, x + y)
