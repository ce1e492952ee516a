"""Region functions: every collective of tensor parallelism, as an autodiff Function.

Megatron-LM writes tensor parallelism with a handful of functions whose forward and backward are
*different* collectives; all parallel layers here are built from the same few, over the
differentiable collectives of :mod:`minigrad.distributed.comm.functional`:

=====================  ==============  ==============  =====================================
function               forward         backward        used for
=====================  ==============  ==============  =====================================
copy_to_region         identity        all-reduce      1D column input; weights replicated
                                                       over the 2.5D depth
reduce_from_region     all-reduce      identity        1D row output; vocab-parallel loss
all_reduce_region      all-reduce      all-reduce      LayerNorm statistics of split features
split_to_region        keep my chunk   all-gather      split_input; 1D row with a whole input
gather_from_region     all-gather      keep my chunk   gather_output; 1D column gather_output
all_gather_region      all-gather      reduce-scatter  3D inputs and weights; feature params
reduce_scatter_region  reduce-scatter  all-gather      3D outputs
=====================  ==============  ==============  =====================================

Why an all-reduce can have two different backwards: when the ranks go on with the result as *one*
logical value computed redundantly (Megatron's replicated activations, the loss), each rank's
incoming gradient already is the whole gradient, so backward is the identity. When each rank uses
the shared result for *its own part* (a LayerNorm mean applied to each rank's feature block), the
incoming gradients are partial and backward must sum them. The same reasoning pairs an all-gather
with "keep my chunk" or with a reduce-scatter.

SUMMA (2D/2.5D) needs broadcasts and reduces inside one matrix-product Function:
:func:`broadcast_step` and :func:`reduce_step`. Every collective is logged (see
:mod:`.collective_log`). A group of one rank costs nothing: the functions return their input.
"""

from __future__ import annotations

import minigrad.distributed.comm.functional as DF
from minigrad.autodiff import Function, no_grad
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.tensor_parallel.collective_log import record

__all__ = [
    "all_gather_region",
    "all_reduce_region",
    "broadcast_step",
    "chunk_of",
    "copy_to_region",
    "gather_from_region",
    "max_from_region",
    "reduce_from_region",
    "reduce_scatter_region",
    "reduce_step",
    "split_to_region",
]


def _nbytes(x: Tensor) -> int:
    return x.size * x.dtype.itemsize


def chunk_of(x: Tensor, group: Group, axis: int) -> Tensor:
    """This rank's chunk of ``x`` along ``axis``: chunk ``group.rank`` of ``group.size``."""
    n, i = group.size, group.rank
    if x.shape[axis] % n:
        raise ValueError(
            f"tensor parallel split: axis {axis} of shape {x.shape} is not divisible by the "
            f"{n} ranks of group {group.ranks}"
        )
    c = x.shape[axis] // n
    return x[(slice(None),) * axis + (slice(i * c, (i + 1) * c),)]


def _collective(kind: str, x: Tensor, group: Group, axis: int) -> Tensor:
    """Run one step of a region (``kind`` from the table above) and log it."""
    if kind == "identity":
        return x
    if kind == "split":
        return chunk_of(x, group, axis)
    record(kind, group, _nbytes(x))
    if kind == "all_reduce":
        return DF.all_reduce_sum(x, group)
    if kind == "all_gather":
        return DF.all_gather(x, group, axis)
    if kind == "reduce_scatter":
        return DF.reduce_scatter_sum(x, group, axis)
    raise ValueError(f"tensor parallel region: unknown step {kind!r}")


class Region(Function):
    """``forward`` collective on the way in, ``backward`` collective on the way back."""

    def forward(self, x, group, axis, forward, backward):
        self.group, self.axis, self.backward_kind = group, axis, backward
        return _collective(forward, x, group, axis)

    def backward(self, dy):
        return _collective(self.backward_kind, dy, self.group, self.axis), None, None, None, None


def _region(x: Tensor, group: Group | None, axis: int, forward: str, backward: str) -> Tensor:
    if group is None or group.size == 1:
        return x
    return Region()(x, group, axis % max(x.ndim, 1), forward, backward)


def copy_to_region(x: Tensor, group: Group) -> Tensor:
    """Identity forward; all-reduce (sum) of the gradient backward."""
    return _region(x, group, 0, "identity", "all_reduce")


def reduce_from_region(x: Tensor, group: Group) -> Tensor:
    """All-reduce (sum) forward; gradient passed through unchanged (replicated consumers)."""
    return _region(x, group, 0, "all_reduce", "identity")


def all_reduce_region(x: Tensor, group: Group) -> Tensor:
    """All-reduce (sum) forward and backward (each rank uses the sum for its own part)."""
    return _region(x, group, 0, "all_reduce", "all_reduce")


def split_to_region(x: Tensor, group: Group, axis: int = -1) -> Tensor:
    """This rank's chunk along ``axis`` forward; all-gather of the gradient backward."""
    return _region(x, group, axis, "split", "all_gather")


def gather_from_region(x: Tensor, group: Group, axis: int = -1) -> Tensor:
    """All-gather along ``axis`` forward; this rank's chunk of the gradient backward."""
    return _region(x, group, axis, "all_gather", "split")


def all_gather_region(x: Tensor, group: Group, axis: int = 0) -> Tensor:
    """All-gather along ``axis`` forward; reduce-scatter (sum) of the gradient backward."""
    return _region(x, group, axis, "all_gather", "reduce_scatter")


def reduce_scatter_region(x: Tensor, group: Group, axis: int = 0) -> Tensor:
    """Reduce-scatter (sum) along ``axis`` forward; all-gather of the gradient backward."""
    return _region(x, group, axis, "reduce_scatter", "all_gather")


def max_from_region(x: Tensor, group: Group) -> Tensor:
    """Elementwise maximum over ``group``, as a constant (no gradient): a shift that cancels out,
    like the row maximum of a softmax."""
    if group is None or group.size == 1:
        return x.detach()
    record("all_reduce", group, _nbytes(x))
    with no_grad():
        return DF.all_reduce_max(x.detach(), group)


def broadcast_step(x: Tensor | None, group: Group, index: int) -> Tensor:
    """The ``x`` of the group's ``index``-th rank, on every rank (others pass None). A step of a
    SUMMA product, for use inside a Function (no gradient of its own)."""
    root = group.ranks[index]
    with no_grad():
        y = DF.broadcast(x if group.rank == index else None, group, root)
    record("broadcast", group, _nbytes(y), is_root=group.rank == index)
    return y


def reduce_step(x: Tensor, group: Group, index: int) -> Tensor | None:
    """The sum of ``x`` over the group on its ``index``-th rank (None elsewhere). A SUMMA step."""
    record("reduce", group, _nbytes(x), is_root=group.rank == index)
    with no_grad():
        return DF.reduce_sum(x, group, group.ranks[index])
