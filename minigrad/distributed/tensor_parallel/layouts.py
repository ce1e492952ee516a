"""Activation layouts: which block of an activation each tensor-parallel rank holds.

An activation is ``(batch, ..., features)``. A :class:`Layout` cuts the batch axis into blocks by
the combined coordinate of a rank on ``batch_axes`` (row-major in topology order) and the feature
axis by its coordinate on ``feature_axis``; the activation is replicated over the remaining tensor
axes. The layouts of the modes (q = grid side, d = depth, P = tensor size):

==================  ========================  ===================  ==============================
layout              batch blocks              feature blocks       block per rank
==================  ========================  ===================  ==============================
REPLICATED          —                         —                    whole (1D between pairs)
SPLIT_1D            —                         tensor (P)           (B, K/P) (inside a 1D pair)
GRID_2D             row (q)                   col (q)              (B/q, K/q)
GRID_2P5D           dep × row (d·q)           col (q)              (B/(d·q), K/q)
CUBE_3D_A           weight × input (q²)       output (q)           (B/q², K/q)
CUBE_3D_B           weight × output (q²)      input (q)            (B/q², K/q)
==================  ========================  ===================  ==============================

Layers that change the layout (1D column/row Linear; every 3D Linear, which swaps the roles of
the input and output axes) advance the context's ``activation_layout`` as they are *built*, so a
model built in the order it runs chains by itself (Colossal-AI's convention): :func:`split_input`
cuts a batch for the first layer. :func:`reset_layout` starts the chain again for another model.

What a layer *returns* carries its layout (:func:`tag_layout`, :func:`layout_of`): every
tensor-parallel layer marks its output, so the loss and :func:`gather_output` read the layout of
the tensor they are given, whatever order the model's layers were built in (an embedding built
after the classifier, say).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.mesh.parallel_context import ParallelContext, get_parallel_context
from minigrad.distributed.tensor_parallel.regions import gather_from_region, split_to_region

__all__ = [
    "CUBE_3D_A",
    "CUBE_3D_B",
    "GRID_2D",
    "GRID_2P5D",
    "REPLICATED",
    "SPLIT_1D",
    "Layout",
    "active_context",
    "advance_layout",
    "as_tensor",
    "current_layout",
    "gather_output",
    "input_layout",
    "layout_of",
    "reset_layout",
    "split_input",
    "tag_layout",
]


@dataclass(frozen=True)
class Layout:
    """Batch blocks by the coordinate on ``batch_axes``, feature blocks by ``feature_axis``."""

    batch_axes: tuple[str, ...] = ()
    feature_axis: str | None = None
    name: str = "replicated"

    def batch_group(self, ctx: ParallelContext) -> Group | None:
        """The ranks holding the different batch blocks of my features (None: batch whole)."""
        return ctx.group_of_axes(*self.batch_axes) if self.batch_axes else None

    def feature_group(self, ctx: ParallelContext) -> Group | None:
        """The ranks holding the different feature blocks of my rows (None: features whole)."""
        return ctx.group_of_axes(self.feature_axis) if self.feature_axis else None

    def batch_blocks(self, ctx: ParallelContext) -> int:
        """How many blocks the batch is cut into."""
        return math.prod(ctx.topology.get_dim(a) for a in self.batch_axes)

    def feature_blocks(self, ctx: ParallelContext) -> int:
        """How many blocks the features are cut into."""
        return ctx.topology.get_dim(self.feature_axis) if self.feature_axis else 1

    def feature_index(self, ctx: ParallelContext) -> int:
        """Which feature block this rank holds."""
        return ctx.axis_rank(self.feature_axis) if self.feature_axis else 0

    def __repr__(self) -> str:
        return f"Layout({self.name})"


REPLICATED = Layout()
SPLIT_1D = Layout((), "tensor", "1d split features")
GRID_2D = Layout(("row",), "col", "2d grid")
GRID_2P5D = Layout(("dep", "row"), "col", "2.5d grid")
CUBE_3D_A = Layout(("weight", "input"), "output", "3d batch over input, features over output")
CUBE_3D_B = Layout(("weight", "output"), "input", "3d batch over output, features over input")

_INPUT = {"2d": GRID_2D, "2.5d": GRID_2P5D, "3d": CUBE_3D_A}


def input_layout(ctx: ParallelContext) -> Layout:
    """The layout a model of ``ctx``'s mode takes its input in."""
    return _INPUT.get(ctx.mode, REPLICATED)


