"""Helpers for layer tests: run a layer with float64 parameters and check its gradients.

(Imported by name from the test files; pytest puts this folder on ``sys.path``.)
"""

from __future__ import annotations

import numpy as np
import pytest

import minigrad.functional as F
from minigrad.testing import check_grad


def to_float64(module) -> None:
    """Cast every parameter and buffer of ``module`` to float64 in place (for exact references)."""
    for t in module.tensors():
        t._data = t._data.astype(np.float64)


def _set_path(module, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        module = getattr(module, p)
    setattr(module, leaf, value)


def layer_check_grad(layer, *inputs, params=(), rtol=1e-5, call=None, **kwargs) -> None:
    """Finite-difference check of ``layer`` w.r.t. its inputs and the named parameters
    (``call(layer, *inputs)`` picks the output to check when the layer returns several)."""
    names = list(params)
    state = dict(layer.named_parameters())
    originals = {n: state[n] for n in names}
    arrays = [np.asarray(state[n].numpy(), np.float64) for n in names]
    n_in = len(inputs)

    def fn(*args):
        for n, p in zip(names, args[n_in:], strict=True):
            _set_path(layer, n, p)
        return layer(*args[:n_in]) if call is None else call(layer, *args[:n_in])

    try:
        check_grad(fn, *inputs, *arrays, rtol=rtol, **kwargs)
    finally:
        for n, p in originals.items():
            _set_path(layer, n, p)


def needs(*names):
    """Skip until the functional ops a layer wraps exist (they are written concurrently)."""
    missing = [n for n in names if not hasattr(F, n)]
    return pytest.mark.skipif(bool(missing), reason=f"F.{', F.'.join(missing)} not available yet")
