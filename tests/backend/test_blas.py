"""``minigrad.backend.blas``: the CPU's products through MKL equal NumPy's to float32 rounding
(float64: 1e-12) in every layout the binding takes, everything else falls back to NumPy, the
choice of library follows ``MINIGRAD_BLAS`` and the CPU's vendor, and the op tests pass with every
product MKL can take sent through it. The MKL tests skip where no MKL is installed (``pip install
"minigrad[mkl]"``; ``MINIGRAD_MKL_LIBRARY`` names another library exporting it)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from minigrad.backend import blas

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def mkl_selected():
    """MKL selected (skip where none is installed); NumPy again afterwards (conftest's)."""
    try:
        blas.select("mkl")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield blas
    blas.select("numpy")


@pytest.fixture
def mkl(mkl_selected, monkeypatch):
    """MKL selected, taking every product however small."""
    monkeypatch.setattr(blas, "MIN_WORK", 0)
    return blas


def _reference(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _assert_close(got, a, b):
    """Within the float32 rounding bound of a length-k dot product (float64: 1e-12)."""
    want = _reference(a, b)
    assert got.shape == want.shape and got.dtype == a.dtype
    if a.dtype == np.float32:
        k = a.shape[-1]
        bound = k * np.finfo(np.float32).eps * _reference(np.abs(a), np.abs(b))
        assert np.all(np.abs(got - want) <= bound + 1e-30)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _layouts(rng, dtype):
    """(name, a, b) in the layouts the binding takes without a copy."""
    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    t = lambda x: np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)  # noqa: E731
    return [
        ("2-D", r(9, 7), r(7, 5)),
        ("a transposed", t(r(9, 7)), r(7, 5)),
        ("b transposed", r(9, 7), t(r(7, 5))),
        ("both transposed", t(r(9, 7)), t(r(7, 5))),
        ("rows of a wider array", r(9, 12)[:, 2:9], r(7, 8)[:, :5]),
        ("stack @ matrix, flattened", r(3, 4, 7), r(7, 5)),
        ("stacks", r(3, 4, 7), r(3, 7, 5)),
        ("stacks, b transposed", r(3, 4, 7), t(r(3, 7, 5))),
        ("batch axes that broadcast", r(2, 1, 4, 7), r(1, 3, 7, 5)),
        ("matrix @ stack", r(4, 7), r(3, 7, 5)),
        ("heads as strided views", r(2, 6, 3, 4, 8)[:, :, 0].swapaxes(1, 2),
         r(2, 6, 3, 4, 8)[:, :, 1].transpose(0, 2, 3, 1)),
    ]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mkl_products_equal_numpys_in_every_layout(mkl, dtype, monkeypatch):
    rng = np.random.default_rng(0)
    for name, a, b in _layouts(rng, np.dtype(dtype)):
        with monkeypatch.context() as m:  # taken by MKL: NumPy's matmul is never called
            m.setattr(np, "matmul", lambda *args, name=name, **kw: pytest.fail(
                f"{name}: went to NumPy"))
            got = blas.matmul(a, b)
        _assert_close(got, a, b)


def test_mkl_writes_into_out_even_strided(mkl):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4, 7)), rng.standard_normal((3, 7, 5))
    held = np.zeros((3, 4, 9))
    out = held[..., 2:7]  # rows with a leading dimension of 9
    assert blas.matmul(a, b, out=out) is out
    _assert_close(out, a, b)
    assert not held[..., :2].any() and not held[..., 7:].any()  # nothing written beside it


