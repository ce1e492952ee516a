"""``compare_layouts``: is my parallel run computing the same thing as one device?

It trains the user's model for a few steps on one device and on each parallel *layout* (data,
tensor, pipeline, sequence parallelism, alone or data × tensor), starting the ranks itself on the
CPU (:func:`minigrad.testing.distributed.run_workers`), and compares, step by step, every
module's forward output, every module's input gradient, the loss, every parameter gradient and
every parameter after the optimizer step, each gathered to its logical (single-device) shape. The
report names, per layout, the *first* tensor whose difference exceeds the tolerance: its module
path, forward or backward, the module's class (the op) and the step.

Example::

    from minigrad.testing import compare_layouts

    def build_model(ctx):                  # ctx: LayoutContext (layout, ranks, dtype, groups)
        return M.Sequential(tp.Linear(8, 32), M.GELU(), tp.Linear(32, 8))

    def make_batches():                    # the global batches: (inputs..., target)
        rng = np.random.default_rng(0)
        return [(rng.standard_normal((8, 8)), rng.standard_normal((8, 8))) for _ in range(3)]

    report = compare_layouts(build_model, make_batches, steps=3, dtype="float64",
                             layouts=[dict(data=2), dict(tensor=2, mode="1d"),
                                      dict(pipeline=2, micro_batches=4)])
    print(report)            # one table row per layout and step, then the first divergences
    report.plot("diff.png")  # max difference per step per layout

Command line: ``python -m minigrad.testing.compare_layouts my_train.py --layouts data=2
tensor=2,mode=1d pipeline=2,micro_batches=4`` (``my_train.py`` defines ``build_model`` and
``make_batches``, optionally ``loss_fn`` and ``optimizer``).

**The contract.** ``build_model(ctx)`` (or ``build_model()``) is called on every rank after the
layout's process groups exist (``dist.init_parallel`` for tensor and sequence layouts, so
Colossal-AI-style layers such as ``tp.Linear`` read the global context), with minigrad's random
generators seeded alike, and returns the model (or ``(model, optimizer)``). It must build the
same model whatever the layout: the tool applies the layout itself — ``DistributedDataParallel``
over the data group, ``PipelineModule``/``PipelineEngine`` over an ``M.Sequential`` (or list of
layers), the batch split along axis 0 (data) or axis 1 (sequence, with ``make_allreduce_cb("mean")``
over the sequence × data group) — except for what only the model can do: tensor-parallel layers
(``tp.Linear`` ...: single-device layers when there is no tensor parallelism) and
sequence-parallel attention. ``make_batches()`` returns at least ``steps`` global batches, each a
tuple ``(inputs..., target)`` of arrays; ``loss_fn(output, target)`` (default
``F.nn.square_loss``) must be a *mean* over samples (and tokens); ``optimizer(params)`` builds the
optimizer (default SGD, lr 0.1). With ``dtype`` the floating parameters are cast after building.

**Gathering to logical shape.** Parameters and gradients go through the modules'
``state_to_logical`` hooks (tensor-parallel shards become full tensors, as in ``state_dict``);
with a pipeline each parameter comes from the stage that owns it. An activation (or its gradient)
of a rank is compared as follows: calls of a module in several micro-batches (or deterministic
blocks) are concatenated along axis 0; the pieces of the ranks sharing one data-parallel index
are kept whole when they have the expected shape (replicated) and concatenated in rank order
along the one axis where their shape differs (tensor-parallel feature splits, sequence splits);
the data-parallel pieces are concatenated along axis 0. Activation gradients of a layout that
splits the batch or the sequence are gradients of a rank's *local* mean loss and are divided by
the number of pieces. Tensors that cannot be reassembled this way are listed as skipped.

**Tolerance.** A difference is the max absolute difference divided by the larger max absolute
value of the two tensors (relative to the tensor's scale). Reordered float sums of ``n`` terms
differ by at most about ``n·eps`` relative to the sum of the magnitudes, and the longest sums of a
step are the weight gradients (``rows`` batch rows x sequence positions) and the matmuls (inner
dimension at most the largest parameter dimension ``width``), so the tolerance is
``4 · eps(dtype) · rows · width · (step + 1)`` (the last factor: rounding differences carried
through the updates), ``eps`` = 2.2e-16 for float64, 1.2e-7 for float32. ``rtol=`` overrides it.
In float64 it is around 1e-12 and real bugs (differences of order 1) stand out; in float32 it is
the order of the noise users see.

**Layout kinds** are pluggable: :data:`LAYOUT_KINDS` maps each key of a layout dict to a
:class:`LayoutKind` (a parent-side check, a ``configure`` step before the model is built, a
``wrap`` step after); :func:`register_layout_kind` adds or replaces one. ``zero`` (with ``data``)
shards the data-parallel ranks' model state: ``zero=1`` keeps DDP and replaces the optimizer by a
``ZeroRedundancyOptimizer`` of its class and param groups; ``zero=2``/``3`` call ``fully_shard``
on each direct sub-module that holds parameters and then on the model (``reshard_after_forward``
False / True), build the optimizer again on the pieces, and gather parameters and gradients to
their full shapes for the comparison (``full_state_dict``, ``full_gradients``).

Deterministic data parallelism: inside ``deterministic_reductions(num_blocks)``
(:mod:`minigrad.distributed.data_parallel.deterministic`) one device and the data layouts train
with :class:`~minigrad.distributed.data_parallel.deterministic.BlockGradients` and agree to the
bit.
"""

