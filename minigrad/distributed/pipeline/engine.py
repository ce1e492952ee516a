"""``PipelineEngine``: runs a pipeline schedule on every stage, one action at a time.

A schedule (:mod:`~minigrad.distributed.pipeline.schedule`) already says everything a stage does
in one step, in order; the engine is a thin interpreter of ``schedule.actions(stage)``:

=====================  ==========================================================================
action                 what the engine does on this rank
=====================  ==========================================================================
``Forward(m, c)``      run the stage's layers of chunk ``c`` on micro-batch ``m``: its input is the
                       data (first logical stage) or what ``RecvActivation`` received; on the last
                       logical stage apply ``module.loss_fn`` to the output and the labels
``RecvActivation``     receive the input of ``(m, c)``; its float tensors become leaves attached to
                       the step's GradManager, so that backward yields their gradients
``SendActivation``     send the output of ``(m, c)`` to the next logical stage
``Backward(m, c)``     ``gm.backward(outputs, output_grads, release=False)``: weight gradients
                       accumulate into ``.grad``, the input's gradient is kept for ``SendGrad``;
                       on the last logical stage the root is the loss with gradient ``1 / M``
``BackwardInput``      ``gm.backward_input(...)``: only the input's gradient (zero-bubble)
``BackwardWeight``     ``gm.backward_weight(handle)``: the weight gradients, later
``RecvGrad/SendGrad``  receive the output's gradient / send the input's gradient
``ReduceTiedGrads``    sum each tied weight's gradient over the stages that hold a copy
``ReduceGrads``        average every gradient over the stage's data-parallel group
``OptimizerStep``      ``optimizer.step()`` on the stage's own parameters, then drop the gradients
                       (with a ``scaler``: ``scaler.step(optimizer)``, then ``scaler.update()``)
=====================  ==========================================================================

One step is one recording (``with gm:``) holding every micro-batch's graph; each backward
releases only its own micro-batch's graph, so 1F1B and zero-bubble orders work. The gradient of
each micro-batch loss is ``1 / M``: the gradients are those of the mean loss over the M
micro-batches (averaged again over data-parallel replicas), i.e. one optimizer step of plain
gradient accumulation. ``train_batch`` returns that mean loss, the same float on every rank (the
last stage all-reduces it over its data-parallel group, then broadcasts it over the pipeline).

Data. The first stage takes the inputs and the last stage the labels of each item ``(inputs,
labels)`` of ``data_iter``; each of them pulls exactly ``micro_batches`` items per step, item m
being micro-batch m (DeepSpeed's rule). Middle stages never touch the iterator and may pass
``None``. The first and last stages must therefore iterate the same sequence (same loader, same
seed): nothing can check that the labels belong to the inputs.

Messages. Sends are buffered (a send returns once the data is on its way), so a validated
schedule cannot deadlock at any stage count. A message is its arrays, each one ``comm.send``
carrying its own shape and dtype; the message's fields (kind, number of tensors, tuple or not)
ride in the first send's header, so a one-tensor activation is one send. Only float tensors get
gradients back. Shapes may change from one micro-batch to the next (a last, shorter
batch), but the number of tensors and their dtypes must stay those of the step's first micro-batch:
the receiving stage raises naming the stage, the micro-batch and both signatures. Everything the
engine sends or receives goes through :class:`~.transport.Transport`, the one seam over
``comm.send`` / ``comm.recv``.

Mixed precision. The engine owns the loss scaler, as DeepSpeed's does:
``PipelineEngine(..., scaler=amp.GradScaler(module=net))``. Each micro-batch's loss seed
``1 / M`` is multiplied by the scale, so every activation gradient sent between stages is scaled;
at ``OptimizerStep`` every stage calls ``scaler.step(optimizer)`` (unscale its gradients, check
them, agree over the scaler's group (default: every rank of the job, i.e. data x pipeline), step
unless some rank found inf/nan) and ``scaler.update()``: every stage and replica skips the same
steps and keeps the same scale. Any object with ``scale``, ``step`` and ``update`` works (this
layer does not import ``minigrad.amp``).

Failures. An exception on one rank during a step (a layer returning a list, a changed dtype, a
bad data item) is raised there with its own traceback, and the rank sends an *abort* message to
its pipeline neighbours, which raise a :class:`PipelineError` naming the failing stage and error
and pass the abort on: every rank of the pipeline fails with a clear message instead of waiting.
A rank that dies is reported by the launcher (which ends the job). After a failed step messages may
still be in flight, so the engine refuses to run another step.

Example::

    net = PipelineModule(specs, num_stages=2, loss_fn=F.nn.cross_entropy)
    engine = PipelineEngine(net, optim.Adam(net.parameters(), lr=1e-3), micro_batches=8)
    data = iter(RepeatingLoader(loader))
    loss = engine.train_batch(data)          # the same float on every rank
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import numpy as np

import minigrad.distributed.pipeline.actions as A
import minigrad.functional as F
from minigrad import seams
from minigrad.autodiff import GradManager, is_recording, no_grad
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.dtypes import as_float_dtype, is_floating
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.flat_buffer import FlatBuffer, group_by_layout
from minigrad.distributed.comm.group import (
    Group,
    get_rank,
    get_world_size,
    group_for_ranks,
    is_distributed,
)
from minigrad.distributed.data_parallel.helper import bcast_list_
from minigrad.distributed.data_parallel.zero import ZeroRedundancyOptimizer
from minigrad.distributed.pipeline.accumulation import mean_loss_seed
from minigrad.distributed.pipeline.errors import PipelineError
from minigrad.distributed.pipeline.module import PipelineModule
from minigrad.distributed.pipeline.schedule import (
    InferenceSchedule,
    Schedule,
    check_positive_int,
    get_schedule,
)
from minigrad.distributed.pipeline.timeline import Timeline, TimelineEvent
from minigrad.distributed.pipeline.transport import Aborted, Transport

__all__ = ["PipelineEngine", "Transport"]

# Timeline labels as numbers, to gather every rank's events in one float array.
_LABELS = (*A.MICRO_BATCH_ACTIONS, *A.STEP_ACTIONS)


# ------------------------------------------------------------------------------------------------
# One step's working state
# ------------------------------------------------------------------------------------------------
class _Step:
    """Buffers of one ``train_batch`` / ``eval_batch``, keyed by ``(micro_batch, chunk)``."""

    def __init__(self, data_iter, micro_batches: int, training: bool, keep_outputs: bool):
        self.data_iter = data_iter
        self.micro_batches = micro_batches
        self.training = training
        self.keep_outputs = keep_outputs
        self.items: list[list] = []          # pulled (inputs, labels), parts dropped once used
        self.inputs: dict[tuple, tuple] = {}  # the input tensors of a (micro-batch, chunk)
        self.outputs: dict[tuple, tuple] = {}  # its output tensors (the loss on the last stage)
        self.as_tuple: dict[tuple, bool] = {}  # whether the output was a tuple
        self.output_grads: dict[tuple, list] = {}
        self.input_grads: dict[tuple, list] = {}
        self.handles: dict[tuple, Any] = {}   # WeightGradHandles waiting for A.BackwardWeight
        self.signatures: dict[int, tuple] = {}  # chunk -> its first received message
        self.losses: dict[int, float] = {}
        self.logits: dict[int, Any] = {}


def _signature(arrays: list, as_tuple: bool) -> str:
    """``"((4, 5) float64, (4,) int64)"``: what a message holds, for error messages."""
    parts = ", ".join(f"{tuple(a.shape)} {np.dtype(a.dtype).name}" for a in arrays)
    return f"({parts})" if as_tuple else parts


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _floats(tensors) -> list:
    return [t for t in tensors if t.dtype.kind == "f"]


def _to_tensors(value):
    """Arrays in a data item as Tensors (tuples and lists element-wise); Tensors and anything
    else (None, Python values) as they are."""
    if isinstance(value, (tuple, list)):
        return tuple(_to_tensors(v) for v in value)
    if not isinstance(value, Tensor) and hasattr(value, "shape") and hasattr(value, "dtype"):
        return Tensor(value)
    return value


def _all_reduce_into_grads(params: list, group: Group, scale: float,
                           reduce_dtype: np.dtype | None = None) -> None:
    """Sum every parameter's gradient (zeros where it has none) over ``group``, times ``scale``,
    with one all-reduce per dtype; floating gradients travel and sum in ``reduce_dtype`` when it
    is given (then cast back to their own dtype)."""
    for same in group_by_layout(params, key=lambda p: p.dtype.name).values():
        grads = [p.grad.data if p.grad is not None else p.xp.zeros(p.shape, p.dtype)
                 for p in same]
        dtype = grads[0].dtype
        if reduce_dtype is not None and is_floating(dtype) and dtype != reduce_dtype:
            grads = [g.astype(reduce_dtype) for g in grads]
        flat = FlatBuffer.of(grads)
        total = comm.all_reduce(flat.data, "sum", group)
        if scale != 1.0:
            total *= scale
        for p, value in zip(same, flat.views()):
            p.grad = Tensor(value if value.dtype == dtype else value.astype(dtype),
                            device=p.device)


# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------
class PipelineEngine:
    """Trains (and evaluates) a :class:`PipelineModule` with a pipeline schedule; see the module
    docstring for what each action does and the rules on data, messages and failures.

    Arguments: ``module`` (this rank's stage), ``optimizer`` over ``module.parameters()`` (None
    for an evaluation-only engine), ``micro_batches`` M per step, ``schedule`` — ``"1f1b"``
    (default), ``"gpipe"``, ``"interleaved"`` (its chunk count is ``module.chunks``), ``"zb-h1"``,
    a :class:`~minigrad.distributed.pipeline.Schedule` class, or a built schedule of the right
    shape; ``zero_stage=1`` shards the optimizer state over the stage's data-parallel group
    (``dist.ZeroRedundancyOptimizer`` with the optimizer's class and param groups; the engine's
    ``optimizer`` is then that wrapper), 2 and 3 are refused (DeepSpeed's rule). ``scaler``: an
    ``amp.GradScaler`` the engine drives (loss scaling, see the module docstring).
    ``reduce_dtype`` (None: each gradient's own dtype) opts in to all-reducing the data-parallel
    gradients in a lower precision (``"float16"``: half the bytes of float32 on the wire, summed
    and rounded in float16), cast back to the gradients' dtype. Every configuration error is
    raised here, on every rank, before any message is sent.

    Construction is collective (every rank of the job, in the same order): it creates the
    process groups (data-parallel group, pipeline, one group per tied key and pipeline), makes
    the data-parallel replicas start from replica 0's weights and every tied copy from the lowest
    owning stage's.

    Example::

        engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), micro_batches=4,
                                schedule="gpipe")
        loss = engine.train_batch(data_iter)
        val = engine.eval_batch(val_iter)
        tl = engine.timeline()               # collective: every rank's events of the last step
    """

    def __init__(self, module: PipelineModule, optimizer, micro_batches: int,
                 schedule: str | type | Schedule = "1f1b", zero_stage: int = 0, scaler=None,
                 reduce_dtype=None):
        if zero_stage not in (0, 1, 2, 3):
            raise ValueError(
                f"PipelineEngine: zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
        if zero_stage in (2, 3):
            raise ValueError(
                f"PipelineEngine: zero_stage={zero_stage} is not supported with pipeline "
                "parallelism (DeepSpeed refuses it too): ZeRO-2 and ZeRO-3 partition the "
                "gradients (and ZeRO-3 the parameters) over the data-parallel ranks, which "
                "conflicts with the pipeline accumulating each gradient over the micro-batches "
                "of a step; use zero_stage=1 (optimizer state sharded)")
        if not isinstance(module, PipelineModule):
            raise TypeError(
                f"PipelineEngine: module must be a PipelineModule, got {type(module).__name__}")
        check_positive_int("micro_batches", micro_batches, "PipelineEngine")
        self.schedule = get_schedule(schedule, module.num_stages, micro_batches, module.chunks)
        if not self.schedule.training:
            raise ValueError(
                f"PipelineEngine: {self.schedule!r} is an inference schedule; give a training "
                f"schedule (eval_batch runs the inference schedule by itself)")
        _check_optimizer(optimizer, module)
        if scaler is not None and not all(
                callable(getattr(scaler, name, None)) for name in ("scale", "step", "update")):
            raise TypeError(
                f"PipelineEngine: scaler must be a loss scaler such as amp.GradScaler() (with "
                f"scale, step and update), got {type(scaler).__name__}")
        self.scaler = scaler
        self.reduce_dtype = None if reduce_dtype is None else as_float_dtype(
            reduce_dtype, "PipelineEngine: reduce_dtype")
        if self.reduce_dtype is not None and self.reduce_dtype.name not in comm.DTYPES:
            raise ValueError(
                f"PipelineEngine: reduce_dtype {self.reduce_dtype.name}: the collectives cannot "
                "reduce it; use float16 or float32, or None (each gradient's own dtype)")
        world = get_world_size() if is_distributed() else 1
        if module.topology.world_size() != world:
            raise ValueError(
                f"PipelineEngine: the module's topology {module.topology!r} needs "
                f"{module.topology.world_size()} ranks but the job has {world}"
                + ("" if is_distributed() else " (no process group: launch the job with "
                   "dist.launcher)"))
        self.module = module
        self.optimizer = optimizer
        self.micro_batches = micro_batches
        self.stage_id = module.stage_id
        self.num_stages = module.num_stages
        self.global_steps = 0
        self.rank = get_rank() if is_distributed() else 0
        self._pipe_ranks = module.pipeline_ranks()
        self._last_position = module.num_stages * module.chunks - 1
        self._transport = Transport(self.rank)
        self._peers = sorted({self._peer_rank(a) for a in self.schedule.actions(self.stage_id)
                              if isinstance(a, A.Communication)} - {self.rank})
        self._gm = GradManager().attach(list(module.parameters()))
        self._inference: dict[int, Schedule] = {}
        self._events: list[TimelineEvent] = []
        self._action_hooks: list[Callable] = []
        self._step: _Step | None = None
        self._failed: str | None = None
        self._run_action = {
            A.Forward: self._forward, A.Backward: self._backward,
            A.BackwardInput: self._backward_input, A.BackwardWeight: self._backward_weight,
            A.SendActivation: self._send_activation, A.RecvActivation: self._recv_activation,
            A.SendGrad: self._send_grad, A.RecvGrad: self._recv_grad,
            A.ReduceTiedGrads: self._reduce_tied_grads, A.ReduceGrads: self._reduce_grads,
            A.OptimizerStep: self._optimizer_step,
        }
        # Collective from here on, in the same order on every rank.
        self._data_group = self._axis_group("data")
        self._pipe_group = self._axis_group("pipe")
        self._tie_groups = self._make_tie_groups()
        if self._data_group is not None:
            bcast_list_(list(module.tensors()), self._data_group)
        self._broadcast_tied_weights()
        self.zero_stage = zero_stage
        if zero_stage == 1 and optimizer is not None and self._data_group is not None:
            self.optimizer = _zero_redundancy(optimizer, self._data_group)
        module.bind_engine()

    # -- set-up ----------------------------------------------------------------------------------
    def _axis_group(self, axis: str) -> Group | None:
        """This rank's group along ``axis``; None when the axis has one rank (nothing to do)."""
        if self.module.topology.get_dim(axis) == 1:
            return None
        return self.module.topology.group(axis)

    def _make_tie_groups(self) -> dict[str, Group]:
        """One group per tied key owned by several stages and per pipeline; every rank asks for
        every group (creating one is collective), keeps its own. The groups come from the
        process-wide table (``group_for_ranks``): keys tied over the same stages share one."""
        groups = {}
        for key, stages in sorted(self.module.tie_groups().items()):
            if len(stages) < 2:
                continue  # every position of the key is on one stage: one shared Parameter
            for ranks in self.module.tie_group_ranks(key):
                group = group_for_ranks(ranks)
                if self.rank in ranks:
                    groups[key] = group
        return groups

    def _broadcast_tied_weights(self) -> None:
        weights = self.module.tied_weights()
        for key, group in self._tie_groups.items():
            bcast_list_(weights[key], group)  # the group's root is its lowest (owning) rank

    def _peer_rank(self, action: A.Communication) -> int:
        return self._pipe_ranks[action.peer(self.stage_id, self.num_stages)[0]]

    # -- the public API --------------------------------------------------------------------------
    def train_batch(self, data_iter: Iterator | None = None) -> float:
        """One training step: pull ``micro_batches`` items ``(inputs, labels)`` (first and last
        stages), run the schedule, reduce tied and data-parallel gradients, step the optimizer.
        Returns the mean micro-batch loss, averaged over data-parallel replicas: the same float
        on every rank."""
        self._check_usable("train_batch")
        if self.optimizer is None:
            raise PipelineError("PipelineEngine.train_batch: this engine has no optimizer "
                                "(it was built for evaluation only)")
        with self._gm:
            if not is_recording():
                raise PipelineError(
                    "PipelineEngine.train_batch was called under no_grad, so no gradient could "
                    "be computed; use engine.eval_batch(data_iter) to evaluate")
            self.module.train()
            loss = self._run(self.schedule, _Step(data_iter, self.micro_batches, True, False))
        self.global_steps += 1
        return loss

    def eval_batch(self, data_iter: Iterator | None = None, return_logits: bool = False,
                   micro_batches: int | None = None):
        """Forward ``micro_batches`` (default: the engine's) items with the inference schedule,
        in eval mode and without recording. Returns the mean loss (like ``train_batch``: the same
        float on every rank); with ``return_logits``, ``(loss, logits)`` where ``logits`` are the
        model's outputs of the micro-batches concatenated along axis 0 on the last stage and None
        on the others."""
        self._check_usable("eval_batch")
        m = self.micro_batches if micro_batches is None else micro_batches
        if m not in self._inference:
            self._inference[m] = InferenceSchedule(self.num_stages, m, self.module.chunks)
        was_training = self.module.training
        self.module.eval()
        step = _Step(data_iter, m, False, return_logits)
        try:
            with no_grad():
                loss = self._run(self._inference[m], step)
        finally:
            self.module.train(was_training)
        if not return_logits:
            return loss
        outputs = [step.logits[i] for i in sorted(step.logits)]
        if not outputs:
            return loss, None
        if isinstance(outputs[0], tuple):
            return loss, tuple(F.concat(list(parts)) for parts in zip(*outputs))
        return loss, F.concat(outputs)

    def timeline(self) -> Timeline:
        """Every rank's actions of the last step with their start and end times (``time.time()``
        seconds), merged: collective over the whole job (every rank calls it and gets the same
        timeline). Draw it with :func:`~minigrad.distributed.pipeline.plot_timeline`."""
        if not is_distributed() or get_world_size() == 1:
            return Timeline(self._events)
        rows = np.array([[e.rank, _LABELS.index(e.action), -1 if e.micro_batch is None
                          else e.micro_batch, e.chunk, e.start, e.end] for e in self._events],
                        np.float64).reshape(-1, 6)
        events = []
        for part in comm.all_gather(rows):
            for rank, label, mb, chunk, start, end in np.asarray(part).tolist():
                events.append(TimelineEvent(int(rank), _LABELS[int(label)],
                                            None if mb < 0 else int(mb), int(chunk), start, end))
        return Timeline(events)

    def register_action_hook(self, hook: Callable[["PipelineEngine", A.Action], None]) -> None:
        """Call ``hook(engine, action)`` after every action this rank runs (a profiler, a memory
        probe)."""
        self._action_hooks.append(hook)

    def save_state_dict(self, save_dir: str) -> list[str]:
        """Write the model's layers, one file per global layer index (see
        :meth:`PipelineModule.save_state_dict`); only data-parallel replica 0 of each stage
        writes. Returns the paths this rank wrote."""
        coord = self.module.topology.get_coord(self.rank)
        if getattr(coord, "data", 0) != 0:
            return []
        return self.module.save_state_dict(save_dir)

    def load_state_dir(self, load_dir: str, strict: bool = True) -> None:
        """Load this stage's layers from a checkpoint directory (written with any number of
        stages), then broadcast every tied weight from its lowest owning stage. Collective."""
        self.module.load_state_dir(load_dir, strict=strict)
        self._broadcast_tied_weights()

    def save_checkpoint(self, save_dir: str, tag: str | None = None,
                        client_state: dict | None = None) -> str:
        """DeepSpeed's engine checkpoint: the module and optimizer (Adam moments and step counts
        resharded like their parameters), ``global_steps`` and ``client_state`` (plain values
        and arrays) saved with ``dist.checkpoint.save`` to ``save_dir/tag`` (default
        ``global_step<N>``), and ``save_dir/latest`` naming ``tag``. Collective; returns the
        checkpoint directory. The checkpoint loads into any layout, pipeline or not.

        Example::

            engine.save_checkpoint("ckpt", client_state={"epoch": 3})
        """
        return seams.CHECKPOINT.value.save_checkpoint(self, save_dir, tag, client_state or {})

    def load_checkpoint(self, load_dir: str, tag: str | None = None) -> tuple:
        """Load what :meth:`save_checkpoint` wrote (``tag`` None: the one ``load_dir/latest``
        names), whatever stage count or layout saved it. Returns ``(path, client_state)``, or
        ``(None, None)`` when there is no checkpoint (DeepSpeed's convention). Collective."""
        return seams.CHECKPOINT.value.load_checkpoint(self, load_dir, tag)

    def is_first_stage(self) -> bool:
        """Whether this rank runs the model's first layers (it reads the inputs)."""
        return self.module.is_first_stage

    def is_last_stage(self) -> bool:
        """Whether this rank runs the model's last layers (it reads the labels)."""
        return self.module.is_last_stage

    def forward(self, *args, **kwargs):
        """Not available: a pipeline runs whole steps (:meth:`train_batch`, :meth:`eval_batch`)."""
        raise self._pipeline_mode("forward")

    def backward(self, *args, **kwargs):
        """Not available: the schedule runs the backwards inside :meth:`train_batch`."""
        raise self._pipeline_mode("backward")

    def step(self, *args, **kwargs):
        """Not available: :meth:`train_batch` steps the optimizer at the end of the schedule."""
        raise self._pipeline_mode("step")

    __call__ = forward

    def __repr__(self) -> str:
        return (f"PipelineEngine(stage {self.stage_id} of {self.num_stages}, rank {self.rank}, "
                f"{self.schedule!r})")

    # -- running a step --------------------------------------------------------------------------
    @staticmethod
    def _pipeline_mode(what: str) -> PipelineError:
        return PipelineError(
            f"PipelineEngine.{what}: only train_batch() is accessible in pipeline mode "
            f"(and eval_batch() to evaluate): a step runs every micro-batch's forward and "
            f"backward in the schedule's order")

    def _check_usable(self, op: str) -> None:
        if self._failed is not None:
            raise PipelineError(
                f"PipelineEngine.{op}: an earlier step failed ({self._failed}); its messages may "
                f"still be in flight, so this pipeline cannot run another step (restart the job)")

    def _run(self, schedule: Schedule, step: _Step) -> float:
        """Run ``schedule``'s program of this stage, then reduce and share the mean loss."""
        self._step, self._events = step, []
        action = None
        try:
            with self.module.engine_step():
                for action in schedule.actions(self.stage_id):
                    start = time.time()
                    self._run_action[type(action)](action)
                    self._record(action, start, time.time())
        except Aborted as e:
            self._fail(e.reason, skip=e.origin)
            raise PipelineError(
                f"PipelineEngine: rank {self.rank} (stage {self.stage_id}) stopped at {action!r}: "
                f"{e.reason}") from None
        except Exception as e:
            self._fail(f"stage {self.stage_id} (rank {self.rank}) failed at {action!r} of step "
                       f"{self.global_steps}: {type(e).__name__}: {e}")
            raise
        finally:
            self._step = None
        return self._mean_loss(step)

    def _fail(self, reason: str, skip: int | None = None) -> None:
        """Remember the failure and pass it on to the neighbours (who may wait for this rank)."""
        self._failed = reason
        for dst in self._peers:
            if dst != skip:
                try:
                    self._transport.abort(reason, dst)
                except Exception:  # noqa: BLE001 - the neighbour may be gone already
                    pass

    def _record(self, action: A.Action, start: float, end: float) -> None:
        event = TimelineEvent.of(self.rank, action, start, end)
        self._events.append(event)
        tracer = seams.TRACER.value  # the profiler, when one runs: the same events
        if tracer is not None:
            name = event.action if event.micro_batch is None else (
                f"{event.action} mb{event.micro_batch}")
            tracer.event(name, "pipeline", start, end, stage=self.stage_id)
        for hook in self._action_hooks:
            hook(self, action)

    def _mean_loss(self, step: _Step) -> float:
        """The mean micro-batch loss of the step, averaged over the last stage's data-parallel
        group and broadcast from the last stage over the pipeline."""
        value = None
        if self.module.is_last_stage:
            value = np.array([sum(step.losses[m] for m in sorted(step.losses))
                              / step.micro_batches])
            if self._data_group is not None:
                value = comm.all_reduce(value, "avg", self._data_group)
        if self._pipe_group is not None:
            value = comm.broadcast(value, self._pipe_ranks[-1], self._pipe_group)
        return float(np.asarray(value)[0])

    # -- data ------------------------------------------------------------------------------------
    def _item(self, m: int) -> list:
        """Micro-batch ``m``'s ``[inputs, labels]``: items are pulled in micro-batch order, so
        item m is micro-batch m whatever order the schedule runs the forwards in."""
        step = self._step
        while len(step.items) <= m:
            step.items.append(self._pull(len(step.items)))
        return step.items[m]

    def _pull(self, m: int) -> list:
        step = self._step
        it = step.data_iter
        role = "inputs" if self.module.is_first_stage else "labels"
        if not hasattr(it, "__next__"):
            raise TypeError(
                f"PipelineEngine: stage {self.stage_id} reads the {role}, so data_iter must be an "
                f"iterator of (inputs, labels) items, e.g. iter(RepeatingLoader(loader)); got "
                f"{type(it).__name__}")
        try:
            item = next(it)
        except StopIteration:
            raise PipelineError(
                f"PipelineEngine: data_iter ran out after {m} of {step.micro_batches} "
                f"micro-batches on stage {self.stage_id}; wrap the loader in RepeatingLoader"
            ) from None
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(
                f"PipelineEngine: micro-batch {m} from data_iter is a {type(item).__name__}; "
                f"expected a pair (inputs, labels)")
        inputs, labels = item
        return [_to_tensors(inputs) if self.module.is_first_stage else None,
                _to_tensors(labels) if self.module.is_last_stage else None]

    def _loss(self, output, m: int) -> Tensor:
        item = self._item(m)
        labels, item[1] = item[1], None
        loss_fn = self.module.loss_fn
        loss = output if loss_fn is None else loss_fn(output, labels)
        if not (isinstance(loss, Tensor) and loss.size == 1 and loss.dtype.kind == "f"):
            what = (f"a Tensor of shape {loss.shape} and dtype {loss.dtype.name}"
                    if isinstance(loss, Tensor) else f"a {type(loss).__name__}")
            source = "loss_fn(outputs, labels)" if loss_fn else "the last layer (no loss_fn)"
            raise PipelineError(
                f"PipelineEngine: on stage {self.stage_id}, {source} of micro-batch {m} gave "
                f"{what}; the loss must be a float Tensor with one element")
        return loss

    # -- actions ---------------------------------------------------------------------------------
    def _forward(self, a: A.Forward) -> None:
        step, key = self._step, (a.micro_batch, a.chunk)
        position = A.logical_stage(self.stage_id, a.chunk, self.num_stages)
        if position == 0:
            item = self._item(a.micro_batch)
            x, item[0] = item[0], None
        else:
            x = step.inputs[key]
        if not step.training:
            step.inputs.pop(key, None)
        out = self.module(x, chunk=a.chunk)
        if position == self._last_position:
            loss = self._loss(out, a.micro_batch)
            step.losses[a.micro_batch] = float(loss.item())
            step.outputs[key] = (loss,)
            if step.keep_outputs:
                step.logits[a.micro_batch] = out
        else:
            step.outputs[key] = _as_tuple(out)
            step.as_tuple[key] = isinstance(out, tuple)
        if not step.training and position == self._last_position:
            del step.outputs[key]

    def _send_activation(self, a: A.SendActivation) -> None:
        step, key = self._step, (a.micro_batch, a.chunk)
        outputs = step.outputs[key] if step.training else step.outputs.pop(key)
        self._transport.send([t.data for t in outputs], self._peer_rank(a), step.as_tuple[key])

    def _recv_activation(self, a: A.RecvActivation) -> None:
        step, key = self._step, (a.micro_batch, a.chunk)
        arrays, as_tuple = self._transport.recv(self._peer_rank(a))
        self._check_signature(a, arrays, as_tuple)
        tensors = tuple(Tensor(array) for array in arrays)
        if step.training:
            floats = _floats(tensors)
            if floats:
                self._gm.attach(floats)  # leaves whose gradients backward computes
        step.inputs[key] = tensors if as_tuple else tensors[0]

    def _check_signature(self, a: A.RecvActivation, arrays: list, as_tuple: bool) -> None:
        """The first micro-batch of the step fixes the number of tensors and their dtypes."""
        first = self._step.signatures.setdefault(a.chunk, (a.micro_batch, arrays, as_tuple))
        m0, arrays0, tuple0 = first
        same = (tuple0 == as_tuple and len(arrays0) == len(arrays)
                and all(x.dtype == y.dtype for x, y in zip(arrays0, arrays)))
        if not same:
            peer = a.peer(self.stage_id, self.num_stages)[0]
            raise PipelineError(
                f"PipelineEngine: stage {self.stage_id} received micro-batch {a.micro_batch} "
                f"(chunk {a.chunk}) from stage {peer} as {_signature(arrays, as_tuple)}, but "
                f"micro-batch {m0} of this step came as {_signature(arrays0, tuple0)}: within a "
                f"step every micro-batch must pass the same number of tensors with the same "
                f"dtypes between stages (shapes may differ)")

    def _roots(self, key: tuple, position: int) -> tuple[list, list]:
        """The tensors a backward starts from and their gradients: the loss (gradient 1 / M) on
        the last logical stage, else the float outputs and the received gradients."""
        outputs = self._step.outputs[key]
        if position == self._last_position:
            loss = outputs[0]
            seed = mean_loss_seed(loss, self._step.micro_batches)
            return [loss], [seed if self.scaler is None else self.scaler.scale(seed)]
        grads = self._step.output_grads.pop(key)
        return _floats(outputs), [Tensor(g) for g in grads]

    def _stage_inputs(self, key: tuple, position: int) -> list:
        """The float inputs whose gradients go to the previous logical stage (none on the
        first)."""
        return [] if position == 0 else _floats(_as_tuple(self._step.inputs[key]))

    def _keep_input_grads(self, key: tuple, position: int, inputs: list, grads) -> None:
        """Keep the input gradients for ``SendGrad`` (zeros where none arrived; an empty message
        when the input has no float tensor)."""
        if position > 0:
            self._step.input_grads[key] = [
                g.data if g is not None else x.xp.zeros(x.shape, x.dtype)
                for x, g in zip(inputs, grads)]

    def _release(self, key: tuple) -> None:
        """Drop the micro-batch's tensors: its activations are freed."""
        self._step.inputs.pop(key, None)
        self._step.outputs.pop(key, None)

    def _backward(self, a: A.Backward) -> None:
        key = (a.micro_batch, a.chunk)
        position = A.logical_stage(self.stage_id, a.chunk, self.num_stages)
        ys, dys = self._roots(key, position)
        inputs = self._stage_inputs(key, position)
        if ys:
            self._gm.backward(ys, dys, release=False)
        self._keep_input_grads(key, position, inputs, [x.grad for x in inputs])
        self._release(key)

    def _backward_input(self, a: A.BackwardInput) -> None:
        key = (a.micro_batch, a.chunk)
        position = A.logical_stage(self.stage_id, a.chunk, self.num_stages)
        ys, dys = self._roots(key, position)
        inputs = self._stage_inputs(key, position)
        grads = [None] * len(inputs)
        if ys:
            handle = self._step.handles[key] = self._gm.backward_input(ys, dys, inputs=inputs)
            grads = handle.input_grads
        self._keep_input_grads(key, position, inputs, grads)

    def _backward_weight(self, a: A.BackwardWeight) -> None:
        key = (a.micro_batch, a.chunk)
        handle = self._step.handles.pop(key, None)
        if handle is not None:
            self._gm.backward_weight(handle)
        self._release(key)

    def _send_grad(self, a: A.SendGrad) -> None:
        grads = self._step.input_grads.pop((a.micro_batch, a.chunk))
        self._transport.send(grads, self._peer_rank(a))

    def _recv_grad(self, a: A.RecvGrad) -> None:
        key = (a.micro_batch, a.chunk)
        arrays, _ = self._transport.recv(self._peer_rank(a))
        outputs = _floats(self._step.outputs[key])
        expected = [(tuple(t.shape), t.dtype) for t in outputs]
        actual = [(tuple(g.shape), np.dtype(g.dtype)) for g in arrays]
        if actual != expected:
            raise PipelineError(
                f"PipelineEngine: stage {self.stage_id} received gradients of micro-batch "
                f"{a.micro_batch} (chunk {a.chunk}) shaped {_signature(arrays, True)}, but its "
                f"float outputs are {_signature([t.data for t in outputs], True)}")
        self._step.output_grads[key] = arrays

    def _reduce_tied_grads(self, a: A.ReduceTiedGrads) -> None:
        weights = self.module.tied_weights()
        for key, group in self._tie_groups.items():
            _all_reduce_into_grads(weights[key], group, 1.0)

    def _reduce_grads(self, a: A.ReduceGrads) -> None:
        if self._data_group is not None:
            params = [p for p in self.module.parameters() if p.grad is not None]
            _all_reduce_into_grads(params, self._data_group, 1.0 / self._data_group.size,
                                   self.reduce_dtype)

    def _optimizer_step(self, a: A.OptimizerStep) -> None:
        if self.scaler is None:
            self.optimizer.step()
        else:  # collective over the scaler's group: every stage runs OptimizerStep last
            self.scaler.step(self.optimizer)
            self.scaler.update()
        for p in self.module.parameters():
            p.grad = None


def _zero_redundancy(optimizer, group: Group) -> ZeroRedundancyOptimizer:
    """The same optimizer (class, param groups, hyper-parameters) with its state sharded over the
    stage's data-parallel ``group`` (ZeRO-1): each replica updates its shard, then all-gather."""
    groups = [dict(g) for g in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), group=group)


def _check_optimizer(optimizer, module: PipelineModule) -> None:
    """The optimizer must step only this stage's parameters (each stage steps its own)."""
    if optimizer is None:
        return
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(
            f"PipelineEngine: optimizer must be a minigrad Optimizer (or None), got "
            f"{type(optimizer).__name__}")
    own = {id(p) for p in module.parameters()}
    foreign = [p for g in groups for p in g["params"] if id(p) not in own]
    if foreign:
        raise ValueError(
            f"PipelineEngine: the optimizer holds {len(foreign)} parameter(s) that are not this "
            f"stage's (first: shape {foreign[0].shape}); build it from module.parameters() of "
            f"the PipelineModule")
