"""The array-module switch (``xp``), the guarded CuPy import, and the few kernels whose NumPy and
CuPy spellings differ.

CuPy is optional: it is imported on first use (``cupy_or_none``), never at ``import minigrad``, so a
CPU-only install never loads CUDA libraries, and the reason an import failed is kept for the error
message of whoever asks for a GPU. Tests swap in a stand-in with :func:`use_cupy`, which announces
the swap through :data:`minigrad.seams.GPU_ARRAYS` (the modules that cache GPU objects watch it).
:func:`on_device_of` makes an array's GPU the current device for code working on raw arrays.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

import numpy as np

from minigrad import seams

_cupy = None
_cupyx = None
_cupy_error: str | None = None
_cupy_checked = False
_stand_in = False  # the GPU array module was swapped in by use_cupy (a test's stand-in)


def cupy_or_none():
    """Return the ``cupy`` module, or None when it is not installed or cannot load CUDA.

    Importing CuPy loads its CUDA libraries but does not initialise a CUDA context, so calling this
    is safe in a process that will fork GPU workers later.
    """
    global _cupy, _cupyx, _cupy_error, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:  # an optional dependency: imported by name, on first use
            _cupy = importlib.import_module("cupy")
            _cupyx = importlib.import_module("cupyx")
            importlib.import_module("cupyx.scipy.special")
        except Exception as exc:  # ImportError, or a CUDA library that fails to load
            _cupy = _cupyx = None
            _cupy_error = f"{type(exc).__name__}: {exc}"
    return _cupy


def cupy_import_error() -> str | None:
    """Why CuPy could not be imported (None when it imported, or was not tried yet)."""
    cupy_or_none()
    return _cupy_error


@contextlib.contextmanager
def use_cupy(cupy, cupyx):
    """Use ``cupy``/``cupyx`` as the GPU array modules inside the block, then restore the previous
    ones: how tests run minigrad's GPU code on a stand-in (the tests' fake CuPy).

    Example::

        with use_cupy(fake, fake.cupyx):
            mg.tensor([1.0], device="gpu0")   # a fake-CuPy array
    """
    global _cupy, _cupyx, _cupy_error, _cupy_checked, _stand_in
    saved = (_cupy, _cupyx, _cupy_error, _cupy_checked, _stand_in)
    _cupy, _cupyx, _cupy_error, _cupy_checked, _stand_in = cupy, cupyx, None, True, True
    previous = seams.GPU_ARRAYS.install((cupy, cupyx))  # modules caching GPU objects forget them
    try:
        yield cupy
    finally:
        _cupy, _cupyx, _cupy_error, _cupy_checked, _stand_in = saved
        seams.GPU_ARRAYS.install(previous)


def cupy_is_stand_in() -> bool:
    """Whether the GPU array module is one swapped in by :func:`use_cupy` (a test's stand-in):
    the state of the real CUDA driver in this process means nothing to its "GPUs"."""
    return _stand_in


def is_cupy_array(x) -> bool:
    """Whether ``x`` is a CuPy array; never imports CuPy (without it there are no CuPy arrays).

    Before minigrad itself has asked for CuPy, the array may still come from a CuPy the program
    imported (``cupy.asarray(...)`` handed to a collective): then the CuPy in ``sys.modules``
    decides."""
    cp = _cupy if _cupy_checked else sys.modules.get("cupy")
    return cp is not None and isinstance(x, cp.ndarray)


_NO_CONTEXT = contextlib.nullcontext()


def on_device_of(array):
    """A context manager making the GPU that holds ``array`` CUDA's current device (nothing for
    a host array): code working on raw arrays runs inside it, so that its kernels launch where the
    data is (CuPy launches on the current device).

    Example::

        with on_device_of(p):
            p -= lr * g
    """
    return array.device if is_cupy_array(array) else _NO_CONTEXT


def get_array_module(*arrays):
    """Return ``cupy`` if any argument is a CuPy array, else ``numpy`` (Chainer's idiom).

    Example::

        xp = get_array_module(a, b)
        out = xp.maximum(a, b)   # one kernel for both backends
    """
    cp = _cupy
    if cp is not None:
        for a in arrays:
            if isinstance(a, cp.ndarray):
                return cp
    return np


def to_numpy(array) -> np.ndarray:
    """Copy an array of any backend into host memory (no copy for NumPy arrays)."""
    if isinstance(array, np.ndarray):
        return array
    cp = _cupy
    if cp is not None and isinstance(array, cp.ndarray):
        return cp.asnumpy(array)
    return np.asarray(array)


def erf(xp):
    """The error function ufunc for arrays of ``xp`` (SciPy's on the CPU, CuPy's on a GPU).
    SciPy is imported on first use: it would add about 0.2 s to ``import minigrad``."""
    if xp is not np:
        return _cupyx.scipy.special.erf
    import scipy.special  # noqa: PLC0415  (deferred: import time)

    return scipy.special.erf


def scatter_add(xp, target, index, values) -> None:
    """``target[index] += values`` where repeated indices accumulate (``np.add.at`` semantics;
    a plain ``+=`` would keep only the last of the repeats)."""
    if xp is np or not xp.__version__.startswith("13."):  # CuPy 14 deprecates cupyx.scatter_add
        xp.add.at(target, index, values)
    else:
        _cupyx.scatter_add(target, index, values)
