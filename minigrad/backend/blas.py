"""Matrix products on the CPU through Intel MKL, where the optional ``mkl`` extra is installed and
MKL is the faster library for this CPU; NumPy's ``matmul`` everywhere else.

NumPy multiplies matrices with the BLAS it was built with (OpenBLAS in the wheels from PyPI).
``benchmarks/bench_blas.py`` times the products of one training step of each benchmark model
under both, each in its own process, on 2 threads: on an Intel Xeon (AVX-512) MKL took 0.47-0.79x
OpenBLAS's time, on an AMD EPYC (Zen 5) 1.03-1.44x (1.8-1.9x OpenBLAS's own AVX-512 kernels). In
whole training steps on that Xeon (with PyTorch's copy of MKL) only the MLP gained; LeNet's and
the Transformer block's steps were slower, their products no faster between the other kernels
(README, "The GPU machine's Intel host"). The choice, made once at the first product (``auto``):

* MKL when ``pip install "minigrad[mkl]"`` put ``libmkl_rt`` beside the interpreter and the CPU's
  vendor is Intel;
* NumPy's ``matmul`` otherwise, exactly as before.

``MINIGRAD_BLAS`` (or :func:`select`) overrides it: ``numpy`` never uses MKL, ``mkl`` uses it on
any CPU and is an error when no MKL is found. ``MINIGRAD_MKL_LIBRARY`` names another library that
exports MKL's Fortran symbols (PyTorch's ``libtorch_cpu.so`` does).

The binding is MKL's Fortran ``?gemm_`` and ``?gemm_batch_`` called through ctypes. A row-major
product ``C = A @ B`` is the column-major product ``C^T = B^T @ A^T``, and a row-major matrix
read column-major is its transpose, so row-major operands pass as they are: each matrix may be
C-contiguous or the transpose of a C-contiguous one (``w.T``, ``swapaxes``: a 'T' flag instead of
a copy), with any leading dimension. A stack of products, ``(..., m, k) @ (..., k, n)`` with
batch axes that broadcast and any strides, is one ``?gemm_batch_`` call, its matrices' addresses
computed by NumPy from the strides; ``(..., m, k) @ (k, n)`` with a C-contiguous left side is one
``(M, k) @ (k, n)`` product (NumPy makes it one product per batch item). Everything else - other
dtypes, a matrix without a unit stride, products too small to gain (fewer than ``MIN_WORK``
multiply-adds in all), an ``out`` that overlaps an input or is read-only - goes to NumPy.
MKL's threads follow :func:`minigrad.set_num_threads` (``threadpoolctl`` sees MKL once it is
loaded; the count in force is applied when it loads).

Example::

    from minigrad.backend import blas
    blas.matmul(a, b)        # a @ b, through MKL where chosen
    blas.library()           # e.g. 'mkl 2026.2' or 'numpy'
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import sys

import numpy as np

from minigrad.backend.threads import get_num_threads
from minigrad.backend.xp import get_array_module

__all__ = ["MIN_WORK", "library", "matmul", "select"]

MIN_WORK = 1 << 15  # multiply-adds below which a ctypes call costs more than MKL gains
CHOICES = ("auto", "mkl", "numpy")

_state: dict = {"choice": None, "lib": None, "version": None}
# Fortran takes every argument by reference: the constant ones live here, passed as addresses
_CONSTANTS = {"N": ctypes.c_char(b"N"), "T": ctypes.c_char(b"T"),
              "float32 1": ctypes.c_float(1.0), "float32 0": ctypes.c_float(0.0),
              "float64 1": ctypes.c_double(1.0), "float64 0": ctypes.c_double(0.0)}
_ADDRESS = {name: ctypes.addressof(value) for name, value in _CONSTANTS.items()}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_INT32_MAX = 2**31 - 1  # MKL_INT of the LP64 interface


def select(choice: str) -> str:
    """Choose the library for the CPU's float products from now on: ``"auto"`` (MKL where it is
    installed and the CPU is Intel's), ``"mkl"`` (MKL on any CPU; ``RuntimeError`` when it is
    not found) or ``"numpy"``. Returns :func:`library`'s answer."""
    if choice not in CHOICES:
        raise ValueError(f"blas.select: expected one of {', '.join(CHOICES)}, got {choice!r}")
    wanted = choice == "mkl" or (choice == "auto" and _intel_cpu())
    lib = _load_mkl(required=choice == "mkl") if wanted else None
    _state.update(choice=choice, lib=lib)
    return library()


