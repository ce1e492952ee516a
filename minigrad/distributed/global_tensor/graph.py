"""``Graph``: OneFlow's ``nn.Graph`` training step, run eagerly with a pipeline schedule.

The user writes a ``build(*inputs)`` that computes the loss of one batch on global tensors and
calls ``loss.backward()``; ``set_stage`` names the stage modules and their placements (or, as
in OneFlow, ``module.to(nn.graph.GraphModule).set_stage(stage_id, placement)`` on a module the
graph holds: :class:`minigrad.module.graph.GraphModule`),
``config.set_gradient_accumulation_steps(n)`` the number of micro-batches and ``add_optimizer`` the
optimizers. ``graph(*inputs)`` then runs one training step:

1. every tensor input is cut into ``n`` micro-batches along axis 0: logical slices, except that
   a batch split along axis 0 (data parallel stages) is cut on each rank, moving no data;
2. each rank runs its stage's program of the pipeline schedule (1F1B by default:
   ``minigrad.distributed.pipeline.get_schedule(...).compute_order(stage)``). A forward of
   micro-batch ``m`` runs ``build`` on it: every rank runs the whole program, computing only the ops
   placed on it (the others are skipped), and the activations move between stages where the
   program moves them (``out.to_global(placement=P1, ...)``). ``loss.backward()`` inside ``build``
   is deferred; the schedule's backward of ``m`` later runs it on the loss scaled by ``1 / n``
   (``gm.backward(loss, dy, release=False)``), so the gradients of the *mean* micro-batch loss
   accumulate, in the schedule's order on each stage;
3. each optimizer steps and its gradients are cleared (and its ``lr_sch`` steps);
4. the mean of ``build``'s return values over the micro-batches is returned.

Because point-to-point sends are buffered and each pair of ranks sees its messages in order, every
stage may follow its own schedule order: the transfers match as in the pipeline engine.

Example (two stages on ranks 0 and 1; ``examples/global_tensor_pipeline.py`` is OneFlow's whole
tutorial program)::

    class Step(mg.Graph):
        def __init__(self):
            super().__init__()
            self.set_stage(stage0, stage_id=0, placement=P0)   # stage0.to_global(P0, ...) before
            self.set_stage(stage1, stage_id=1, placement=P1)
            self.config.set_gradient_accumulation_steps(4)
            self.add_optimizer(sgd)

        def build(self, x, y):
            loss = loss_fn(stage1(stage0(x).to_global(placement=P1)), y)
            loss.backward()
            return loss

    mean_loss = Step()(x, y)
"""

from __future__ import annotations

from minigrad.autodiff import GradManager, no_grad
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import get_rank
from minigrad.distributed.global_tensor.graph_zero import GraphZero, ZeroConfig
from minigrad.distributed.global_tensor.tensor import local_row_chunks
from minigrad.distributed.pipeline.accumulation import mean_loss_seed
from minigrad.distributed.pipeline.actions import Forward
from minigrad.distributed.pipeline.schedule import get_schedule
from minigrad.module import Module
from minigrad.module.graph import GraphModule

__all__ = ["Graph", "GraphConfig"]