from __future__ import annotations

import argparse
import inspect
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.autodiff.function import Function
from minigrad.autodiff.grad_manager import GradManager
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.rng import seed as seed_generators
from minigrad.backend.xp import to_numpy
from minigrad.distributed.comm.group import WORLD, get_rank, get_world_size
from minigrad.distributed.data_parallel.ddp import DistributedDataParallel
from minigrad.distributed.data_parallel.deterministic import BlockGradients, current_blocks
from minigrad.distributed.data_parallel.fully_shard import (
    full_gradients,
    full_state_dict,
    fully_shard,
)
from minigrad.distributed.data_parallel.helper import make_allreduce_cb
from minigrad.distributed.data_parallel.zero import ZeroRedundancyOptimizer
from minigrad.distributed.mesh.parallel_context import ParallelContext, init_parallel
from minigrad.distributed.pipeline.engine import PipelineEngine
from minigrad.distributed.pipeline.module import PipelineModule
from minigrad.distributed.runtime.launcher import LaunchError
from minigrad.distributed.sequence_parallel.sharding import split_sequence
from minigrad.distributed.tensor_parallel.layouts import reset_layout
from minigrad.testing.distributed import run_workers

__all__ = [
    "LAYOUT_KINDS",
    "Divergence",
    "LayoutContext",
    "LayoutKind",
    "LayoutNotAvailable",
    "LayoutReport",
    "LayoutResult",
    "compare_layouts",
    "main",
    "register_layout_kind",
]

#: The keys a layout dict may hold besides the kinds: options of a kind.
OPTIONS = {"mode": "tensor", "micro_batches": "pipeline"}
KINDS_IN_ORDER = ("data", "zero", "tensor", "sequence", "pipeline")
#: The order records are compared in within a step (the order the run produces them).
STAGES = ("forward", "loss", "backward", "grad", "param")


class LayoutNotAvailable(RuntimeError):
    """A layout kind this build of minigrad cannot apply (a ``check`` of a registered kind
    raises it, and the report shows the layout with that error)."""


@dataclass
class LayoutContext:
    """What ``build_model(ctx)`` receives: the layout and where this rank sits in it.

    ``parallel`` is the ``dist.init_parallel`` context of tensor and sequence layouts (None
    otherwise); ``dtype`` the dtype the model will be cast to."""

    layout: dict
    rank: int = 0
    world_size: int = 1
    dtype: str | None = None
    data: int = 1
    tensor: int = 1
    mode: str | None = None
    sequence: int = 1
    pipeline: int = 1
    micro_batches: int = 1
    zero: int = 0
    parallel: ParallelContext | None = None


@dataclass
class LayoutKind:
    """How one key of a layout is applied. ``check(layout)`` runs in the calling process before
    any rank starts (raise to refuse the layout); ``configure(run)`` on every rank before the
    model is built (add to ``run.parallel``, the ``init_parallel`` dict; set batch splits);
    ``wrap(run)`` after it (wrap ``run.module``, replace ``run.step``)."""

    check: Callable[[dict], None]
    configure: Callable[["_Run"], None]
    wrap: Callable[["_Run"], None]


def _nothing(*args) -> None:
    """A LayoutKind step that has nothing to do."""


# -- the layout kinds --------------------------------------------------------------------------

def _check_data(layout: dict) -> None:
    others = set(layout) & {"pipeline"}
    if others:
        raise ValueError(f"compare_layouts: data with {sorted(others)} is not supported; give "
                         f"them as separate layouts")


def _configure_data(run: "_Run") -> None:
    run.splits.append(("data", 0))


def _wrap_data(run: "_Run") -> None:
    if run.blocks:
        return  # deterministic mode: BlockGradients reduces over the data group
    if run.ctx.zero >= 2:
        return  # fully_shard reduce-scatters the gradients itself
    group = run.group("data")
    if group.size > 1:
        run.module = DistributedDataParallel(run.module, group=group)


def _check_zero(layout: dict) -> None:
    stage = layout["zero"]
    if stage not in (1, 2, 3):
        raise ValueError(f"compare_layouts: zero must be 1, 2 or 3, got {stage} in {layout}")
    if "data" not in layout:
        raise ValueError(f"compare_layouts: zero shards over the data-parallel ranks; give data "
                         f"with it, e.g. dict(data=2, zero={stage}), got {layout}")
    others = set(layout) & {"tensor", "sequence", "pipeline"}
    if others:
        raise ValueError(f"compare_layouts: zero with {sorted(others)} is not supported; give "
                         "them as separate layouts")


