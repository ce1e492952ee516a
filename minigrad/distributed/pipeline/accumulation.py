"""Gradient accumulation over micro-batches: the loss seed of each micro-batch's backward.

A pipelined step (the :class:`~minigrad.distributed.pipeline.PipelineEngine`, a global-tensor
``Graph``) runs M micro-batches in a schedule's compute order and steps the optimizer once. Each
micro-batch's backward starts from its loss with gradient ``1 / M``, so the accumulated gradients
are those of the *mean* micro-batch loss: the gradients of one batch of M times the size, i.e.
plain gradient accumulation.
"""

from __future__ import annotations

from minigrad.autodiff.tensor import Tensor

__all__ = ["mean_loss_seed"]


def mean_loss_seed(loss: Tensor, micro_batches: int, grad: Tensor | None = None) -> Tensor:
    """The gradient the backward of one of ``micro_batches`` micro-batch losses starts from:
    ``grad`` (ones of ``loss``'s shape and dtype by default) divided by the number of
    micro-batches, so that the accumulated gradients are those of the mean loss."""
    if grad is None:
        seed = loss.xp.full(loss.shape, 1.0 / micro_batches, loss.dtype)
        return Tensor(seed, device=loss.device)
    return grad * (1.0 / micro_batches)
