"""Cross-entropy on logits split by class (vocabulary): the full logits never exist on one rank.

Each rank holds the logits of its samples for a block of classes ``[start, start + C_local)``. With
``z = logits - max`` (the row maximum over all blocks, a constant shift)::

    loss_i = log Σ_c exp(z_ic) - z_i,label_i

needs two sums over the class group — of ``exp(z)`` and of the target logit, which only the rank
owning that class contributes — plus the all-reduce of the maximum. Every rank of the class group
then holds the same per-sample losses, so those sums are ``reduce_from_region`` (backward: the
identity), and the gradient on each rank is ``softmax - onehot`` of its own block. The mean adds
the per-sample losses over the batch group (the ranks with the other samples).
"""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.layouts import (
    Layout,
    active_context,
    as_tensor,
    input_layout,
    tensor_layout,
)
from minigrad.distributed.tensor_parallel.regions import (
    chunk_of,
    gather_from_region,
    max_from_region,
    reduce_from_region,
)

__all__ = ["cross_entropy", "vocab_parallel_cross_entropy"]


def vocab_parallel_cross_entropy(logits: Tensor, labels: Tensor, class_group: Group | None,
                                 class_start: int, batch_group: Group | None = None,
                                 total: int | None = None) -> Tensor:
    """Mean cross-entropy of ``logits`` ``(..., C_local)`` — classes ``[class_start, class_start +
    C_local)`` of the ones split over ``class_group`` — against integer ``labels`` ``(...)``,
    summed over ``batch_group`` and divided by ``total`` samples (default: ``labels.size``).
    The same value on every rank of both groups."""
    op = "vocab_parallel_cross_entropy"
    labels = as_tensor(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{op}: labels must be an integer tensor, got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"{op}: labels of shape {tuple(labels.shape)} do not match logits of shape "
            f"{tuple(logits.shape)} (expected labels {tuple(logits.shape[:-1])})"
        )
    n_local = logits.shape[-1]
    n_classes = n_local * (class_group.size if class_group is not None else 1)
    if labels.size:
        lo, hi = int(labels.data.min()), int(labels.data.max())
        if lo < 0 or hi >= n_classes:
            raise ValueError(f"{op}: labels must be in [0, {n_classes}), got min {lo} max {hi}")
    z = logits - max_from_region(logits.max(axis=-1, keepdims=True), class_group)
    sum_exp = reduce_from_region(F.exp(z).sum(axis=-1), class_group)
    xp = labels.xp
    local = labels.data - class_start
    mine = (local >= 0) & (local < n_local)
    index = Tensor(xp.where(mine, local, 0), device=logits.device)
    picked = F.indexing_one_hot(z, index, axis=-1) * Tensor(mine.astype(z.dtype), device=z.device)
    target = reduce_from_region(picked, class_group)
    loss = reduce_from_region((F.log(sum_exp) - target).sum(), batch_group)
    return loss * (1.0 / (labels.size if total is None else total))


def relayout_labels(labels: Tensor, ctx: ParallelContext, src: Layout, dst: Layout) -> Tensor:
    """Labels cut by ``src``'s batch blocks, re-cut by ``dst``'s (3D: the logits come out of a
    Linear3D in the swapped layout). A no-op when both cut the batch the same way."""
    if src.batch_axes == dst.batch_axes:
        return labels
    whole = gather_from_region(labels, src.batch_group(ctx), 0)
    group = dst.batch_group(ctx)
    return whole if group is None else chunk_of(whole, group, 0)


def cross_entropy(logits: Tensor, labels, layout: Layout | None = None) -> Tensor:
    """Mean cross-entropy over all samples of the tensor-parallel group, the same float on every
    rank. ``logits`` ``(..., classes)`` are this rank's block (class axis last) in ``layout``
    (default: the layout the classifier gave the logits, read from the tensor itself, never from
    the order the layers were built in; see :func:`~.layouts.tensor_layout`); ``labels``
    ``(...)`` are this rank's batch block as :func:`~.layouts.split_input` cuts it. Without tensor
    parallelism: ``F.nn.cross_entropy`` on the flattened logits.

    Example::

        loss = tp.cross_entropy(head(h), tp.split_input(labels))
    """
    ctx = active_context("cross_entropy")
    labels = as_tensor(labels)
    if ctx is None:
        return F.nn.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    layout = tensor_layout(logits, ctx, "cross_entropy") if layout is None else layout
    labels = relayout_labels(labels, ctx, input_layout(ctx), layout)
    start = layout.feature_index(ctx) * logits.shape[-1]
    total = int(np.prod(labels.shape)) * layout.batch_blocks(ctx)
    return vocab_parallel_cross_entropy(logits, labels, layout.feature_group(ctx), start,
                                        layout.batch_group(ctx), total)