def _rebuilt_optimizer(optimizer, params_of: Callable, wrapper=None, **extra):
    """An optimizer of ``optimizer``'s class and param groups over ``params_of(group params)``
    (hyper-parameters taken from the groups), or a ``wrapper`` of that class (ZeRO-1)."""
    cls = type(optimizer)
    groups = [dict(g, params=params_of(g["params"])) for g in optimizer.param_groups]
    accepted = inspect.signature(cls).parameters
    first = {k: v for k, v in groups[0].items() if k != "params" and k in accepted}
    if wrapper is not None:
        return wrapper(groups, optimizer_class=cls, **extra, **first)
    return cls(groups, **first)


def _wrap_zero(run: "_Run") -> None:
    """zero=1: ``ZeroRedundancyOptimizer`` over DDP's averaged gradients; zero=2/3:
    ``fully_shard`` on each direct sub-module holding parameters, then on the model
    (``reshard_after_forward`` False for 2, True for 3), and the optimizer rebuilt on the
    pieces. Parameters and gradients are gathered to full shape for the comparison
    (``full_state_dict`` and ``full_gradients``, collectives of the data group)."""
    group = run.group("data")
    stage = run.ctx.zero
    if stage == 1:
        run.optimizer = _rebuilt_optimizer(run.optimizer, list, ZeroRedundancyOptimizer,
                                           group=group)
        return
    names = {id(p): n for n, p in run.named_params.items()}
    for child in run.model.children():  # each wrapped sub-module gathers only its own
        if any(True for _ in child.parameters()):
            fully_shard(child, reshard_after_forward=stage == 3, group=group)
    fully_shard(run.model, reshard_after_forward=stage == 3, group=group)
    run.named_params = dict(run.model.named_parameters())
    run.owned = {id(p) for p in run.named_params.values()}
    run.optimizer = _rebuilt_optimizer(
        run.optimizer, lambda ps: [run.named_params[names[id(p)]] for p in ps])
    run.sharded = run.model


def _check_tensor(layout: dict) -> None:
    if "sequence" in layout or "pipeline" in layout:
        raise ValueError("compare_layouts: tensor with sequence or pipeline is not supported; "
                         "give them as separate layouts")


def _configure_tensor(run: "_Run") -> None:
    run.parallel["tensor"] = dict(size=run.ctx.tensor, mode=run.ctx.mode or "1d")


def _configure_sequence(run: "_Run") -> None:
    run.parallel["tensor"] = dict(size=run.ctx.sequence, mode="sequence")
    run.splits.append(("sequence", 1))


def _wrap_sequence(run: "_Run") -> None:
    group = run.group("sequence_dp")
    if run.ctx.data > 1:  # DDP of the data kind would reduce over the data group only
        raise ValueError("compare_layouts: sequence with data is not supported")
    run.callbacks.append(make_allreduce_cb("mean", group=group))


def _check_pipeline(layout: dict) -> None:
    if layout.get("micro_batches", 1) < 1:
        raise ValueError(f"compare_layouts: micro_batches must be >= 1, got {layout}")


def _wrap_pipeline(run: "_Run") -> None:
    model = run.model
    layers = model if isinstance(model, (list, tuple, M.Sequential)) else None
    if layers is None:
        raise TypeError(
            f"compare_layouts: a pipeline layout needs build_model to return an M.Sequential (or "
            f"a list of layers), got {type(model).__name__}")
    net = PipelineModule(layers, num_stages=run.ctx.pipeline, loss_fn=run.loss_fn,
                         partition_method="uniform")
    run.owned = {id(p) for p in net.parameters()}
    run.optimizer = run.make_optimizer([p for p in run.named_params.values()
                                        if id(p) in run.owned])
    run.recorder.watch_optimizer(run)
    engine = PipelineEngine(net, run.optimizer, micro_batches=run.ctx.micro_batches)
    micro = run.ctx.micro_batches
    run.chunks = micro

    def step(batch):
        inputs, target = batch[:-1], batch[-1]
        rows = len(target) // micro
        items = [(tuple(a[m * rows:(m + 1) * rows] for a in inputs) if len(inputs) > 1
                  else inputs[0][m * rows:(m + 1) * rows], target[m * rows:(m + 1) * rows])
                 for m in range(micro)]
        return float(engine.train_batch(iter(items)))

    run.step = step
    run.act_grad_scale = 1.0


#: layout key -> how it is applied (see :class:`LayoutKind`); ``register_layout_kind`` adds one.
LAYOUT_KINDS: dict[str, LayoutKind] = {
    "data": LayoutKind(_check_data, _configure_data, _wrap_data),
    "zero": LayoutKind(_check_zero, _nothing, _wrap_zero),
    "tensor": LayoutKind(_check_tensor, _configure_tensor, _nothing),
    "sequence": LayoutKind(_nothing, _configure_sequence, _wrap_sequence),
    "pipeline": LayoutKind(_check_pipeline, _nothing, _wrap_pipeline),
}