def test_what_mkl_does_not_take_goes_to_numpy(mkl):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 6))
    for x, y in [(a.astype(np.int64), a.astype(np.int64)),  # not a float dtype
                 (a.astype(np.float32), a),  # mixed dtypes
                 (a[::2, ::2], a[::2, ::2]),  # no unit stride
                 (a[:1], a),  # a dimension of 1
                 (a, a[:, 0])]:  # a vector
        np.testing.assert_array_equal(blas.matmul(x, y), np.matmul(x, y))
    out = a.copy()
    np.testing.assert_allclose(blas.matmul(out, a, out=out), _reference(a, a), rtol=1e-12)
    frozen = np.zeros((6, 6))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        blas.matmul(a, a, out=frozen)  # NumPy's refusal, not a write through a pointer
    assert not frozen.any()
    with pytest.raises(ValueError, match="matmul: Input operand 1 has a mismatch"):
        blas.matmul(a, rng.standard_normal((5, 6)))  # NumPy's own error


def test_small_products_stay_with_numpy(mkl_selected, monkeypatch):
    """Below MIN_WORK multiply-adds a ctypes call costs more than MKL gains: NumPy's bits."""
    monkeypatch.setattr(blas, "MIN_WORK", 1 << 15)  # (MINIGRAD_TEST_BLAS=mkl zeroes it)
    a = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    assert 8 * 8 * 8 < blas.MIN_WORK
    np.testing.assert_array_equal(blas.matmul(a, a), np.matmul(a, a))


def test_the_choice_of_library(monkeypatch):
    with pytest.raises(ValueError, match="blas.select: expected one of auto, mkl, numpy, got "
                                         "'openblas'"):
        blas.select("openblas")
    assert blas.select("numpy") == "numpy"
    monkeypatch.setattr(blas, "_state", {"choice": None, "lib": None, "version": None})
    monkeypatch.setenv("MINIGRAD_MKL_LIBRARY", "/nonexistent/libmkl_rt.so.2")
    with pytest.raises(RuntimeError, match="MINIGRAD_BLAS=mkl: MKL cannot be used: "
                                           "/nonexistent/libmkl_rt.so.2"):
        blas.select("mkl")
    assert blas.select("auto") == "numpy"  # not installed: NumPy, silently
    monkeypatch.setenv("MINIGRAD_BLAS", "numpy")
    monkeypatch.setattr(blas, "_state", {"choice": None, "lib": None, "version": None})
    assert blas.library() == "numpy"


def test_auto_takes_mkl_on_intel_cpus_only(mkl_selected, monkeypatch):
    """Measured: MKL 0.48-0.79x OpenBLAS's time on an Intel Xeon, 1.03-1.44x on an AMD EPYC."""
    monkeypatch.setattr(blas, "_intel_cpu", lambda: False)
    assert blas.select("auto") == "numpy"
    monkeypatch.setattr(blas, "_intel_cpu", lambda: True)
    assert blas.select("auto").startswith("mkl ")


def test_the_op_tests_pass_with_every_product_through_mkl(mkl_selected):
    """The products' op tests (matmul, linear, convolutions, attention, the layers and the
    autodiff checks) with MINIGRAD_TEST_BLAS=mkl: every product MKL takes goes through it, and
    each test's own tolerance (NumPy references, finite differences, bitwise fused-vs-composed
    comparisons) holds."""
    tests = ["tests/functional/test_linalg.py", "tests/functional/test_nn_conv.py",
             "tests/functional/test_nn_attention.py", "tests/functional/test_nn.py",
             "tests/module", "tests/autodiff"]
    env = dict(os.environ, MINIGRAD_TEST_BLAS="mkl")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-x", *tests], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1]


def test_mkls_threads_follow_set_num_threads(mkl_selected):
    import threadpoolctl  # noqa: PLC0415

    import minigrad as mg  # noqa: PLC0415

    before = mg.get_num_threads()
    try:
        for n in (1, 2):
            mg.set_num_threads(n)
            pools = {p["internal_api"]: p["num_threads"] for p in threadpoolctl.threadpool_info()}
            if "mkl" not in pools:  # an MKL linked into another library (PyTorch's): its
                pytest.skip("threadpoolctl sees no libmkl_rt")  # threads are that library's
            assert pools["mkl"] == n, pools
    finally:
        mg.set_num_threads(before)
