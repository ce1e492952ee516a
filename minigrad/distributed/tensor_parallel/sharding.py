"""How a parallel layer's parameters are cut from full tensors, and put back together.

A tensor-parallel layer builds its single-device twin (``M.Linear``, ``M.LayerNorm`` ...) from the
current seed and keeps only this rank's block of each tensor (:meth:`ParallelModule.adopt`), so a
parallel model starts exactly where the single-device one does. A :class:`ShardSpec` says which
block: dimension ``d`` of the full tensor is cut into blocks by the rank's combined coordinate on
the topology axes ``splits[d]`` (row-major); a dimension with no axes is kept whole, and the tensor
is replicated over the tensor axes no dimension uses.

The same specs turn local tensors back into full ones: :meth:`ParallelModule.state_to_logical`
gathers every shard so that ``state_dict()`` holds the full tensors with the single-device keys
and layouts on every rank, and :meth:`ParallelModule.state_from_logical` cuts full tensors on
load, whatever the tensor size or mode they were saved with. :func:`full_grads` reassembles
gradients the same way.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.mesh.parallel_context import ParallelContext, get_parallel_context
from minigrad.distributed.tensor_parallel.layouts import tag_layout
from minigrad.module import Module

__all__ = ["ParallelModule", "ShardSpec", "full_grads"]


@dataclass(frozen=True)
class ShardSpec:
    """The block of a tensor of ``full_shape`` a rank keeps: dimension ``d`` cut by the rank's
    coordinate on the axes ``splits[d]`` (major first). With ``chunks > 1`` dimension 0 is made
    of that many equal chunks cut one by one (a fused query/key/value projection: each rank keeps
    its block of every chunk, hence whole heads of each)."""

    full_shape: tuple[int, ...]
    splits: tuple[tuple[str, ...], ...]
    chunks: int = 1

    def check(self, ctx: ParallelContext, what: str) -> None:
        """Raise when a dimension does not split evenly (``what`` names the layer and tensor)."""
        for d, axes in enumerate(self.splits):
            n = math.prod(ctx.topology.get_dim(a) for a in axes) * (self.chunks if d == 0 else 1)
            if self.full_shape[d] % n:
                parts = " × ".join(f"{ctx.topology.get_dim(a)} ({a})" for a in axes)
                if d == 0 and self.chunks > 1:
                    parts += f" × {self.chunks} chunks"
                raise ValueError(
                    f"{what}: dimension {d} of shape {self.full_shape} is not divisible by "
                    f"{n} = {parts}"
                )

    def indices(self, coord, ctx: ParallelContext) -> tuple[np.ndarray, ...]:
        """The indices into each dimension of the block at topology coordinates ``coord``."""
        out = []
        for d, axes in enumerate(self.splits):
            length = self.full_shape[d]
            n, index = 1, 0
            for a in axes:
                dim = ctx.topology.get_dim(a)
                n, index = n * dim, index * dim + getattr(coord, a)
            chunks = self.chunks if d == 0 else 1
            chunk = length // chunks
            block = chunk // n
            out.append(np.concatenate([
                np.arange(k * chunk + index * block, k * chunk + (index + 1) * block)
                for k in range(chunks)
            ]))
        return tuple(out)

    def local(self, full: np.ndarray, ctx: ParallelContext) -> np.ndarray:
        """This rank's block of ``full``."""
        return np.ascontiguousarray(full[np.ix_(*self.indices(ctx.coord, ctx))])

    def gather(self, local: np.ndarray, ctx: ParallelContext) -> np.ndarray:
        """The full tensor from every tensor-parallel rank's block (collective over ``tensor``)."""
        group = ctx.group("tensor")
        parts = comm.all_gather(np.ascontiguousarray(local), group) if group.size > 1 else [local]
        out = np.empty(self.full_shape, local.dtype)
        for rank, part in zip(group.ranks, parts):
            out[np.ix_(*self.indices(ctx.topology.get_coord(rank), ctx))] = part
        return out


