"""DeepSpeed's configuration: a JSON file or a dict, read and checked once, before any engine.

:class:`DeepSpeedConfig` holds what the engines need, with DeepSpeed's defaults and DeepSpeed's
rules: the three batch sizes obey ``train_batch_size == train_micro_batch_size_per_gpu *
gradient_accumulation_steps * data-parallel world size`` (a missing one is derived, any two
suffice), ``fp16`` and ``bf16`` exclude each other, ``loss_scale`` 0 means dynamic scaling.
Every error names the key, what was expected and what was given. A top-level key minigrad does
not use is accepted with one warning per key and process (DeepSpeed ignores many keys too).
The full mapping onto minigrad is in ``docs/deepspeed.md``.

Example::

    cfg = DeepSpeedConfig({"train_batch_size": 32, "gradient_accumulation_steps": 2},
                          world_size=2)
    cfg.train_micro_batch_size_per_gpu          # -> 8
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError", "load_config"]

#: top-level keys that minigrad reads (the others are accepted with a warning)
KNOWN_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "bfloat16",
    "zero_optimization", "steps_per_print", "wall_clock_breakdown", "dataloader_drop_last",
})
#: fp16 keys and DeepSpeed's defaults
FP16_DEFAULTS = {"enabled": False, "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
#: fp16 keys accepted without effect here (DeepSpeed's knobs of its own fp16 optimizer)
FP16_ACCEPTED = {"auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads"}
_WARNED: set[str] = set()  # top-level keys already warned about in this process


class DeepSpeedConfigError(ValueError):
    """A DeepSpeed configuration that cannot be honoured (the message names the key)."""


def _reject_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DeepSpeedConfigError(f"DeepSpeed config: duplicate key {key!r}")
        out[key] = value
    return out


def load_config(source) -> dict:
    """The config as a dict: ``source`` is a dict (copied) or the path of a JSON file. Bad JSON
    raises naming the file, the line and the column."""
    if isinstance(source, dict):
        return dict(source)
    if not isinstance(source, (str, os.PathLike)):
        raise DeepSpeedConfigError(
            f"DeepSpeed config: expected a dict or the path of a JSON file, got "
            f"{type(source).__name__}")
    path = os.fspath(source)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: cannot read the config file {path!r}: {e.strerror}") from None
    try:
        config = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as e:
        raise DeepSpeedConfigError(
            f"DeepSpeed config file {path}: invalid JSON at line {e.lineno} column {e.colno}: "
            f"{e.msg}") from None
    except DeepSpeedConfigError as e:
        raise DeepSpeedConfigError(f"{e} in {path}") from None
    if not isinstance(config, dict):
        raise DeepSpeedConfigError(
            f"DeepSpeed config file {path}: expected a JSON object at the top, got "
            f"{type(config).__name__}")
    return config


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _int(config: dict, key: str, minimum: int, default=None, where: str = "") -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: {where}{key} must be an int >= {minimum}, got "
            f"{_describe(value)}")
    return value


def _number(config: dict, key: str, minimum: float, default, where: str = "") -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise DeepSpeedConfigError(
            f"DeepSpeed config: {where}{key} must be a number >= {minimum:g}, got "
            f"{_describe(value)}")
    return float(value)


def _bool(config: dict, key: str, default: bool, where: str = "") -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise DeepSpeedConfigError(
            f"DeepSpeed config: {where}{key} must be true or false, got {_describe(value)}")
    return value


def _section(config: dict, key: str) -> dict:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise DeepSpeedConfigError(
            f"DeepSpeed config: {key} must be an object (a dict), got {_describe(value)}")
    return value


class DeepSpeedConfig:
    """A checked DeepSpeed config for a job whose data-parallel world size is ``world_size``.

    Attributes: ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps``, ``optimizer`` (``{"type", "params"}`` or None),
    ``scheduler`` (same), ``gradient_clipping`` (0: off), ``fp16`` (the fp16 section with
    DeepSpeed's defaults filled in), ``fp16_enabled``, ``bf16_enabled``, ``zero_stage``,
    ``steps_per_print``, ``wall_clock_breakdown``, ``dataloader_drop_last``, ``raw`` (the dict).
    """

    def __init__(self, config: dict, world_size: int):
        self.raw = config
        self.world_size = world_size
        for key in sorted(set(config) - KNOWN_KEYS):
            if key not in _WARNED:
                _WARNED.add(key)
                warnings.warn(f"DeepSpeed config: key {key!r} is not used by minigrad (accepted "
                              f"and ignored; see docs/deepspeed.md)", UserWarning, stacklevel=3)
        self._batch_sizes(config)
        self.optimizer = self._typed_section(config, "optimizer")
        self.scheduler = self._typed_section(config, "scheduler")
        self.gradient_clipping = _number(config, "gradient_clipping", 0.0, 0.0)
        self._precision(config)
        self._zero(config)
        self.steps_per_print = _int(config, "steps_per_print", 1, 10)
        self.wall_clock_breakdown = _bool(config, "wall_clock_breakdown", False)
        self.dataloader_drop_last = _bool(config, "dataloader_drop_last", False)

    def _batch_sizes(self, config: dict) -> None:
        """DeepSpeed's rule: any two of the three give the third (one alone: accumulation 1)."""
        train = _int(config, "train_batch_size", 1)
        micro = _int(config, "train_micro_batch_size_per_gpu", 1)
        accum = _int(config, "gradient_accumulation_steps", 1)
        world = self.world_size
        if train is None and micro is None:
            raise DeepSpeedConfigError(
                "DeepSpeed config: either train_batch_size or train_micro_batch_size_per_gpu "
                "must be given")
        if train is not None and micro is not None and accum is None:
            accum = max(train // (micro * world), 1)
        elif train is not None and accum is not None and micro is None:
            micro = max(train // (accum * world), 1)
        elif train is None:
            accum = 1 if accum is None else accum
            train = micro * accum * world
        elif micro is None:  # train alone
            accum = 1
            micro = max(train // world, 1)
        if train != micro * accum * world:
            raise DeepSpeedConfigError(
                f"DeepSpeed config: train_batch_size ({train}) must equal "
                f"train_micro_batch_size_per_gpu ({micro}) * gradient_accumulation_steps "
                f"({accum}) * data-parallel world size ({world}) = {micro * accum * world}")
        self.train_batch_size = train
        self.train_micro_batch_size_per_gpu = micro
        self.gradient_accumulation_steps = accum

    @staticmethod
    def _typed_section(config: dict, key: str) -> dict | None:
        if config.get(key) is None:
            return None
        section = _section(config, key)
        kind = section.get("type")
        if not isinstance(kind, str):
            raise DeepSpeedConfigError(
                f"DeepSpeed config: {key}.type must be a string such as "
                f"{'Adam' if key == 'optimizer' else 'WarmupLR'}, got {_describe(kind)}")
        params = section.get("params", {})
        if not isinstance(params, dict):
            raise DeepSpeedConfigError(
                f"DeepSpeed config: {key}.params must be an object (a dict), got "
                f"{_describe(params)}")
        return {"type": kind, "params": dict(params)}

    def _precision(self, config: dict) -> None:
        fp16 = _section(config, "fp16")
        bf16 = _section(config, "bf16") or _section(config, "bfloat16")
        unknown = set(fp16) - set(FP16_DEFAULTS) - FP16_ACCEPTED
        if unknown:
            raise DeepSpeedConfigError(
                f"DeepSpeed config: fp16 has unknown key(s) {sorted(unknown)}; expected "
                f"{sorted(FP16_DEFAULTS)}")
        where = "fp16."
        self.fp16 = {
            "enabled": _bool(fp16, "enabled", False, where),
            "loss_scale": _number(fp16, "loss_scale", 0.0, 0, where),
            "initial_scale_power": _int(fp16, "initial_scale_power", 0, 16, where),
            "loss_scale_window": _int(fp16, "loss_scale_window", 1, 1000, where),
            "hysteresis": _int(fp16, "hysteresis", 1, 2, where),
            "min_loss_scale": _number(fp16, "min_loss_scale", 0.0, 1, where),
        }
        self.fp16_enabled = self.fp16["enabled"]
        self.bf16_enabled = _bool(bf16, "enabled", False, "bf16.")
        if self.fp16_enabled and self.bf16_enabled:
            raise DeepSpeedConfigError(
                "DeepSpeed config: fp16.enabled and bf16.enabled are both true; bf16 and fp16 "
                "modes cannot be enabled at the same time")

    def _zero(self, config: dict) -> None:
        zero = config.get("zero_optimization", {})
        if isinstance(zero, bool):  # DeepSpeed's old spelling: true means stage 1
            zero = {"stage": int(zero)}
        if not isinstance(zero, dict):
            raise DeepSpeedConfigError(
                f"DeepSpeed config: zero_optimization must be an object (a dict), got "
                f"{_describe(zero)}")
        stage = zero.get("stage", 0)
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise DeepSpeedConfigError(
                f"DeepSpeed config: zero_optimization.stage must be 0, 1, 2 or 3, got "
                f"{_describe(stage)}")
        for key in ("offload_optimizer", "offload_param"):
            device = (zero.get(key) or {}).get("device", "none")
            if device not in ("none", None):
                raise DeepSpeedConfigError(
                    f"DeepSpeed config: zero_optimization.{key}.device must be \"none\" in "
                    f"minigrad (no offload), got {device!r}")
        self.zero_stage = stage

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value of a top-level key (as given)."""
        return self.raw.get(key, default)


class ConfigAccessors:
    """DeepSpeed's engine accessors of the config (``engine.train_batch_size()``, ...), shared by
    the plain and the pipeline engine; the engine holds its :class:`DeepSpeedConfig` as
    ``_config`` and its optimizer as ``optimizer``."""

    _config: DeepSpeedConfig

    def train_batch_size(self) -> int:
        """Samples per optimizer step over all data-parallel ranks (replicas)."""
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        """Samples per micro-step (micro-batch) on one rank."""
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        """Micro-steps (micro-batches) per optimizer step."""
        return self._config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        """The ZeRO stage of the config (0 to 3; 0 or 1 with a pipeline)."""
        return self._config.zero_stage

    def fp16_enabled(self) -> bool:
        """Whether the config's ``fp16`` section is enabled (autocast float16, loss scaling)."""
        return self._config.fp16_enabled

    def bfloat16_enabled(self) -> bool:
        """Whether the config's ``bf16`` section is enabled (autocast bfloat16)."""
        return self._config.bf16_enabled

    def gradient_clipping(self) -> float:
        """The clipping norm (0: no clipping)."""
        return self._config.gradient_clipping

    @property
    def config(self) -> dict:
        """The config as given (a dict)."""
        return self._config.raw

    def get_lr(self) -> list[float]:
        """The learning rate of each parameter group of the engine's optimizer."""
        return [g["lr"] for g in self.optimizer.param_groups]
