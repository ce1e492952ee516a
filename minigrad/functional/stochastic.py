"""Ops that draw random numbers (``dropout``), from minigrad's seeded generators
(``minigrad.backend.rng``), so they are reproducible under ``mg.random.seed``."""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.backend.rng import get_rng
from minigrad.functional.elementwise import _f

__all__ = ["dropout"]


def dropout(inp, drop_prob: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability ``drop_prob`` and scale the survivors
    by ``1 / (1 - drop_prob)``, so evaluation (``training=False``) is the identity. Draws from
    ``mg.random.get_rng`` and is therefore reproducible under ``mg.random.seed``.

    Example::

        h = F.dropout(h, 0.1, training=model.training)
    """
    inp = _f(inp)
    if not 0.0 <= drop_prob <= 1.0:
        raise ValueError(f"dropout: drop_prob must be in [0, 1], got {drop_prob}")
    if not training or drop_prob == 0.0:
        return inp
    xp = inp.xp
    if drop_prob == 1.0:
        return inp * 0.0
    with inp._device.context():  # a GPU generator draws on its own device
        keep = get_rng(inp._device).random(inp.shape, dtype=np.float32) >= drop_prob
        mask = xp.asarray(keep, dtype=inp.dtype) * inp.dtype.type(1.0 / (1.0 - drop_prob))
    return inp * Tensor._wrap(mask, inp._device)
