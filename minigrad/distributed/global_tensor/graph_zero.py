"""ZeRO for ``mg.Graph``: OneFlow's ``graph.config.enable_zero(True, stage=...)`` on the SBP
machinery.

Data parallelism on global tensors keeps every parameter ``broadcast`` over its placement and
splits the batch (``split(0)``): each rank holds the whole model, its gradient (the partial sums
all-reduced, ``P -> B``) and the whole optimizer state. ``enable_zero`` shards that state over
the placement, each parameter by its own ``split(0)`` (a balanced split of its first axis, rows
not divisible by the ranks included): every sharded parameter gets a *shard*, a
``GlobalParameter`` with ``split(0)`` on the same placement, and the graph's optimizers hold the
shards instead of the parameters (state for a shard only: about ``1/n`` of the full state).

======= ========================================================================================
stage   what a step does
======= ========================================================================================
1       forward and backward on the broadcast parameter (gradient all-reduced, ``P -> B``); the
        shard's gradient is the rank's slice of it (``B -> S(0)``, no communication); the
        optimizer updates the shard; the parameter is all-gathered from the shards
        (``S(0) -> B``)
2       as 1, but the gradient is reduce-scattered straight into the shard (``P -> S(0)``): the
        graph uses the broadcast parameter through a node whose backward is that boxing, so no
        rank holds a full gradient
3       the module holds the shard itself (parameters at rest are ``split(0)``); just before each
        forward of the module that holds it the shard is gathered, ``shard.to_global(sbp=
        broadcast)`` (``S(0) -> B``, an all-gather), whose backward is the reduce-scatter; after
        the forward the module holds the shard again. Nothing is gathered after the step
======= ========================================================================================

The optimizers update element by element, and on the cpu backend the reduce-scatter sums the
ranks' contributions in the same order as the all-reduce, so every stage trains bitwise like the
same Graph without ZeRO. Parameters smaller than ``shard_min_size`` elements per shard, not on a
1-D placement of several ranks, not broadcast or 0-d, stay as they are.

Stage 3 here frees nothing between a module's forward and its backward: the gathered parameter
is saved by the ops that use it until the micro-batch's backward. Its gain is the parameters at
rest (between steps, and of the modules whose micro-batch has finished its backward).
"""

from __future__ import annotations

from minigrad.autodiff import no_grad
from minigrad.autodiff.function import Function
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.global_tensor.boxing import Layout, box
from minigrad.distributed.global_tensor.sbp import split
from minigrad.distributed.global_tensor.tensor import as_global, local_view
from minigrad.module import Module

__all__ = ["GraphZero", "ZeroConfig"]


class ZeroConfig:
    """The arguments of ``GraphConfig.enable_zero`` (OneFlow's), checked."""

    def __init__(self, stage: int = 2, shard_min_size: int = 1024, shard_restore_level: int = 1):
        if isinstance(stage, bool) or stage not in (1, 2, 3):
            raise ValueError(f"Graph.config.enable_zero: stage must be 1, 2 or 3, got {stage!r}")
        if isinstance(shard_min_size, bool) or not isinstance(shard_min_size, int) or (
                shard_min_size < 1):
            raise ValueError(
                "Graph.config.enable_zero: shard_min_size must be an int >= 1, got "
                f"{shard_min_size!r}")
        if shard_restore_level not in (1, 2):
            raise ValueError(
                "Graph.config.enable_zero: shard_restore_level must be 1 or 2 (the sharded "
                "parameter is gathered whole for the ops that use it; level 0, ops on the shards "
                f"themselves, is not supported), got {shard_restore_level!r}")
        self.stage = stage
        self.shard_min_size = shard_min_size
        self.shard_restore_level = shard_restore_level

    def __repr__(self) -> str:
        return (f"ZeroConfig(stage={self.stage}, shard_min_size={self.shard_min_size}, "
                f"shard_restore_level={self.shard_restore_level})")


class UseWithShardGrad(Function):
    """Stage 2: the broadcast parameter's value (no communication) whose backward reduce-scatters
    the gradient (``P -> S(0)``) into the shard, the node's input."""

    dispatches = False  # works on the pieces itself

    def forward(self, shard_view, full_piece, full_layout: Layout, shard_layout: Layout,
                shape: tuple):
        self.full_layout, self.shard_layout, self.shape = full_layout, shard_layout, shape
        return full_piece._data

    def backward(self, dy):
        g = box(dy._data, self.full_layout.adjoint(), self.shard_layout, self.shape,
                "enable_zero (gradient reduce-scatter)")
        return Tensor._wrap(g, dy._device), None, None, None, None


class _Entry:
    """One sharded parameter: the original (broadcast) one, its shard, and where modules hold
    it (``(module, attribute)``)."""

    def __init__(self, param, shard, slots: list):
        self.param, self.shard, self.slots = param, shard, slots

    def set(self, value) -> None:
        for module, key in self.slots:
            object.__setattr__(module, key, value)


