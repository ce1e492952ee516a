"""``Dropout``: inverted dropout in training, the identity in evaluation."""

from __future__ import annotations

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.module.module import Module, no_parameters


class Dropout(Module):
    """Zero each element with probability ``drop_prob`` and scale the rest by
    ``1 / (1 - drop_prob)`` while training, so evaluation needs no rescaling."""

    count_parameters = staticmethod(no_parameters)

    def __init__(self, drop_prob: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"Dropout: drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = float(drop_prob)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        return F.dropout(x, self.drop_prob, training=True)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"