class GraphConfig:
    """A Graph's settings (OneFlow's ``graph.config``)."""

    def __init__(self):
        self.gradient_accumulation_steps = 1
        self.pipeline_schedule = "1f1b"
        self.zero: ZeroConfig | None = None

    def enable_zero(self, mode: bool = True, *, stage: int = 2, shard_min_size: int = 1024,
                    shard_restore_level: int = 1) -> None:
        """Shard the data-parallel optimizer state (stage 1), also the gradients (2) and the
        parameters (3) over each parameter's placement, OneFlow's signature: a parameter is
        sharded when each of its ``split(0)`` shards has at least ``shard_min_size`` elements;
        ``shard_restore_level`` 1 or 2 (the parameter is gathered whole for its ops). Set it
        before the graph's first call; the training is the same bits as without it
        (:mod:`minigrad.distributed.global_tensor.graph_zero`)."""
        self.zero = ZeroConfig(stage, shard_min_size, shard_restore_level) if mode else None

    def set_gradient_accumulation_steps(self, value: int) -> None:
        """Split every batch into ``value`` micro-batches and accumulate their gradients."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"Graph.config.set_gradient_accumulation_steps: expected an int >= 1, got {value!r}"
            )
        self.gradient_accumulation_steps = value

    def set_pipeline_schedule(self, name: str) -> None:
        """The pipeline schedule ("1f1b", the default, or "gpipe"); a minigrad extension."""
        if name not in ("1f1b", "gpipe"):
            raise ValueError(
                f"Graph.config.set_pipeline_schedule: expected '1f1b' or 'gpipe', got {name!r}"
            )
        self.pipeline_schedule = name

    def __repr__(self) -> str:
        return (f"GraphConfig(gradient_accumulation_steps={self.gradient_accumulation_steps}, "
                f"pipeline_schedule={self.pipeline_schedule!r}, zero={self.zero})")


class _DeferringGradManager(GradManager):
    """The Graph's manager: while ``build`` runs, ``loss.backward()`` (which calls
    ``backward`` of the manager recording the loss) is only noted, to be run when the schedule
    says."""

    def __init__(self):
        super().__init__()
        self.deferred = None  # a list while build runs

    def backward(self, y=None, dy=None, *, release: bool = True) -> None:
        if self.deferred is not None:
            self.deferred.append((y, dy))
            return
        super().backward(y, dy, release=release)


class Graph:
    """A training step of global-tensor modules, pipelined over stages (OneFlow's ``nn.Graph``;
    see the module docstring). Subclass it, write ``build``, call the instance."""

    def __init__(self):
        self.config = GraphConfig()
        self._optimizers: list = []
        self._stages: dict = {}
        self._zero: GraphZero | None = None

    def build(self, *args):
        """The computation of one (micro-)batch; training graphs call ``loss.backward()``."""
        raise NotImplementedError(f"{type(self).__name__}.build is not implemented")

    def set_stage(self, module, stage_id: int, placement) -> None:
        """Make ``module`` (whose parameters live on ``placement``) pipeline stage ``stage_id``;
        minigrad's one-line form of OneFlow's ``module.to(nn.graph.GraphModule).set_stage(...)``."""
        if isinstance(stage_id, bool) or not isinstance(stage_id, int) or stage_id < 0:
            raise ValueError(f"Graph.set_stage: stage_id must be an int >= 0, got {stage_id!r}")
        for name, p in module.named_parameters():
            if not p.is_global or p.placement != placement:
                where = p.placement if p.is_global else "a local tensor"
                raise ValueError(
                    f"Graph.set_stage: stage {stage_id}'s parameter {name!r} is on {where}, not "
                    f"on {placement}; call module.to_global(placement, sbp) first"
                )
        for other, (_, pl) in self._stages.items():
            if other != stage_id and any(r in pl for r in placement.rank_list):
                raise ValueError(
                    f"Graph.set_stage: stage {stage_id} ({placement}) shares ranks with stage "
                    f"{other} ({pl}); stages must be on disjoint ranks"
                )
        self._stages[stage_id] = (module, placement)

    def add_optimizer(self, optimizer, *, lr_sch=None) -> None:
        """Step ``optimizer`` (and ``lr_sch``) at the end of every call."""
        self._optimizers.append((optimizer, lr_sch))

    # -- one step -----------------------------------------------------------------------------
    def _take_marked_stages(self) -> None:
        """Register the modules marked with OneFlow's ``module.to(nn.graph.GraphModule)
        .set_stage(...)`` among those this graph holds (each once)."""
        taken = {id(module) for module, _ in self._stages.values()}
        for value in list(vars(self).values()):
            if not isinstance(value, Module):
                continue
            for _, module in value.named_modules():
                marked = GraphModule.stage_of(module)
                if marked is not None and id(module) not in taken:
                    placement = marked[1]
                    if placement is None:  # OneFlow infers it from the parameters
                        params = [p for p in module.parameters() if p.is_global]
                        placement = params[0].placement if params else None
                    self.set_stage(module, marked[0], placement)
                    taken.add(id(module))

    def _stage_of(self, rank: int):
        self._take_marked_stages()
        ids = sorted(self._stages)
        if ids != list(range(len(ids))):
            raise ValueError(f"Graph: stage ids must be 0, 1, ..., got {ids}")
        mine = [s for s, (_, pl) in self._stages.items() if rank in pl]
        return (mine[0] if mine else None), max(len(ids), 1)

    def _micro_batches(self, args, n: int) -> list:
        """``n`` micro-batches of every tensor input: consecutive slices along axis 0, except
        that a batch split along axis 0 (data parallel) is cut rank by rank, moving no data."""
        out = [[] for _ in range(n)]
        for i, a in enumerate(args):
            if not isinstance(a, Tensor) or n == 1:
                for m in range(n):
                    out[m].append(a)
                continue
            size = a.shape[0] if a.ndim else 0
            if size % n:
                raise ValueError(
                    f"Graph: input {i} has a batch of {size}, not divisible by the "
                    f"{n} micro-batches of set_gradient_accumulation_steps({n})"
                )
            if a.is_global and any(s.kind == "S" and s.dim == 0 for s in a.sbp):
                chunks = local_row_chunks(a, n, f"Graph: input {i}")
            else:
                b = size // n
                chunks = [a[m * b:(m + 1) * b] for m in range(n)]
            for m in range(n):
                out[m].append(chunks[m])
        return out

    def __call__(self, *args):
        n = self.config.gradient_accumulation_steps
        training = bool(self._optimizers)
        stage, stages = self._stage_of(get_rank())
        if training:
            name = self.config.pipeline_schedule if stage is not None else "gpipe"
            order = get_schedule(name, stages, n).compute_order(stage or 0)
        else:
            order = [Forward(m) for m in range(n)]
        micro = self._micro_batches(args, n)
        zero = self._zero_state() if training else None
        params = [p for opt, _ in self._optimizers for g in opt.param_groups for p in g["params"]]
        for opt, _ in self._optimizers:
            opt.clear_grad()
        if zero is not None:
            params = zero.attached(params)
        gm = _DeferringGradManager().attach(params)
        outputs, pending = [None] * n, [None] * n
        try:
            with gm:
                if zero is not None:
                    zero.begin()
                self._run_order(order, micro, outputs, pending, gm, training, zero)
        finally:
            if zero is not None:
                zero.end()
        for opt, lr_sch in self._optimizers:
            opt.step()
            opt.clear_grad()
            if lr_sch is not None:
                lr_sch.step()
        if zero is not None:
            zero.after_step()
        return _mean(outputs)

    def _zero_state(self) -> GraphZero | None:
        """The graph's ZeRO state (built at the first training call with ``enable_zero``)."""
        if self.config.zero is None:
            if self._zero is not None:
                raise RuntimeError(f"{type(self).__name__}: enable_zero cannot be switched off "
                                   "after the first call (the optimizers hold the shards)")
            return None
        if self._zero is None:
            modules = [v for v in vars(self).values() if isinstance(v, Module)]
            modules += [module for module, _ in self._stages.values()]
            self._zero = GraphZero(self.config.zero, modules, [o for o, _ in self._optimizers])
        elif self._zero.stage != self.config.zero.stage:
            raise RuntimeError(f"{type(self).__name__}: the ZeRO stage cannot change after the "
                               f"first call ({self._zero.stage} -> {self.config.zero.stage})")
        return self._zero

    def _run_order(self, order, micro, outputs, pending, gm, training, zero) -> None:
        """Run this stage's forwards and backwards in the schedule's order."""
        for action in order:
            m = action.micro_batch
            if isinstance(action, Forward):
                if zero is not None:
                    zero.before_forward()
                gm.deferred = []
                try:
                    outputs[m] = self.build(*micro[m])
                finally:
                    pending[m], gm.deferred = gm.deferred, None
                self._check_backward_calls(pending[m], training)
                continue
            for y, dy in pending[m]:
                gm.backward(y, mean_loss_seed(y, len(micro), dy), release=False)
            pending[m] = None

    def _check_backward_calls(self, calls, training: bool) -> None:
        if training and len(calls) != 1:
            raise RuntimeError(
                f"{type(self).__name__}.build must call loss.backward() exactly once per batch "
                f"when the graph has an optimizer, it called it {len(calls)} time(s)"
            )
        if not training and calls:
            raise RuntimeError(
                f"{type(self).__name__}.build calls backward but no optimizer was added "
                "(add_optimizer)"
            )

    def __repr__(self) -> str:
        stages = {s: str(pl) for s, (_, pl) in sorted(self._stages.items())}
        return f"{type(self).__name__}(stages={stages}, config={self.config})"


def _mean(outputs: list):
    """The mean of the micro-batches' results (tensors, or tuples of them), unrecorded."""
    first = outputs[0]
    if first is None:
        return None
    with no_grad():
        if isinstance(first, (tuple, list)):
            return type(first)(_mean([o[i] for o in outputs]) for i in range(len(first)))
        if not isinstance(first, Tensor):
            return first
        total = first
        for o in outputs[1:]:
            total = total + o
        return total * (1.0 / len(outputs)) if len(outputs) > 1 else total.detach()
