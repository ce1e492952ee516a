"""matmul / dot / einsum: forward against NumPy float64, backward against finite differences,
second order, and shape/device errors."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.testing import check_grad

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),  # 1-D left operand is promoted then squeezed
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),  # batched against a matrix
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),  # batch dimensions broadcast
    ((1, 1), (1, 1)),
    ((2, 3, 4), (4,)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=str)
def test_matmul_forward_and_grad(sa, sb, device, rng):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    out = F.matmul(
        mg.tensor(a.astype(np.float32), device=device),
        mg.tensor(b.astype(np.float32), device=device),
    )
    expect = np.matmul(
        a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    )
    assert out.shape == expect.shape and out.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-5, atol=1e-5)
    check_grad(F.matmul, a, b, device=device)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transpose_flags(ta, tb, device, rng):
    a = rng.standard_normal((4, 3) if ta else (3, 4))
    b = rng.standard_normal((5, 4) if tb else (4, 5))
    out = F.matmul(
        mg.tensor(a, device=device), mg.tensor(b, device=device), transpose_a=ta, transpose_b=tb
    )
    np.testing.assert_allclose(out.numpy(), (a.T if ta else a) @ (b.T if tb else b), rtol=1e-12)
    check_grad(lambda x, y: F.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b, device=device)


def test_matmul_operator_and_noncontiguous(device, rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((5, 8))

    def f(x, y):
        return x.T @ y[::2].T[::2]  # (3, 4) @ (4, 3), both strided views

    ta, tb = mg.tensor(a, device=device), mg.tensor(b, device=device)
    np.testing.assert_allclose(f(ta, tb).numpy(), a.T @ b[::2].T[::2], rtol=1e-12)
    check_grad(f, a, b, device=device)
    np.testing.assert_allclose((a @ ta.T).numpy(), a @ a.T, rtol=1e-12)  # ndarray @ Tensor


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((2, 3, 4), (4, 2)), ((4,), (4, 3))], ids=str)
def test_matmul_second_order(sa, sb, device, rng, double_grad):
    double_grad(F.matmul, rng.standard_normal(sa), rng.standard_normal(sb), device=device)
    # a genuinely nonlinear composition: the Hessian of (A @ B)^2 has A-A and A-B blocks
    double_grad(
        lambda x, y: F.matmul(x, y) ** 2,
        rng.standard_normal(sa),
        rng.standard_normal(sb),
        device=device,
    )


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
def test_matmul_dtypes(dtype, device, rng):
    a = rng.integers(-3, 4, (3, 4)).astype(dtype)
    b = rng.integers(-3, 4, (4, 2)).astype(dtype)
    out = F.matmul(mg.tensor(a, device=device), mg.tensor(b, device=device))
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.numpy(), a.astype(np.float64) @ b.astype(np.float64))


def test_dot(device, rng):
    a, b = rng.standard_normal(5), rng.standard_normal(5)
    out = F.dot(mg.tensor(a, device=device), mg.tensor(b, device=device))
    assert out.shape == ()
    np.testing.assert_allclose(out.item(), a @ b, rtol=1e-12)
    check_grad(F.dot, a, b, device=device)


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ijk,k->ij", [(2, 3, 4), (4,)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]),
    ("ij,k->ik", [(3, 4), (2,)]),  # j summed inside one operand only
    # NumPy's ellipsis (broadcast dimensions, aligned from the right) and diagonals
    ("...ij->...ji", [(2, 3, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("i...k,k...j", [(2, 3, 4, 5), (5, 3, 4, 2)]),
    ("...i->...", [(2, 3, 4)]),
    ("ii", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("iijj->ij", [(3, 3, 2, 2)]),
    ("i...i", [(3, 2, 3)]),
    ("ij,jj->i", [(2, 3), (3, 3)]),
]


@pytest.mark.parametrize("spec,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(spec, shapes, device, rng):
    xs = [rng.standard_normal(s) for s in shapes]
    out = F.einsum(spec, *[mg.tensor(x, device=device) for x in xs])
    np.testing.assert_allclose(out.numpy(), np.einsum(spec, *xs), rtol=1e-10, atol=1e-12)
    check_grad(lambda *ts: F.einsum(spec, *ts), *xs, device=device)


def test_einsum_second_order(device, rng, double_grad):
    double_grad(
        lambda a, b: F.einsum("ij,jk->ik", a, b) ** 2,
        rng.standard_normal((2, 3)),
        rng.standard_normal((3, 2)),
        device=device,
    )


LINALG_ERRORS = [
    (
        lambda a, b: F.matmul(a, b),
        r"matmul: shapes \(2, 3\) and \(4, 5\) are not aligned \(3 != 4\)",
        (2, 3),
        (4, 5),
    ),
    (lambda a, b: a @ b, r"matmul: shapes \(3,\) and \(4,\) are not aligned", (3,), (4,)),
    (
        lambda a, b: F.matmul(a, b),
        r"matmul: batch dimensions of shapes \(2, 2, 3\) and \(5, 3, 5\) "
        r"cannot be broadcast",
        (2, 2, 3),
        (5, 3, 5),
    ),
    (
        lambda a, b: F.dot(a, b),
        r"dot: expects two vectors, got shapes \(2, 3\) and \(3,\)",
        (2, 3),
        (3,),
    ),
    (
        lambda a, b: F.einsum("ij,jk->ik", a, b),
        r"einsum: subscript 'j' has sizes 3 and 4",
        (2, 3),
        (4, 5),
    ),
    (
        lambda a, b: F.einsum("ij,jk->il", a, b),
        r"einsum: output subscript 'l' of 'ij,jk->il' must name one input axis once",
        (3, 3),
        (3, 4),
    ),
    (
        lambda a, b: F.einsum("ijk,jk->i", a, b),
        r"einsum: subscripts 'ijk' do not match operand of shape "
        r"\(2, 3\)",
        (2, 3),
        (3, 4),
    ),
]


@pytest.mark.parametrize("fn,msg,sa,sb", LINALG_ERRORS, ids=[e[1][:30] for e in LINALG_ERRORS])
def test_errors_name_op_and_shapes(fn, msg, sa, sb, device):
    a = mg.tensor(np.ones(sa, np.float32), device=device)
    b = mg.tensor(np.ones(sb, np.float32), device=device)
    with pytest.raises(ValueError, match=msg):
        fn(a, b)


def test_matmul_of_scalars_is_rejected(device):
    with pytest.raises(ValueError, match="matmul: both operands must be tensors of rank >= 1"):
        F.matmul(mg.tensor(2.0, device=device), mg.tensor([1.0], device=device))