class ParallelModule(Module):
    """Base of the tensor-parallel layers: parameters are blocks of full (logical) tensors.

    ``mode`` (class attribute) is the tensor mode the layer implements; it must match the
    context's. ``shard_specs`` maps own tensor names to their :class:`ShardSpec` (tensors not in
    it are replicated and kept whole).
    """

    mode: str | None = None

    def __init__(self, ctx: ParallelContext | None = None):
        super().__init__()
        self.ctx = get_parallel_context() if ctx is None else ctx
        if self.mode is not None and self.ctx.mode != self.mode:
            raise ValueError(
                f"{type(self).__name__} needs tensor mode {self.mode!r}, but the parallel context "
                f"has mode {self.ctx.mode!r}"
            )
        self.shard_specs: dict[str, ShardSpec] = {}

    def __call__(self, *args, **kwargs):
        """Run the layer and mark a tensor output with the layer's ``output_layout`` (what
        ``tp.cross_entropy`` and ``tp.gather_output`` read)."""
        out = super().__call__(*args, **kwargs)
        layout = getattr(self, "output_layout", None)
        if layout is not None and isinstance(out, Tensor):
            tag_layout(out, layout)
        return out

    def adopt(self, twin: Module, specs: dict[str, ShardSpec], names=("weight", "bias")) -> None:
        """Keep this rank's block of each tensor ``names`` of ``twin`` (the single-device layer,
        built from the same seed): replicated tensors whole, the others cut by ``specs``."""
        for name in names:
            t = getattr(twin, name, None)
            if t is None:
                setattr(self, name, None)
                continue
            spec = specs.get(name)
            value = t.numpy()
            if spec is not None:
                spec.check(self.ctx, f"{type(self).__name__} {name}")
                value = spec.local(value, self.ctx)
                self.shard_specs[name] = spec
            cls = Parameter if isinstance(t, Parameter) else Tensor
            setattr(self, name, cls(value, device=t.device))

    def check_features(self, x: Tensor, expected: int) -> None:
        """Raise unless the last axis of ``x`` has this rank's ``expected`` features."""
        if x.ndim < 1 or x.shape[-1] != expected:
            raise ValueError(
                f"{self!r}: expected input of shape (..., {expected}) on this rank, got "
                f"{tuple(x.shape)} (split whole activations with tp.split_input)"
            )

    def check_ids(self, ids, num: int) -> Tensor:
        """``ids`` as an integer Tensor with every id in ``[0, num)`` (else a clear error)."""
        if not isinstance(ids, Tensor):
            ids = Tensor(np.asarray(ids), device=self.weight.device)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"{self!r}: ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.size:
            lo, hi = int(ids.data.min()), int(ids.data.max())
            if lo < 0 or hi >= num:
                raise IndexError(f"{self!r}: ids must be in [0, {num}), got min {lo} max {hi}")
        return ids

    def state_to_logical(self, state: dict, prefix: str) -> None:
        """Gather every sharded entry into the full tensor (collective over the tensor group)."""
        for name, spec in self.shard_specs.items():
            key = prefix + name
            if key in state:
                state[key] = spec.gather(np.asarray(state[key]), self.ctx)

    def state_from_logical(self, state: dict, prefix: str) -> None:
        """Cut every full entry down to this rank's block."""
        for name, spec in self.shard_specs.items():
            key = prefix + name
            if key not in state:
                continue
            value = state[key]
            value = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(value.shape) != spec.full_shape:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: {key!r} has shape "
                    f"{tuple(value.shape)}, expected the full shape {spec.full_shape}"
                )
            state[key] = spec.local(value, self.ctx)


def full_grads(model: Module) -> "OrderedDict[str, np.ndarray]":
    """``name -> full gradient`` of every parameter with a gradient, with the keys and layouts of
    ``state_dict()`` (collective over the tensor group, like ``state_dict``)."""
    grads = OrderedDict(
        (name, p.grad.numpy()) for name, p in model.named_parameters() if p.grad is not None
    )
    for prefix, module in model.named_modules():
        module.state_to_logical(grads, prefix + "." if prefix else "")
    return grads
