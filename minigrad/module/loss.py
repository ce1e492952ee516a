"""Loss layers in OneFlow's and PyTorch's style: ``CrossEntropyLoss`` and ``MSELoss``.

MegEngine has loss *functions* only (``F.nn.cross_entropy``, ``F.nn.square_loss``); OneFlow and
PyTorch programs build loss modules (``self.loss_fn = nn.CrossEntropyLoss()``), so these wrap the
functions with OneFlow's constructor arguments. They are compositions of functional ops, so they
work unchanged on global tensors.
"""

from __future__ import annotations

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.module.module import Module

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(layer: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"{layer}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    return reduction


class CrossEntropyLoss(Module):
    """Cross entropy of class scores (N, C, ...) against integer labels (N, ...), OneFlow's
    ``nn.CrossEntropyLoss``: log-softmax over axis 1, then the negative log-likelihood.

    ``weight`` (C,) rescales each class; targets equal to ``ignore_index`` contribute nothing;
    ``reduction="mean"`` divides by the summed weights of the counted targets (the plain mean when
    there are no weights); ``label_smoothing`` mixes the one-hot target with the uniform one.

    Example::

        loss_fn = M.CrossEntropyLoss()
        loss = loss_fn(logits, labels)   # logits (N, 10), labels int (N,)
    """

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        self.weight = weight
        self.ignore_index = int(ignore_index)
        self.reduction = _check_reduction("CrossEntropyLoss", reduction)
        self.label_smoothing = float(label_smoothing)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002  (OneFlow's name)
        plain = self.weight is None and self.ignore_index < 0
        if plain:
            return F.nn.cross_entropy(input, target, axis=1, label_smooth=self.label_smoothing,
                                      reduction=self.reduction)
        # per-target weights: weight[target] (or 1), 0 where target == ignore_index
        ignored = target == self.ignore_index
        safe = F.where(ignored, 0, target)
        nll = F.nn.cross_entropy(input, safe, axis=1, label_smooth=self.label_smoothing,
                                 reduction="none")
        w = 1.0 - ignored.astype(nll.dtype)
        if self.weight is not None:
            weight = self.weight if isinstance(self.weight, Tensor) else Tensor(self.weight)
            w = w * weight.astype(nll.dtype)[safe]
        loss = nll * w
        if self.reduction == "none":
            return loss
        if self.reduction == "sum":
            return loss.sum()
        return loss.sum() / w.sum()

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class MSELoss(Module):
    """Mean squared error ``(input - target)**2`` reduced by ``reduction`` (OneFlow's
    ``nn.MSELoss``; the module form of ``F.nn.square_loss``)."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = _check_reduction("MSELoss", reduction)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002  (OneFlow's name)
        return F.nn.square_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
