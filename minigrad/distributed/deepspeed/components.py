"""What a DeepSpeed config builds out of minigrad's own parts: the optimizer, the learning-rate
scheduler, the loss scaler, the autocast context and the training data loader (the mapping is in
``docs/deepspeed.md``).

Nothing here trains: the engines (:mod:`.engine`, :mod:`.pipe_engine`) call these once, at
``deepspeed.initialize``.

Example::

    opt = build_optimizer({"type": "AdamW", "params": {"lr": 1e-3}}, net.parameters())
"""

from __future__ import annotations

import contextlib
import inspect

import minigrad.optimizer as optim
from minigrad.amp import GradScaler, autocast
from minigrad.autodiff.tensor import Tensor
from minigrad.data import Collator, DataLoader, RandomSampler
from minigrad.distributed.deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from minigrad.distributed.deepspeed.runtime import lr_schedules
from minigrad.distributed.runtime.log import get_logger
from minigrad.optimizer.optimizer import Optimizer

__all__ = ["TensorCollator", "build_loader", "build_optimizer", "build_scaler", "build_scheduler",
           "configure_scheduler", "precision_context"]

#: DeepSpeed's optimizer types minigrad maps (lower case, as DeepSpeed compares them), with the
#: params each accepts and their defaults (DeepSpeed's FusedAdam: lr 1e-3, weight decay 0)
_ADAM_PARAMS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                "adam_w_mode": True, "torch_adam": False, "bias_correction": True,
                "amsgrad": False}
_SGD_PARAMS = {"lr": None, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
               "nesterov": False}
OPTIMIZERS = {"adam": _ADAM_PARAMS, "adamw": _ADAM_PARAMS, "sgd": _SGD_PARAMS}


def _check_known(section: str, kind: str, given: dict, accepted) -> None:
    """Raise naming the keys of ``<section>.params`` that ``kind`` does not take."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: {section}.params for {kind} has unknown key(s) {unknown}; "
            f"expected some of {sorted(accepted)}")


def build_optimizer(section: dict, params) -> Optimizer:
    """The optimizer of the config's ``optimizer`` section over ``params``. ``Adam`` follows
    DeepSpeed: decoupled weight decay (AdamW) unless ``"adam_w_mode": false``."""
    kind = section["type"].lower()
    if kind not in OPTIMIZERS:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: optimizer.type must be one of Adam, AdamW, SGD (any case) in "
            f"minigrad, got {section['type']!r}")
    accepted = OPTIMIZERS[kind]
    given = section["params"]
    _check_known("optimizer", section["type"], given, accepted)
    p = {**accepted, **given}
    if kind == "sgd":
        if p["lr"] is None:
            raise DeepSpeedConfigError(
                "DeepSpeed config: optimizer.params.lr is required for SGD, got nothing")
        if p["dampening"]:
            raise DeepSpeedConfigError(
                f"DeepSpeed config: optimizer.params.dampening must be 0 in minigrad's SGD, got "
                f"{p['dampening']!r}")
        return optim.SGD(params, lr=p["lr"], momentum=p["momentum"], nesterov=p["nesterov"],
                         weight_decay=p["weight_decay"])
    for key, wanted in (("amsgrad", False), ("bias_correction", True)):
        if p[key] != wanted:
            raise DeepSpeedConfigError(
                f"DeepSpeed config: optimizer.params.{key} must be {str(wanted).lower()} in "
                f"minigrad, got {p[key]!r}")
    cls = optim.AdamW if kind == "adamw" or p["adam_w_mode"] else optim.Adam
    return cls(params, lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
               weight_decay=p["weight_decay"])


def build_scheduler(section: dict, optimizer: Optimizer):
    """The scheduler of the config's ``scheduler`` section driving ``optimizer``: one of
    DeepSpeed's (``WarmupLR``, ``WarmupDecayLR``, ``WarmupCosineLR``, ``OneCycle``,
    ``LRRangeTest``; exact case, as DeepSpeed looks the name up) built with ``params`` as its
    keyword arguments."""
    kind = section["type"]
    if kind not in lr_schedules.VALID_LR_SCHEDULES:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: scheduler.type must be one of "
            f"{', '.join(sorted(lr_schedules.VALID_LR_SCHEDULES))} (exact case), got {kind!r}; "
            f"for another schedule pass a minigrad scheduler as "
            f"deepspeed.initialize(lr_scheduler=...)")
    cls = getattr(lr_schedules, kind)
    signature = inspect.signature(cls)
    accepted = [name for name in signature.parameters if name != "optimizer"]
    given = section["params"]
    _check_known("scheduler", kind, given, accepted)
    missing = [name for name in accepted if name not in given
               and signature.parameters[name].default is inspect.Parameter.empty]
    if missing:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: scheduler.params for {kind} must give {missing}, got "
            f"{sorted(given)}")
    return cls(optimizer, **given)


def configure_scheduler(lr_scheduler, section: dict | None, optimizer: Optimizer):
    """The engine's scheduler, as DeepSpeed chooses it: the one passed to ``initialize`` (a
    scheduler, or a callable ``optimizer -> scheduler``) if any (a ``scheduler`` section in the
    config is then ignored, with a warning), else the config's (None without a section)."""
    if lr_scheduler is not None:
        if section is not None:
            get_logger("deepspeed").warning(
                f"deepspeed.initialize: an lr_scheduler was passed and the config has a "
                f"scheduler section ({section['type']}); using the one passed")
        if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            return lr_scheduler(optimizer)
        return lr_scheduler
    if section is None:
        return None
    return build_scheduler(section, optimizer)