def library() -> str:
    """What multiplies the CPU's float32/float64 matrices: ``"mkl <version>"`` or ``"numpy"``."""
    if _state["choice"] is None:
        select(os.environ.get("MINIGRAD_BLAS", "auto"))
    return f"mkl {_state['version']}" if _state["lib"] is not None else "numpy"


def matmul(a, b, out=None):
    """``a @ b`` (into ``out`` when given), as ``matmul`` of ``a``'s array module computes it: on
    the CPU through MKL where :func:`library` says so and the operands allow it (see the module
    docstring), else through NumPy (or CuPy, for GPU arrays)."""
    if not isinstance(a, np.ndarray):
        return get_array_module(a).matmul(a, b, out=out)
    if _state["choice"] is None:
        library()
    if _state["lib"] is not None:
        result = _gemm(a, b, out)
        if result is not None:
            return result
    return np.matmul(a, b, out=out)


# ----------------------------------------------------------------------------------------------
# the binding


def _matrix(x):
    """``(flag, leading dimension)`` that describe 2-D ``x`` to column-major BLAS as ``x^T`` (its
    row-major reading), or None when neither axis has a unit stride."""
    rows, cols = x.shape
    s_row, s_col = (s // x.itemsize for s in x.strides)
    if s_col == 1 and s_row >= cols:
        return "N", s_row
    if s_row == 1 and s_col >= rows:
        return "T", s_col
    return None


def _gemm(a, b, out):
    """``a @ b`` through MKL into ``out`` or a new array, which it returns; None when the
    operands are not a case MKL takes here (see the module docstring)."""
    dtype = a.dtype
    if dtype not in _FLOATS or b.dtype != dtype or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k or min(m, n, k) < 2:
        return None
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        batch, a = a.shape[:-2], a.reshape(-1, k)  # one (M, k) @ (k, n) product
    else:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None  # NumPy raises its error
    shape = batch + (m, n)
    if math.prod(shape) * k < MIN_WORK:
        return None
    if out is None:
        result = np.empty(shape, dtype)
    elif (out.shape != shape or out.dtype != dtype or not out.flags.writeable
          or 0 in out.strides[:-2] or np.may_share_memory(out, a)
          or np.may_share_memory(out, b)):
        return None
    else:
        result = out
    if a.ndim == 2 and b.ndim == 2:  # one product
        if result.ndim > 2 and not result.flags.c_contiguous:
            return None
        return None if _gemm_2d(a, b, result.reshape(-1, n)) is None else result
    a, b = np.broadcast_to(a, batch + a.shape[-2:]), np.broadcast_to(b, batch + b.shape[-2:])
    first = (0,) * len(batch)
    count = math.prod(batch)
    layouts = _layouts(a[first], b[first], result[first], count)
    if layouts is None:
        return None
    (fa, lda), (fb, ldb), ldc = layouts
    lib = _state["lib"]
    fn = lib.sgemm_batch_ if dtype == np.float32 else lib.dgemm_batch_
    held, p = _by_reference([n, m, k, ldb, lda, ldc, 1, count])
    pointers = [_addresses(x) for x in (b, a, result)]
    fn(_ADDRESS[fb], _ADDRESS[fa], p[0], p[1], p[2], _ADDRESS[f"{dtype.name} 1"],
       pointers[0].ctypes.data, p[3], pointers[1].ctypes.data, p[4],
       _ADDRESS[f"{dtype.name} 0"], pointers[2].ctypes.data, p[5], p[6], p[7])
    return result


def _gemm_2d(a, b, c):
    """``c = a @ b`` for 2-D operands through ``?gemm_``; None when a layout does not fit."""
    layouts = _layouts(a, b, c)
    if layouts is None:
        return None
    (fa, lda), (fb, ldb), ldc = layouts
    lib, dtype = _state["lib"], a.dtype
    fn = lib.sgemm_ if dtype == np.float32 else lib.dgemm_
    held, p = _by_reference([c.shape[1], c.shape[0], a.shape[1], ldb, lda, ldc])
    fn(_ADDRESS[fb], _ADDRESS[fa], p[0], p[1], p[2], _ADDRESS[f"{dtype.name} 1"], b.ctypes.data,
       p[3], a.ctypes.data, p[4], _ADDRESS[f"{dtype.name} 0"], c.ctypes.data, p[5])
    return c


def _layouts(a, b, c, *counts):
    """``((flag, ld) of a, (flag, ld) of b, ld of c)`` for one matrix of each, or None when one
    has no unit stride, ``c`` is not row-major, or a size passes MKL_INT."""
    flags = _matrix(a), _matrix(b), _matrix(c)
    if None in flags or flags[2][0] != "N":
        return None
    if max(*a.shape, *b.shape, *counts, *(f[1] for f in flags)) > _INT32_MAX:
        return None
    return flags[0], flags[1], flags[2][1]


def _by_reference(values: list) -> tuple:
    """``values`` as an int32 array (kept alive by the caller for the call) and the address of
    each: Fortran takes its integers by reference."""
    held = np.array(values, np.int32)
    return held, [held.ctypes.data + 4 * i for i in range(len(values))]


def _addresses(x):
    """The address of each matrix of ``x`` (..., r, c), in C order of the batch axes (int64)."""
    address = np.full((), x.ctypes.data, np.int64)
    for size, stride in zip(x.shape[:-2], x.strides[:-2]):
        address = address[..., None] + np.arange(size, dtype=np.int64) * stride
    return address.reshape(-1)


# ----------------------------------------------------------------------------------------------
# finding MKL


def _intel_cpu() -> bool:
    """Whether the CPU's vendor is Intel (``/proc/cpuinfo``; False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return False


def _mkl_paths() -> list[str]:
    named = os.environ.get("MINIGRAD_MKL_LIBRARY")
    if named:
        return [named]
    return sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))


def _load_mkl(required: bool):
    """MKL's library (ctypes) with its functions typed, or None (``RuntimeError`` when
    ``required``)."""
    if _state["lib"] is not None:
        return _state["lib"]
    paths = _mkl_paths()
    problem = "no libmkl_rt beside the interpreter (pip install \"minigrad[mkl]\")"
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            for name, count in (("sgemm_", 13), ("dgemm_", 13), ("sgemm_batch_", 15),
                                ("dgemm_batch_", 15)):
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = None, [ctypes.c_void_p] * count
        except (OSError, AttributeError) as exc:
            problem = f"{path}: {exc}"
            continue
        version = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(version, len(version))
        _state["version"] = _short_version(version.value.decode())
        set_threads = getattr(lib, "MKL_Set_Num_Threads", None)
        if set_threads is not None:  # (PyTorch's copy has none: its threads are PyTorch's)
            set_threads(get_num_threads())
        return lib
    if required:
        raise RuntimeError(f"MINIGRAD_BLAS=mkl: MKL cannot be used: {problem}")
    return None


def _short_version(text: str) -> str:
    """'2026.2' from 'Intel(R) oneAPI Math Kernel Library Version 2026.2-Product Build ...'."""
    words = text.split("Version ", 1)
    return words[1].split("-")[0].split()[0] if len(words) == 2 else text.strip()
