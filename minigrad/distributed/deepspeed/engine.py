"""``DeepSpeedEngine``: DeepSpeed's training loop (``engine(x)``, ``engine.backward(loss)``,
``engine.step()``) over minigrad's own data parallelism, ZeRO, loss scaling and checkpoints.

One micro-step is ``loss = criterion(engine(x), y); engine.backward(loss); engine.step()``:

* ``engine(x)`` starts a recording of the engine's ``GradManager`` (attached to the model's
  parameters) and runs the model, under ``autocast`` with ``fp16``/``bf16``;
* ``engine.backward(loss)`` back-propagates ``loss / gradient_accumulation_steps`` (times the
  loss scale with ``fp16``); gradients accumulate in ``.grad`` over the micro-steps, and only the
  last micro-step of each accumulation (the *boundary*) averages them over the data-parallel
  ranks: the step's gradient is the mean over ranks and micro-steps, as DeepSpeed's;
* ``engine.step()`` does nothing but count, except at the boundary: unscale and check the
  gradients (``fp16``: an overflow on any rank skips the step on every rank), clip them to
  ``gradient_clipping``, step the optimizer, drop the gradients, step the learning-rate
  scheduler (not after a skipped step).

``zero_optimization.stage``: 0 averages the gradients with ``DistributedDataParallel``'s hooks
(inside its ``no_sync`` between boundaries); 1 adds ``ZeroRedundancyOptimizer`` (the optimizer's
state sharded over the ranks); 2 and 3 are ``fully_shard`` (2: the root module, parameters kept
gathered from forward to backward; 3: each child module with parameters, then the root,
parameters freed after each forward), with ``no_sync`` between boundaries. Every stage gives the
same parameters (the ZeRO tests check it against plain data parallelism).

Example::

    engine, opt, loader, sched = deepspeed.initialize(args=args, model=net,
                                                      model_parameters=net.parameters(),
                                                      training_data=trainset)
    for x, y in loader:
        loss = F.nn.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
"""

from __future__ import annotations

import contextlib

import minigrad.optimizer as optim
from minigrad.autodiff import GradManager, is_recording
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device import get_default_device
from minigrad.distributed.checkpoint.engine import EngineCheckpoints
from minigrad.distributed.comm.group import (
    get_local_rank,
    get_rank,
    get_world_size,
    is_distributed,
)
from minigrad.distributed.data_parallel.ddp import DistributedDataParallel
from minigrad.distributed.data_parallel.fully_shard import fully_shard, no_sync
from minigrad.distributed.data_parallel.zero import ZeroRedundancyOptimizer
from minigrad.distributed.deepspeed.components import (
    build_loader,
    build_optimizer,
    build_scaler,
    configure_scheduler,
    precision_context,
)
from minigrad.distributed.deepspeed.config import (
    ConfigAccessors,
    DeepSpeedConfig,
    DeepSpeedConfigError,
)
from minigrad.distributed.runtime.log import get_logger
from minigrad.module.module import Module
from minigrad.optimizer.optimizer import Optimizer

__all__ = ["DeepSpeedEngine"]

_CHECKPOINTS = EngineCheckpoints()