def build_scaler(config: DeepSpeedConfig, module=None) -> GradScaler | None:
    """The loss scaler of the ``fp16`` section (None without fp16): ``loss_scale`` > 0 is a
    static scale, 0 a dynamic one starting at ``2 ** initial_scale_power`` that doubles after
    ``loss_scale_window`` clean steps and halves (not below ``min_loss_scale``) once
    ``hysteresis`` overflows have been seen since the last growth."""
    if not config.fp16_enabled:
        return None
    fp16 = config.fp16
    if fp16["loss_scale"] > 0:
        return GradScaler(init_scale=fp16["loss_scale"], growth_interval=0, module=module)
    init = 2.0 ** fp16["initial_scale_power"]
    return GradScaler(init_scale=init, growth_interval=fp16["loss_scale_window"],
                      hysteresis=fp16["hysteresis"],
                      min_scale=min(fp16["min_loss_scale"], init), module=module)


def precision_context(config: DeepSpeedConfig):
    """``autocast`` in float16 (``fp16``) or bfloat16 (``bf16``); a no-op context otherwise."""
    if config.fp16_enabled:
        return autocast(low_prec_dtype="float16")
    if config.bf16_enabled:
        return autocast(low_prec_dtype="bfloat16")
    return contextlib.nullcontext()


def build_loader(dataset, config: DeepSpeedConfig, data_world: int, data_rank: int,
                 collate_fn=None) -> DataLoader:
    """DeepSpeed's training loader: batches of ``train_micro_batch_size_per_gpu``, shuffled
    (seed 0) and sharded over the data-parallel ranks, like DeepSpeed's ``DistributedSampler``
    (minigrad's sampler draws a new order each epoch); ``dataloader_drop_last`` as DeepSpeed.
    Batches hold Tensors, as DeepSpeed's hold torch tensors (``data[0].to(engine.device)``)."""
    sampler = RandomSampler(dataset, batch_size=config.train_micro_batch_size_per_gpu,
                            drop_last=config.dataloader_drop_last, world_size=data_world,
                            rank=data_rank, seed=0)
    return DataLoader(dataset, sampler, collator=TensorCollator(collate_fn))


class TensorCollator:
    """``collate_fn`` (default: minigrad's :class:`Collator`), with every array of the batch
    (inside tuples, lists and dicts too) made a Tensor."""

    def __init__(self, collate_fn=None):
        self.collate_fn = Collator() if collate_fn is None else collate_fn

    def apply(self, samples):
        """The collated batch, arrays as Tensors."""
        fn = self.collate_fn
        return _tensors(fn.apply(samples) if hasattr(fn, "apply") else fn(samples))


def _tensors(value):
    if isinstance(value, (tuple, list)):
        return type(value)(_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if not isinstance(value, Tensor) and hasattr(value, "shape") and hasattr(value, "dtype"):
        return Tensor(value)
    return value