def register_layout_kind(name: str, kind: LayoutKind) -> None:
    """Add or replace the layout kind ``name`` (its ``wrap`` may replace ``run.module`` and
    ``run.optimizer``, as ``zero``'s does)."""
    if not isinstance(kind, LayoutKind):
        raise TypeError(f"register_layout_kind: expected a LayoutKind, got {type(kind).__name__}")
    LAYOUT_KINDS[name] = kind


def _normalize(layout: dict) -> dict:
    """Validate a layout dict; return it with every size an int."""
    if not isinstance(layout, dict):
        raise TypeError(f"compare_layouts: a layout is a dict such as dict(data=2), got {layout!r}")
    out = {}
    for key, value in layout.items():
        if key == "mode":
            out[key] = str(value)
        elif key in LAYOUT_KINDS or key in OPTIONS:
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"compare_layouts: {key} must be a non-negative int, got "
                                 f"{value!r} in {layout}")
            out[key] = int(value)
        else:
            raise ValueError(f"compare_layouts: unknown layout key {key!r} in {layout}; known: "
                             f"{sorted([*LAYOUT_KINDS, *OPTIONS])}")
    for option, kind in OPTIONS.items():
        if option in out and kind not in out:
            raise ValueError(f"compare_layouts: {option!r} needs {kind!r} in {layout}")
    return out


def layout_name(layout: dict) -> str:
    """``data=2,zero=3``; ``one device`` for ``{}``."""
    return ",".join(f"{k}={v}" for k, v in layout.items()) or "one device"


def _world(layout: dict) -> int:
    sizes = [layout.get(k, 1) for k in ("data", "tensor", "sequence", "pipeline")]
    return int(np.prod([max(s, 1) for s in sizes]))


# -- recording on each rank --------------------------------------------------------------------

class _Tap(Function):
    """Identity whose backward hands the gradient to ``sink`` (an input gradient of a module)."""

    def __init__(self, sink):
        self.sink = sink

    def forward(self, x):
        return x.data

    def backward(self, dy):
        self.sink(np.array(to_numpy(dy.data if isinstance(dy, Tensor) else dy)))
        return dy


class _Recorder:
    """Forward outputs and input gradients of every module, per step, in call order."""

    def __init__(self, model: M.Module):
        self.step = 0
        self.records: dict[tuple, list] = {}
        self.order: list[tuple] = []
        self.ops: dict[str, str] = {}
        self.grads: dict[tuple, np.ndarray] = {}
        self.params: dict[tuple, np.ndarray] = {}
        for path, module in model.named_modules():
            path = path or "<model>"
            self.ops[path] = type(module).__name__
            module.register_forward_pre_hook(self._pre_hook(path))
            module.register_forward_hook(self._post_hook(path))

    def _add(self, key: tuple, value: np.ndarray) -> None:
        if key not in self.records:
            self.records[key] = []
            self.order.append(key)
        self.records[key].append(value)

    def _pre_hook(self, path: str):
        def hook(module, inputs):
            out = []
            for i, x in enumerate(inputs):
                if isinstance(x, Tensor) and x.dtype.kind == "f":
                    name = path if i == 0 else f"{path}#{i}"
                    x = _Tap(lambda g, n=name: self._add((self.step, "backward", n), g))(x)
                out.append(x)
            return tuple(out)
        return hook

    def _post_hook(self, path: str):
        def hook(module, inputs, output):
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for i, y in enumerate(outs):
                if isinstance(y, Tensor) and y.dtype.kind == "f":
                    name = path if i == 0 else f"{path}#{i}"
                    self._add((self.step, "forward", name), np.array(to_numpy(y.data)))
        return hook

    def watch_optimizer(self, run: "_Run") -> None:
        """Record the logical gradients before, and the parameters after, each optimizer step."""
        opt = run.optimizer
        step = opt.step

        def recording_step(*args, **kwargs):
            owned = [(n, p) for n, p in run.named_params.items() if id(p) in run.owned]
            if run.sharded is not None:  # fully_shard pieces: gathered (collectives)
                grads = full_gradients(run.sharded)
            else:
                grads = {n: np.array(to_numpy(p.grad.data)) for n, p in owned
                         if p.grad is not None}
            for n, g in run.logical(grads).items():
                self.grads[(self.step, n)] = g
            result = step(*args, **kwargs)
            if run.sharded is not None:
                full = full_state_dict(run.sharded)
                values = {n: full[n] for n, _ in owned}
            else:
                values = {n: np.array(to_numpy(p.data)) for n, p in owned}
            for n, v in run.logical(values).items():
                self.params[(self.step, n)] = v
            return result

        opt.step = recording_step


# -- one rank's run ----------------------------------------------------------------------------

@dataclass
class _Job:
    build_model: Callable
    make_batches: Callable
    loss_fn: Callable
    make_optimizer: Callable
    layout: dict
    steps: int
    dtype: str | None
    seed: int
    blocks: int | None