class DeepSpeedEngine(ConfigAccessors):
    """The engine ``deepspeed.initialize`` returns for a model that is not a ``PipelineModule``;
    see the module docstring for what ``forward``, ``backward`` and ``step`` do.

    Arguments (as ``deepspeed.initialize`` passes them): ``model``, ``config`` (a checked
    :class:`~.config.DeepSpeedConfig`), ``optimizer`` (a minigrad ``Optimizer``, a callable
    ``params -> Optimizer``, or None to build the config's), ``model_parameters`` (what the
    config's optimizer updates; default all of ``model.parameters()``), ``training_data`` (a
    map-style dataset: the engine builds ``training_dataloader`` from it), ``lr_scheduler`` (a
    scheduler or a callable ``optimizer -> scheduler``; None: the config's ``scheduler``
    section, if any), ``collate_fn``.

    Example::

        engine(x); engine.backward(loss); engine.step()
        engine.save_checkpoint("ckpt", client_state={"epoch": 1})
    """

    def __init__(self, model: Module, config: DeepSpeedConfig, optimizer=None,
                 model_parameters=None, training_data=None, lr_scheduler=None,
                 collate_fn=None):
        if not isinstance(model, Module):
            raise TypeError(f"deepspeed.initialize: model must be a minigrad Module, got "
                            f"{type(model).__name__}")
        self.module = model
        self._config = config
        self.dp_world_size = get_world_size() if is_distributed() else 1
        self.global_rank = get_rank() if is_distributed() else 0
        self.local_rank = get_local_rank() if is_distributed() else 0
        self.device = get_default_device()
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._global_grad_norm = None
        self._log = get_logger("deepspeed")
        stage = config.zero_stage
        given = None if model_parameters is None else list(model_parameters)
        self._ddp = None
        if stage in (0, 1) and self.dp_world_size > 1:  # broadcasts rank 0's weights
            self._ddp = DistributedDataParallel(model, broadcast_buffers=False)
        elif stage in (2, 3):
            _check_shardable(model, stage, optimizer, given)
            _shard(model, stage)
            given = None  # the pieces replace the parameters
        params = list(model.parameters()) if given is None else given
        self.optimizer = self._optimizer(optimizer, params)
        if stage == 1:
            groups = [dict(g) for g in self.optimizer.param_groups]
            self.optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=type(self.optimizer))
        self.basic_optimizer = self.optimizer
        self.lr_scheduler = configure_scheduler(lr_scheduler, config.scheduler, self.optimizer)
        self.scaler = build_scaler(config, model)
        self._params = list(model.parameters())
        self._gm = GradManager().attach(self._params)
        self.training_dataloader = None if training_data is None else build_loader(
            training_data, config, self.dp_world_size, self.global_rank, collate_fn)

    def _optimizer(self, optimizer, params: list) -> Optimizer:
        """The client's optimizer (an object or a factory) or the config's."""
        if optimizer is not None:
            if self._config.optimizer is not None:
                self._log.warning("deepspeed.initialize: an optimizer was passed and the config "
                                  "has an optimizer section; using the one passed")
            if isinstance(optimizer, Optimizer):
                return optimizer
            if callable(optimizer):
                return optimizer(params)
            raise TypeError(f"deepspeed.initialize: optimizer must be a minigrad Optimizer or a "
                            f"callable, got {type(optimizer).__name__}")
        if self._config.optimizer is None:
            raise DeepSpeedConfigError(
                "deepspeed.initialize: no optimizer: pass optimizer= or give the config an "
                "optimizer section ({\"type\": \"Adam\", \"params\": {\"lr\": ...}})")
        return build_optimizer(self._config.optimizer, params)

    # -- DeepSpeed's accessors (the config's: ConfigAccessors) --------------------------------
    @property
    def cur_scale(self) -> float:
        """The current loss scale (1 without ``fp16``)."""
        return 1.0 if self.scaler is None else self.scaler.get_scale()

    def get_global_grad_norm(self):
        """The gradient norm of the last step before clipping (None without clipping)."""
        return self._global_grad_norm

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-step is the last of its accumulation (DeepSpeed's rule)."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    # -- the module ------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "DeepSpeedEngine":
        """Training mode (dropout on); ``train(False)`` is :meth:`eval`, which also drops a
        recorded forward that no backward used."""
        self.module.train(mode)
        if not mode:
            self._gm.release()
        return self

    def eval(self) -> "DeepSpeedEngine":
        """Evaluation mode; forwards then record nothing for backward."""
        return self.train(False)

    def parameters(self, *args, **kwargs):
        """The module's parameters."""
        return self.module.parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs) -> dict:
        """The module's state dict."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """Load into the module."""
        return self.module.load_state_dict(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """Run the model; in training mode (and not under ``no_grad``) record it for
        :meth:`backward` (several forwards may feed one loss: the recording lasts until the
        next backward, ``step`` or ``eval``)."""
        if self.module.training and not self._gm.is_recording:
            self._gm.record()
            if not is_recording():  # under no_grad: nothing to record
                self._gm.release()
        model = self._ddp if self._ddp is not None else self.module
        with precision_context(self._config):
            return model(*args, **kwargs)

    __call__ = forward

    def backward(self, loss: Tensor, allreduce_gradients: bool = True,
                 scale_wrt_gas: bool = True, **kwargs) -> Tensor:
        """Back-propagate ``loss`` (divided by ``gradient_accumulation_steps`` when
        ``scale_wrt_gas``, times the loss scale with fp16); at the accumulation boundary the
        gradients are averaged over the data-parallel ranks. Returns ``loss``."""
        if not self._gm.is_recording:
            raise RuntimeError(
                "DeepSpeedEngine.backward: no forward was recorded; call engine(inputs) in "
                "training mode (engine.train()) before engine.backward(loss)")
        scaled = loss
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            scaled = scaled / self.gradient_accumulation_steps()
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        with self._sync_context(allreduce_gradients and self.is_gradient_accumulation_boundary()):
            self._gm.backward(scaled)
        return loss

    def _sync_context(self, sync: bool):
        if sync:
            return contextlib.nullcontext()
        if self._ddp is not None:
            return self._ddp.no_sync()
        if self._config.zero_stage in (2, 3) and self.dp_world_size > 1:
            return no_sync(self.module)
        return contextlib.nullcontext()

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self._params:
            p.grad = None

    def step(self, lr_kwargs: dict | None = None) -> None:
        """At the accumulation boundary: (fp16) unscale and check, clip, step the optimizer, drop
        the gradients, step the scheduler; count the micro-step either way."""
        self._gm.release()  # a forward since the last backward feeds no gradient now
        if self.is_gradient_accumulation_boundary():
            self._take_model_step(lr_kwargs or {})
        self.micro_steps += 1

    def _take_model_step(self, lr_kwargs: dict) -> None:
        overflow = False
        if self.scaler is not None:  # the ranks agree; an overflow leaves every gradient None
            self.scaler.unscale(self._params)
            overflow = all(p.grad is None for p in self._params)
        if not overflow:
            if self.gradient_clipping() > 0:
                norm = optim.clip_grad_norm(self._params, self.gradient_clipping())
                self._global_grad_norm = float(norm.item())
            self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update()
        self.zero_grad()
        if overflow:
            self.skipped_steps += 1
        elif self.lr_scheduler is not None:
            self.lr_scheduler.step(**lr_kwargs)
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        if self.global_steps % self._config.steps_per_print == 0 and self.global_rank == 0:
            self._log.info(f"step={self.global_steps}, skipped={self.skipped_steps}, "
                           f"lr={self.get_lr()}")

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state: dict | None = None,
                        save_latest: bool = True) -> str:
        """DeepSpeed's checkpoint: module, optimizer (sharded as it is), learning-rate
        scheduler, loss scaler, ``global_steps`` and ``client_state`` in ``save_dir/tag``
        (default ``global_step<N>``), and ``save_dir/latest`` naming ``tag``; collective, like
        ``PipelineEngine``'s (the same ``dist.checkpoint`` format: it loads into any layout).
        Returns the directory."""
        return _CHECKPOINTS.save_checkpoint(self, save_dir, tag, client_state or {})

    def load_checkpoint(self, load_dir, tag=None, load_lr_scheduler_states: bool = True,
                        **kwargs) -> tuple:
        """Load what :meth:`save_checkpoint` wrote (``tag`` None: ``load_dir/latest``); the
        scheduler continues from its saved step unless ``load_lr_scheduler_states=False``.
        Returns ``(path, client_state)``, or ``(None, None)`` when there is none."""
        return _CHECKPOINTS.load_checkpoint(self, load_dir, tag,
                                            load_lr_scheduler=load_lr_scheduler_states)

    def __repr__(self) -> str:
        return (f"DeepSpeedEngine({type(self.module).__name__}, rank {self.global_rank} of "
                f"{self.dp_world_size}, zero stage {self._config.zero_stage})")


def _check_shardable(model: Module, stage: int, optimizer, given: list | None) -> None:
    """ZeRO-2/3 replace the parameters by pieces: the optimizer must be the config's, built
    afterwards, over every parameter."""
    everything = {id(p) for p in model.parameters()}
    if optimizer is not None or (given is not None and {id(p) for p in given} != everything):
        what = (f"optimizer={type(optimizer).__name__}" if optimizer is not None else
                f"model_parameters with {len(given)} of the model's {len(everything)} "
                f"parameters")
        raise DeepSpeedConfigError(
            f"deepspeed.initialize: zero_optimization.stage {stage} shards every parameter of "
            f"the model (fully_shard), so the optimizer must be the config's over all of them; "
            f"got {what}")


def _shard(model: Module, stage: int) -> None:
    """ZeRO-3: each child module holding parameters, then the root, freed after forward; ZeRO-2:
    the root only, kept gathered until backward."""
    if stage == 3:
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=stage == 3)