def current_layout(ctx: ParallelContext) -> Layout:
    """The layout the next layer built will receive (the output of the last one built)."""
    return ctx.activation_layout or input_layout(ctx)


def advance_layout(ctx: ParallelContext, layout: Layout) -> None:
    """Record that the layer just built returns activations in ``layout``."""
    ctx.activation_layout = layout


def reset_layout() -> None:
    """Start a new model: the next layer built receives the mode's input layout again."""
    ctx = get_parallel_context(required=False)
    if ctx is not None:
        ctx.activation_layout = None


_TAGS: dict[int, tuple[weakref.ref, Layout]] = {}  # id(tensor or its array) -> (it, layout)


def _tag(obj, layout: Layout) -> None:
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _r, key=key: _TAGS.pop(key, None))
    except TypeError:  # an array type without weak references
        return
    _TAGS[key] = (ref, layout)


def tag_layout(t: Tensor, layout: Layout) -> Tensor:
    """Record that ``t`` (a layer's output) is laid out as ``layout``; returns ``t``. The array
    is tagged too, so a tensor that only re-wraps it (a hook's identity op, such as
    ``fully_shard``'s) keeps the layout."""
    _tag(t, layout)
    _tag(t.data, layout)
    return t


def layout_of(t) -> Layout | None:
    """The layout a tensor-parallel layer gave ``t`` (or the array it holds), None for any other
    tensor."""
    for obj in (t, getattr(t, "data", None)):
        entry = _TAGS.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
    return None


def tensor_layout(t: Tensor, ctx: ParallelContext, op: str) -> Layout:
    """The layout of ``t``: its tag, else the only one a tensor of ``ctx``'s mode can have when
    no tensor-parallel layer made it — whole in 1D (split tensors come from split layers), the
    grid in 2D and 2.5D; in 3D two layouts are possible, so ``layout=`` must say which."""
    layout = layout_of(t)
    if layout is not None:
        return layout
    if ctx.mode == "1d":
        return REPLICATED
    if ctx.mode in ("2d", "2.5d"):
        return input_layout(ctx)
    raise ValueError(
        f"tp.{op}: the tensor of shape {tuple(t.shape)} was not returned by a tensor-parallel "
        f"layer, so its 3D layout is unknown; pass layout=tp.CUBE_3D_A or tp.CUBE_3D_B"
    )


def active_context(op: str) -> ParallelContext | None:
    """The parallel context when tensor parallelism is on (mode 1d/2d/2.5d/3d), else None."""
    ctx = get_parallel_context(required=False)
    if ctx is None or ctx.mode is None:
        return None
    if ctx.mode == "sequence":
        raise ValueError(
            f"tp.{op}: tensor mode 'sequence' splits the sequence, not the batch or features; use "
            "minigrad.distributed.sequence_parallel"
        )
    return ctx


def as_tensor(t) -> Tensor:
    """``t`` as a Tensor (arrays are wrapped, keeping their dtype)."""
    return t if isinstance(t, Tensor) else Tensor(np.asarray(t))


def split_input(t, layout: Layout | None = None) -> Tensor:
    """This rank's block of a whole activation ``(batch, ..., features)`` or, for an integer
    tensor (labels, token ids), of its batch axis only; ``layout`` defaults to the mode's input
    layout. Without tensor parallelism ``t`` is returned as it is. The gradient of the block
    flows back to the whole tensor on every rank.

    Example::

        x = tp.split_input(batch)            # 2D, q = 2: rows of grid row i, features of column j
    """
    ctx = active_context("split_input")
    t = as_tensor(t)
    if ctx is None:
        return t
    layout = input_layout(ctx) if layout is None else layout
    out = split_to_region(t, layout.batch_group(ctx), 0)
    if t.dtype.kind == "f":
        out = split_to_region(out, layout.feature_group(ctx), -1)
    return out


def gather_output(t, layout: Layout | None = None) -> Tensor:
    """The whole tensor from this rank's block (the inverse of :func:`split_input`), on every
    rank; ``layout`` defaults to the layout of ``t`` (see :func:`layout_of`), else that of the
    output of the last layer built.

    Example::

        y = tp.gather_output(model(tp.split_input(x)))   # equals the single-device model(x)
    """
    ctx = active_context("gather_output")
    t = as_tensor(t)
    if ctx is None:
        return t
    if layout is None:
        layout = layout_of(t) or current_layout(ctx)
    if t.dtype.kind == "f":
        t = gather_from_region(t, layout.feature_group(ctx), -1)
    return gather_from_region(t, layout.batch_group(ctx), 0)