@dataclass
class _Run:
    """A rank's state while its layout is applied and trained (what LayoutKind steps edit)."""

    ctx: LayoutContext
    loss_fn: Callable
    make_optimizer: Callable
    blocks: int | None
    parallel: dict = field(default_factory=dict)
    splits: list = field(default_factory=list)  # (group name, axis) the batch is cut along
    callbacks: list = field(default_factory=list)
    model: Any = None
    module: Any = None
    optimizer: Any = None
    named_params: dict = field(default_factory=dict)
    owned: set = field(default_factory=set)
    recorder: Any = None
    step: Callable | None = None
    chunks: int = 1
    act_grad_scale: float = 1.0
    sharded: Any = None  # the model, once fully_shard replaced its parameters by pieces

    def group(self, name: str):
        """The context's group ``name`` (WORLD without a parallel context)."""
        return self.ctx.parallel.group(name) if self.ctx.parallel is not None else WORLD

    def index(self, name: str) -> tuple[int, int]:
        """``(index, size)`` of this rank in the group ``name``."""
        group = self.group(name)
        return max(group.rank, 0), group.size

    def logical(self, values: dict) -> dict:
        """``values`` (parameter name -> local array) with shards replaced by full tensors."""
        values = dict(values)
        for prefix, module in self.model.named_modules():
            module.state_to_logical(values, prefix + "." if prefix else "")
        return values

    def local(self, batch: tuple) -> list:
        """This rank's piece of a global batch: cut along axis 0 over the data group and along
        axis 1 over the sequence group."""
        out = []
        for a in batch:
            a = np.asarray(a)
            for name, axis in self.splits:
                if name == "sequence":
                    if a.ndim > 1:
                        a = split_sequence(a, axis=axis, group=self.group("sequence"))
                    continue
                i, n = self.index(name)
                rows = a.shape[axis] // n
                a = a[i * rows:(i + 1) * rows]
            out.append(a)
        return out


def _cast(model: M.Module, dtype: str) -> None:
    """Replace every floating parameter and buffer attribute by a ``dtype`` copy."""
    for module in model.modules():
        for key, value in list(vars(module).items()):
            if isinstance(value, Tensor) and value.dtype.kind == "f" and value.dtype != dtype:
                cls = Parameter if isinstance(value, Parameter) else Tensor
                setattr(module, key, cls(value.numpy().astype(dtype), device=value.device))