def _eligible(p, min_size: int) -> bool:
    if not getattr(p, "is_global", False) or p.ndim == 0:
        return False
    pl = p.placement
    n = len(pl.rank_list)
    return (pl.ndim == 1 and n > 1 and all(s.kind == "B" for s in p.sbp)
            and p.size // n >= min_size)


def _slots(modules: list, param) -> list:
    """``(module, attribute)`` of every module attribute holding ``param``."""
    found, seen = [], set()
    for top in modules:
        for _, module in top.named_modules():
            if id(module) in seen:
                continue
            seen.add(id(module))
            found += [(module, k) for k, v in vars(module).items() if v is param]
    return found


class GraphZero:
    """The ZeRO state of one Graph, built at its first training call: the sharded parameters
    and the graph's optimizers switched to the shards (see the module docstring)."""

    def __init__(self, config: ZeroConfig, modules: list, optimizers: list):
        self.stage = config.stage
        self.entries: list[_Entry] = []
        self.active = False
        for opt in optimizers:
            if opt.state_dict()["state"]:
                raise RuntimeError(
                    f"Graph.config.enable_zero: {type(opt).__name__} already has state (it "
                    "stepped before); enable ZeRO before the graph's first call")
            for group in opt.param_groups:
                group["params"] = [self._shard(p, config.shard_min_size, modules)
                                   for p in group["params"]]
        if self.stage == 3:
            hooked = set()
            for e in self.entries:
                e.set(e.shard)
                e.param.replaced_by = "its split(0) shard (Graph.config.enable_zero(stage=3))"
                for module, _ in e.slots:
                    if id(module) not in hooked:
                        hooked.add(id(module))
                        module.register_forward_pre_hook(self._gather_hook)
                        module.register_forward_hook(self._reshard_hook)

    def _shard(self, p, min_size: int, modules: list):
        if not _eligible(p, min_size):
            return p
        slots = _slots(modules, p)
        if not slots:
            raise ValueError(
                f"Graph.config.enable_zero: parameter {p.name or ''} of shape {tuple(p.shape)} "
                "is not an attribute of a module the graph holds (self.model = model, or "
                "set_stage)")
        with no_grad():
            shard = Parameter(p.detach().to_global(sbp=split(0)), name=p.name)
        self.entries.append(_Entry(p, shard, slots))
        return shard

    # -- a training call ------------------------------------------------------------------------
    def attached(self, params: list) -> list:
        """What the graph's GradManager attaches instead of the optimizers' ``params``: the
        broadcast parameters at stage 1 (their gradients are all-reduced as usual), the shards
        at stages 2 and 3."""
        if self.stage != 1:
            return params
        by_shard = {id(e.shard): e.param for e in self.entries}
        return [by_shard.get(id(p), p) for p in params]

    def begin(self) -> None:
        """At the start of a call: stage 3 turns its gather hooks on."""
        self.active = True

    def before_forward(self) -> None:
        """Before each micro-batch's forward (recorded): stage 2 points the modules at the
        parameters' values through a new :class:`UseWithShardGrad` node (one per micro-batch:
        a recorded node is back-propagated once)."""
        if self.stage != 2:
            return
        for e in self.entries:
            p, s = e.param, e.shard
            value = Tensor._wrap(p._data, p._device)  # no graph: the gradient goes to s
            out = UseWithShardGrad()(local_view(s), value, p._layout, s._layout, p.shape)
            e.set(as_global(out, p._layout, p.shape))

    def end(self) -> None:
        """After the last backward: the modules hold the parameters again (stage 2); the
        shards get their gradients (stage 1: this rank's slice of the all-reduced one)."""
        self.active = False
        if self.stage == 2:
            for e in self.entries:
                e.set(e.param)
        if self.stage == 1:
            with no_grad():
                for e in self.entries:
                    g = e.param.grad
                    e.shard.grad = None if g is None else g.to_global(sbp=split(0))
                    e.param.grad = None

    def after_step(self) -> None:
        """Stages 1 and 2: all-gather the updated shards into the parameters (``S(0) -> B``)."""
        if self.stage == 3:
            return
        with no_grad():
            for e in self.entries:
                e.param.set_value(e.shard)

    # -- stage 3 hooks ----------------------------------------------------------------------------
    def _gather_hook(self, module: Module, inputs):
        if not self.active:
            return None
        for e in self.entries:
            for m, key in e.slots:
                if m is module:
                    object.__setattr__(module, key, e.shard.to_global(sbp=e.param.sbp))
        return None

    def _reshard_hook(self, module: Module, inputs, output):
        for e in self.entries:
            for m, key in e.slots:
                if m is module:
                    object.__setattr__(module, key, e.shard)
        return None
