"""The array-module switch (``xp``) and the guarded CuPy import."""

from __future__ import annotations

import numpy as np

_cupy = None
_cupy_error: str | None = None
_cupy_checked = False


def cupy_or_none():
    """Return the ``cupy`` module, or None when it is not installed or cannot load CUDA."""
    global _cupy, _cupy_error, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy  # noqa: PLC0415  (optional dependency, imported on first use)

            _cupy = cupy
        except Exception as exc:  # ImportError, or a CUDA library that fails to load
            _cupy_error = f"{type(exc).__name__}: {exc}"
    return _cupy


def cupy_import_error() -> str | None:
    """Why CuPy could not be imported (None when it imported, or was not tried yet)."""
    cupy_or_none()
    return _cupy_error


def get_array_module(*arrays):
    """Return ``cupy`` if any argument is a CuPy array, else ``numpy`` (Chainer's idiom)."""
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