def _standard_step(run: _Run):
    gm = GradManager().attach(list(run.named_params.values()), callbacks=run.callbacks or None)
    pieces = int(np.prod([run.index(name)[1] for name, _ in run.splits])) if run.splits else 1
    run.act_grad_scale = 1.0 / pieces
    acc = None
    if run.blocks:
        if run.ctx.tensor > 1 or run.ctx.sequence > 1:
            raise ValueError("compare_layouts: deterministic_reductions covers one device and "
                             "data layouts only (tensor and sequence split sums inside a sample)")
        acc = BlockGradients(list(run.named_params.values()), run.blocks, group=run.group("data"))
        index, size = run.index("data")
        if run.blocks % size:
            raise ValueError(f"compare_layouts: {run.blocks} deterministic blocks do not divide "
                             f"over {size} data-parallel ranks")
        run.chunks = run.blocks // size
        run.act_grad_scale = 1.0

    def step(batch):
        local = run.local(batch)
        inputs = [a if isinstance(a, Tensor) else Tensor(a) for a in local[:-1]]
        target = local[-1]
        if acc is not None:
            index, size = run.index("data")
            per_rank = run.blocks // size
            acc.backward(lambda *a: run.loss_fn(run.module(*a[:-1]), a[-1]), *inputs, target,
                         first_block=index * per_rank, block_size=len(target) // per_rank)
            loss = acc.reduce()
        else:
            with gm:
                loss = run.loss_fn(run.module(*inputs), target)
                gm.backward(loss)
            loss = float(loss.numpy())
        run.optimizer.step()
        run.optimizer.clear_grad()
        return loss

    return step


def _worker(job: _Job) -> dict:
    layout = job.layout
    ctx = LayoutContext(
        layout=dict(layout), rank=get_rank(), world_size=get_world_size(), dtype=job.dtype,
        data=max(layout.get("data", 1), 1), tensor=max(layout.get("tensor", 1), 1),
        mode=layout.get("mode"), sequence=max(layout.get("sequence", 1), 1),
        pipeline=max(layout.get("pipeline", 1), 1),
        micro_batches=layout.get("micro_batches", 1), zero=layout.get("zero", 0))
    run = _Run(ctx, job.loss_fn, job.make_optimizer, job.blocks)
    kinds = [k for k in KINDS_IN_ORDER if k in layout] + [
        k for k in layout if k in LAYOUT_KINDS and k not in KINDS_IN_ORDER]
    for kind in kinds:
        LAYOUT_KINDS[kind].configure(run)
    if run.parallel:
        ctx.parallel = init_parallel(run.parallel)
    reset_layout()
    seed_generators(job.seed)
    np.random.seed(job.seed)
    built = job.build_model(ctx) if _takes_argument(job.build_model) else job.build_model()
    model, optimizer = built if isinstance(built, tuple) else (built, None)
    if job.dtype is not None:
        if optimizer is not None and any(p.dtype != job.dtype for p in model.parameters()):
            raise ValueError(
                f"compare_layouts: build_model returned an optimizer but parameters that are not "
                f"{job.dtype}; build them in ctx.dtype, or pass optimizer=<factory> instead")
        _cast(model, job.dtype)
    run.model = run.module = model
    run.named_params = dict(model.named_parameters())
    run.owned = {id(p) for p in run.named_params.values()}
    run.recorder = _Recorder(model)
    run.optimizer = optimizer or job.make_optimizer(list(run.named_params.values()))
    for kind in kinds:
        LAYOUT_KINDS[kind].wrap(run)
    if run.step is None:  # no kind drives the step itself (the pipeline engine does)
        run.step = _standard_step(run)
    if "pipeline" not in layout:
        run.recorder.watch_optimizer(run)
    batches = list(job.make_batches())
    if len(batches) < job.steps:
        raise ValueError(f"compare_layouts: make_batches gave {len(batches)} batches, "
                         f"{job.steps} steps need as many")
    losses = []
    for step in range(job.steps):
        run.recorder.step = step
        losses.append(run.step(tuple(np.asarray(a) for a in batches[step])))
    rec = run.recorder
    return dict(records=rec.records, order=rec.order, ops=rec.ops, grads=rec.grads,
                params=rec.params, losses=losses, chunks=run.chunks,
                data_index=run.index("data")[0] if "data" in layout else 0,
                act_grad_scale=run.act_grad_scale,
                param_shapes={n: p.shape for n, p in run.named_params.items()})


def _takes_argument(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


# -- merging the ranks' records into logical tensors ---------------------------------------------

def _calls(entries: list, chunks: int) -> list:
    """Entries of ``chunks`` micro-batches (or blocks), ``k`` calls each, as ``k`` tensors
    concatenated along axis 0 over the chunks."""
    if chunks <= 1 or len(entries) % chunks:
        return list(entries)
    k = len(entries) // chunks
    out = []
    for j in range(k):
        parts = [entries[m * k + j] for m in range(chunks)]
        out.append(np.concatenate(parts, 0) if parts[0].ndim else parts[0])
    return out


def _join(parts: list, target: tuple):
    """The pieces of replicated or split ranks as one tensor of shape ``target`` (or None)."""
    if all(p.shape == target for p in parts):
        return parts[0]
    shape = parts[0].shape
    if any(p.shape != shape for p in parts) or len(shape) != len(target):
        return None
    axes = [a for a in range(len(shape)) if shape[a] != target[a]]
    if len(axes) == 1 and shape[axes[0]] * len(parts) == target[axes[0]]:
        return np.concatenate(parts, axes[0])
    return None


def _merge_records(results: list, baseline: dict, layout: dict) -> tuple[dict, list]:
    """Logical ``(step, kind, path) -> [tensor per call]`` of a layout, and what was skipped."""
    data = max(layout.get("data", 1), 1)
    merged, skipped = {}, []
    by_data: dict[int, list] = {}
    for r in results:
        by_data.setdefault(r["data_index"], []).append(r)
    for key, base_entries in baseline["records"].items():
        base_calls = _calls(base_entries, baseline["chunks"])
        per_data = []
        for d in sorted(by_data):
            holders = [_calls(r["records"][key], r["chunks"]) for r in by_data[d]
                       if key in r["records"]]
            per_data.append(holders)
        if not any(per_data):
            skipped.append(f"{key[1]} {key[2]} (never called in this layout)")
            continue
        calls = []
        for j, ref in enumerate(base_calls):
            target = ref.shape
            if data > 1 and ref.ndim:
                target = (ref.shape[0] // data,) + ref.shape[1:]
            pieces = []
            for holders in per_data:
                parts = [h[j] for h in holders if j < len(h)]
                piece = _join(parts, target) if parts else None
                pieces.append(piece)
            if any(p is None for p in pieces):
                calls = None
                break
            value = np.concatenate(pieces, 0) if len(pieces) > 1 else pieces[0]
            if key[1] == "backward":
                value = value * results[0]["act_grad_scale"]
            calls.append(value)
        if calls is None or len(calls) != len(base_calls):
            shapes = sorted({p.shape for h in per_data for e in h for p in e}, key=str)
            skipped.append(f"{key[1]} {key[2]} (shapes {shapes[:3]} do not reassemble to "
                           f"{base_calls[0].shape})")
            continue
        merged[key] = calls
    return merged, list(dict.fromkeys(skipped))  # once each, whatever the number of steps


def _first_holder(results: list, field_name: str) -> dict:
    out = {}
    for r in results:
        for key, value in r[field_name].items():
            out.setdefault(key, value)
    return out


# -- the report ------------------------------------------------------------------------------

@dataclass
class Divergence:
    """The first tensor of a layout whose difference exceeds the tolerance. ``op`` is the class
    of the module in the layout (``base_op`` on one device, when different)."""

    step: int
    stage: str  # "forward", "loss", "backward" (input gradient), "grad", "param"
    path: str   # module path, or parameter name for grad/param
    op: str     # the module's class, "" for parameters and the loss
    difference: float
    tolerance: float
    base_op: str = ""

    def __str__(self) -> str:
        what = {"forward": "forward output of", "backward": "input gradient of",
                "grad": "gradient of parameter", "param": "parameter (after the step)",
                "loss": "loss"}[self.stage]
        op = self.op + (f"; one device: {self.base_op}" if self.base_op not in ("", self.op)
                        else "")
        op = f" ({op})" if op else ""
        where = "" if self.stage == "loss" else f" {self.path}{op}"
        return (f"step {self.step}: {what}{where}: difference {self.difference:.3g} > "
                f"tolerance {self.tolerance:.3g}")


@dataclass
class LayoutResult:
    """One layout's comparison with one device. ``steps[s]`` maps ``loss``, ``forward``,
    ``backward``, ``grad``, ``param`` to the max relative difference at step ``s``."""

    layout: dict
    steps: list = field(default_factory=list)
    first: Divergence | None = None
    skipped: list = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        """The layout as ``data=2,tensor=2``."""
        return layout_name(self.layout)

    @property
    def equal(self) -> bool:
        """Ran, and every compared tensor is within tolerance."""
        return self.error is None and self.first is None


@dataclass
class LayoutReport:
    """Every layout's :class:`LayoutResult`; ``str(report)`` is the table."""

    results: list
    dtype: str | None
    tolerances: list
    rows: int
    width: int

    @property
    def all_equal(self) -> bool:
        """Every layout ran and agrees with one device within tolerance."""
        return all(r.equal for r in self.results)

    def __getitem__(self, name: str) -> LayoutResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"LayoutReport: no layout {name!r}; have {[r.name for r in self.results]}")

    def __str__(self) -> str:
        head = (f"compare_layouts: {self.dtype or 'model dtype'}, differences are max|a-b| / "
                f"max|a|,|b| vs one device; tolerance 4·eps·rows·width·(step+1) with rows="
                f"{self.rows}, width={self.width}")
        cols = ["layout", "step", *STAGES, "tolerance"]
        lines = [head, "  ".join(f"{c:>12}" if i else f"{c:<26}" for i, c in enumerate(cols))]
        for r in self.results:
            if r.error:
                lines.append(f"{r.name:<26}  ERROR: {r.error}")
                continue
            for s, diffs in enumerate(r.steps):
                cells = [f"{diffs.get(k, float('nan')):>12.3g}" for k in STAGES]
                lines.append(f"{r.name if s == 0 else '':<26}  {s:>12}  " + "  ".join(cells)
                             + f"  {self.tolerances[s]:>12.3g}")
        lines.append("")
        for r in self.results:
            if r.error:
                continue
            verdict = "equal within tolerance" if r.first is None else f"FIRST DIVERGENCE {r.first}"
            lines.append(f"{r.name}: {verdict}")
            if r.skipped:
                lines.append(f"  not compared: {'; '.join(r.skipped[:5])}"
                             + (f" (+{len(r.skipped) - 5} more)" if len(r.skipped) > 5 else ""))
        return "\n".join(lines)

    def plot(self, path: str):
        """Draw the max difference (over every compared tensor) per step per layout, log scale,
        with the tolerance, into ``path`` (matplotlib's Agg canvas, no display). Returns the
        Figure."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as exc:
            raise ImportError("LayoutReport.plot needs matplotlib: pip install matplotlib") from exc
        fig = Figure(figsize=(6, 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        steps = list(range(len(self.tolerances)))
        for r in self.results:
            if r.error or not r.steps:
                continue
            worst = [max([v for v in d.values() if np.isfinite(v)], default=0.0) for d in r.steps]
            ax.plot(steps, [max(w, 1e-300) for w in worst], marker="o", label=r.name)
        ax.plot(steps, self.tolerances, "k--", label="tolerance")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("max relative difference vs one device")
        ax.set_xticks(steps)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path)
        return fig


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))))
    diff = float(np.max(np.abs(a - b)))
    return 0.0 if diff == 0 else diff / max(scale, np.finfo(np.float64).tiny)


def _compare(base: dict, results: list, layout: dict, tolerances: list) -> LayoutResult:
    out = LayoutResult(layout)
    merged, skipped = _merge_records(results, base, layout)
    grads, params = _first_holder(results, "grads"), _first_holder(results, "params")
    ops = {path: op for r in results for path, op in r["ops"].items()}
    loss = np.mean([r["losses"] for r in results], axis=0)
    order = {"forward": [], "backward": []}
    for key in base["order"]:
        order[key[1]].append(key)
    for step, tol in enumerate(tolerances):
        diffs: dict[str, float] = {}
        candidates = []
        for stage in STAGES:
            if stage == "loss":
                d = _difference(np.float64(base["losses"][step]), np.float64(loss[step]))
                items = [("", ("", ""), d)]
            elif stage in ("forward", "backward"):
                items = []
                for key in order[stage]:
                    if key[0] != step or key not in merged:
                        continue
                    d = max(_difference(a, b) for a, b in
                            zip(_calls(base["records"][key], base["chunks"]), merged[key]))
                    module_path = key[2].split("#")[0]
                    items.append((key[2], (ops.get(module_path, ""),
                                           base["ops"].get(module_path, "")), d))
            else:
                table = base["grads"] if stage == "grad" else base["params"]
                other = grads if stage == "grad" else params
                items = []
                for (s, name), value in table.items():
                    if s != step:
                        continue
                    if (s, name) not in other:
                        skipped.append(f"{stage} {name} (not recorded)")
                        continue
                    items.append((name, ("", ""), _difference(value, other[(s, name)])))
            diffs[stage] = max((d for _, _, d in items), default=float("nan"))
            candidates += [(stage, path, op, d) for path, op, d in items if d > tol]
        out.steps.append(diffs)
        if out.first is None and candidates:
            stage, path, (op, base_op), d = candidates[0]
            out.first = Divergence(step, stage, path, op, d, tol, base_op)
    out.skipped = list(dict.fromkeys(skipped))
    return out


def compare_layouts(build_model: Callable, make_batches: Callable, steps: int = 3,
                    layouts: list | None = None, dtype: str | None = "float64",
                    loss_fn: Callable | None = None, optimizer: Callable | None = None,
                    rtol: float | None = None, seed: int = 0, timeout: float = 120
                    ) -> LayoutReport:
    """Train ``build_model``'s model for ``steps`` steps on one device and on each layout of
    ``layouts`` (dicts: ``data``, ``tensor`` (+ ``mode``), ``pipeline`` (+ ``micro_batches``),
    ``sequence``, ``zero``), and report how far each layout's loss, forward outputs, input
    gradients, parameter gradients and parameters are from one device's, and the first tensor
    beyond tolerance (see the module docstring for the contract, the gathering and the
    tolerance). A layout that cannot run (refused by its kind's check, a failing rank) is
    reported with its error. ``timeout`` bounds each layout's run."""
    layouts = [_normalize(dict(layout)) for layout in (layouts or [])]
    loss_fn = loss_fn or F.nn.square_loss
    make_optimizer = optimizer or (lambda params: optim.SGD(params, lr=0.1))
    blocks = current_blocks()

    def job(layout):
        return _Job(build_model, make_batches, loss_fn, make_optimizer, layout, steps, dtype,
                    seed, blocks)

    base = run_workers(_worker, 1, job({}), timeout=timeout)[0]
    first = np.asarray(list(make_batches())[0][0])
    # rows: samples x positions (the last axis of a float input is its features; ids have none)
    features = first.ndim > 1 and first.dtype.kind == "f"
    rows = int(first.size // first.shape[-1]) if features else int(first.size)
    width = max([max(s) for s in base["param_shapes"].values() if s] or [1])
    eps = float(np.finfo(np.dtype(dtype or "float32")).eps)
    tolerances = [rtol * (s + 1) if rtol is not None else 4 * eps * rows * width * (s + 1)
                  for s in range(steps)]
    results = []
    for layout in layouts:
        try:
            for kind in layout:
                if kind in LAYOUT_KINDS:
                    LAYOUT_KINDS[kind].check(layout)
            ranks = run_workers(_worker, _world(layout), job(layout), timeout=timeout)
        except (LayoutNotAvailable, LaunchError, ValueError, TypeError) as exc:
            results.append(LayoutResult(layout, error=str(exc).strip().splitlines()[-1]
                                        if isinstance(exc, LaunchError) else str(exc)))
            continue
        results.append(_compare(base, ranks, layout, tolerances))
    return LayoutReport(results, dtype, tolerances, rows, width)


# -- command line ----------------------------------------------------------------------------

def _parse_layout(text: str) -> dict:
    layout = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"layout item {item!r} is not key=value")
        layout[key.strip()] = value.strip() if key.strip() == "mode" else int(value)
    return layout


def main(argv: list | None = None) -> int:
    """``python -m minigrad.testing.compare_layouts my_train.py --layouts data=2 tensor=2``:
    prints the report; exit status 1 when a layout diverges or fails."""
    parser = argparse.ArgumentParser(
        prog="python -m minigrad.testing.compare_layouts",
        description="Compare a model's parallel layouts with one device, tensor by tensor.")
    parser.add_argument("script", help="a Python file defining build_model and make_batches "
                                       "(optionally loss_fn, optimizer)")
    parser.add_argument("--layouts", nargs="+", type=_parse_layout, required=True,
                        help="layouts such as data=2 tensor=2,mode=1d pipeline=2,micro_batches=4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--plot", default=None, help="write the difference plot to this file")
    args = parser.parse_args(argv)
    names = runpy.run_path(args.script, run_name="compare_layouts_user")
    for needed in ("build_model", "make_batches"):
        if needed not in names:
            parser.error(f"{args.script} must define {needed}")
    report = compare_layouts(names["build_model"], names["make_batches"], steps=args.steps,
                             layouts=args.layouts, dtype=args.dtype, rtol=args.rtol,
                             loss_fn=names.get("loss_fn"), optimizer=names.get("optimizer"))
    print(report)
    if args.plot:
        report.plot(args.plot)
    return 0 if report.all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
