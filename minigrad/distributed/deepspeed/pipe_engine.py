"""``DeepSpeedPipelineEngine``: what ``deepspeed.initialize`` returns for a ``PipelineModule``.

It *is* minigrad's :class:`~minigrad.distributed.pipeline.PipelineEngine` (schedules, tied and
data-parallel gradients, ZeRO-1, loss scaling, checkpoints), built from the DeepSpeed config:
``gradient_accumulation_steps`` micro-batches per step, ``zero_optimization.stage``, the
``fp16`` loss scaler. What it adds is DeepSpeed's data path: with ``training_data`` the first and
last stages build DeepSpeed's loader (micro-batches of ``train_micro_batch_size_per_gpu``,
sharded over the data-parallel replicas) wrapped in :class:`RepeatingLoader`, so that
``engine.train_batch()`` needs no argument; plus the learning-rate scheduler step after each
optimizer step and DeepSpeed's accessors.

Example::

    engine, _, _, _ = deepspeed.initialize(args=args, model=net,
                                           model_parameters=net.parameters(),
                                           training_data=trainset)
    for step in range(100):
        loss = engine.train_batch()
"""

from __future__ import annotations

from minigrad.distributed.checkpoint.engine import EngineCheckpoints
from minigrad.distributed.deepspeed.components import (
    build_loader,
    build_scaler,
    configure_scheduler,
    precision_context,
)
from minigrad.distributed.deepspeed.config import (
    ConfigAccessors,
    DeepSpeedConfig,
    DeepSpeedConfigError,
)
from minigrad.distributed.pipeline.engine import PipelineEngine
from minigrad.distributed.pipeline.errors import PipelineError
from minigrad.distributed.pipeline.loader import RepeatingLoader
from minigrad.distributed.pipeline.module import PipelineModule

__all__ = ["DeepSpeedPipelineEngine"]


class DeepSpeedPipelineEngine(ConfigAccessors, PipelineEngine):
    """A :class:`PipelineEngine` configured by a DeepSpeed config (see the module docstring).

    ``training_dataloader`` (first and last stages, with ``training_data``) and
    ``data_iterator`` (the repeating iterator ``train_batch()`` reads) are DeepSpeed's
    attributes; ``lr_scheduler`` (the one passed, else the config's ``scheduler`` section) steps
    after every step that was not skipped and travels with the checkpoints.

    Example::

        loss = engine.train_batch()              # pulls gradient_accumulation_steps batches
    """

    def __init__(self, module: PipelineModule, optimizer, config: DeepSpeedConfig,
                 training_data=None, lr_scheduler=None, collate_fn=None):
        if config.gradient_clipping > 0:
            raise DeepSpeedConfigError(
                f"DeepSpeed config: gradient_clipping must be 0 with a PipelineModule in "
                f"minigrad (the pipeline engine does not clip), got {config.gradient_clipping}")
        self._config = config
        super().__init__(module, optimizer, micro_batches=config.gradient_accumulation_steps,
                         zero_stage=config.zero_stage, scaler=build_scaler(config, module))
        self.lr_scheduler = configure_scheduler(lr_scheduler, config.scheduler, self.optimizer)
        self.training_dataloader = None
        self.data_iterator = None
        if training_data is not None and (self.is_first_stage() or self.is_last_stage()):
            coord = module.topology.get_coord(self.rank)
            replicas = module.topology.get_dim("data")
            self.training_dataloader = build_loader(
                training_data, config, replicas, getattr(coord, "data", 0), collate_fn)
            self.data_iterator = iter(RepeatingLoader(self.training_dataloader))

    def set_dataloader(self, loader) -> None:
        """Read the training micro-batches from ``loader`` (repeated) from now on."""
        if self.is_first_stage() or self.is_last_stage():
            self.training_dataloader = loader
            self.data_iterator = iter(RepeatingLoader(loader))

    def train_batch(self, data_iter=None) -> float:
        """One step over ``gradient_accumulation_steps`` micro-batches from ``data_iter``
        (default: the loader built from ``training_data``), under the config's precision; then
        the scheduler's step. Returns the mean loss, the same float on every rank."""
        if data_iter is None:
            data_iter = self.data_iterator
            if data_iter is None and (self.is_first_stage() or self.is_last_stage()):
                raise PipelineError(
                    f"DeepSpeedPipelineEngine.train_batch: stage {self.stage_id} reads data but "
                    f"no data_iter was given and deepspeed.initialize had no training_data")
        skipped = None if self.scaler is None else self.scaler.skipped_steps
        with precision_context(self._config):
            loss = super().train_batch(data_iter)
        if self.lr_scheduler is not None and (
                skipped is None or self.scaler.skipped_steps == skipped):
            self.lr_scheduler.step()
        return loss

    def load_checkpoint(self, load_dir, tag=None, load_lr_scheduler_states: bool = True,
                        **kwargs) -> tuple:
        """The pipeline engine's ``load_checkpoint``; the scheduler continues from its saved
        step unless ``load_lr_scheduler_states=False`` (DeepSpeed's keyword)."""
        return EngineCheckpoints().load_checkpoint(self, load_dir, tag,
                                                   load_lr_scheduler=load_lr_scheduler_states)

    def eval_batch(self, data_iter, return_logits: bool = False, micro_batches=None):
        """The pipeline engine's ``eval_batch`` under the config's precision."""
        with precision_context(self._config):
            return super().eval_batch(data_iter, return_logits, micro_batches)
