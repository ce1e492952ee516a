"""DeepSpeed's learning-rate schedulers (``deepspeed.runtime.lr_schedules``): ``WarmupLR``,
``WarmupDecayLR``, ``WarmupCosineLR``, ``OneCycle`` and ``LRRangeTest``, with DeepSpeed's
arguments, defaults and formulas.

They count *optimizer steps*, not epochs: ``last_batch_iteration`` is the index of the last step
taken (-1 before the first), ``step()`` adds one and writes each param group's ``lr`` (OneCycle
also its ``betas``), ``get_lr()`` is the rate at the current index, ``get_last_lr()`` the rates
last written, and ``state_dict()`` is DeepSpeed's ``{"last_batch_iteration": n}`` (loading it
moves the counter only: the optimizer's own state brings its rates back). Construction with
``last_batch_iteration=-1`` writes the starting rate (``WarmupLR``: ``warmup_min_lr``) and does
not step. With ``n = warmup_num_steps`` (at least 2) and ``i = last_batch_iteration``:

* ``WarmupLR``: ``min + (max - min) * g`` per group, ``g = log(i + 1) / log(n)`` ("log") or
  ``i / n`` ("linear") for ``i < n``, then 1;
* ``WarmupDecayLR``: the same warm-up, then ``g = max(0, (total - i) / max(1, total - n))``;
* ``WarmupCosineLR``: the group's rate at construction times a ratio rising from
  ``warmup_min_ratio`` to 1 as ``g``, then ``max(0, c + (1 - c) * (1 + cos(pi * k / (total -
  n))) / 2)`` with ``k = i - n + 1`` and ``c = cos_min_ratio``;
* ``OneCycle``: ``min + (max - min) * s`` where ``s`` rises 0 -> 1 over ``cycle_first_step_size``
  steps and falls back over ``cycle_second_step_size``; after the cycle ``min / (1 + rate * k /
  decay_step_size)`` (or ``min`` without decay); momentum (Adam's ``betas[0]``, ``betas[1]``
  set to 0.99 as DeepSpeed does) moves the other way between ``cycle_max_mom`` and
  ``cycle_min_mom``;
* ``LRRangeTest``: ``min * (1 + rate * (i + 1) / step_size)`` (``floor`` of the fraction with
  ``lr_range_test_staircase``).

They are not minigrad's :class:`~minigrad.optimizer.lr_scheduler.LRScheduler` subclasses: that
base steps once at construction, records ``initial_lr`` as the base rate and saves every
attribute, where DeepSpeed's start at index -1 without stepping, take their rates from their own
arguments and save only the counter. Any of them can still be passed to
``deepspeed.initialize(lr_scheduler=...)`` or named in the config's ``scheduler`` section.

Example::

    sched = WarmupLR(opt, warmup_min_lr=0, warmup_max_lr=1e-3, warmup_num_steps=1000)
    for batch in loader:
        train_step(batch)
        sched.step()
"""

from __future__ import annotations

import math

from minigrad.distributed.runtime.log import get_logger
from minigrad.optimizer.optimizer import Optimizer

__all__ = ["LRRangeTest", "OneCycle", "VALID_LR_SCHEDULES", "WarmupCosineLR", "WarmupDecayLR",
           "WarmupLR"]

#: the ``scheduler.type`` names a DeepSpeed config may give (exact case, as DeepSpeed looks
#: them up)
VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]

_LOG = get_logger("deepspeed")
_WARMUP_TYPES = ("log", "linear")


def _optimizer_of(owner: str, optimizer) -> Optimizer:
    """The optimizer whose groups the scheduler drives: ``optimizer`` itself, or the optimizer
    an engine-style wrapper holds as ``.optimizer`` (DeepSpeed accepts both)."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise TypeError(f"{owner}: expected a minigrad Optimizer (or an object holding one as "
                    f".optimizer), got {type(optimizer).__name__}")


def _per_group(owner: str, optimizer: Optimizer, name: str, value) -> list:
    """``value`` for each param group: a list/tuple gives one per group, a number is shared."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{owner}: expected {n} value(s) for {name} (one per param group), "
                             f"got {len(value)}: {list(value)}")
        return list(value)
    return [value] * n


def _warmup_fraction(kind: str, iteration: int, warmup_steps: int) -> float:
    """How far the warm-up is at ``iteration`` (0 at iteration 0): DeepSpeed's log or linear
    curve."""
    if kind == "log":
        return math.log(iteration + 1) / math.log(warmup_steps)
    return iteration / warmup_steps


class _StepScheduler:
    """What the five share: the step counter, writing the rates, ``get_last_lr`` and DeepSpeed's
    state dict. Subclasses define ``get_lr``."""

    def __init__(self, optimizer, last_batch_iteration: int):
        self.optimizer = _optimizer_of(type(self).__name__, optimizer)
        self.last_batch_iteration = int(last_batch_iteration)
        self._last_lr = None

    def get_lr(self) -> list[float]:
        """The rate of each param group at ``last_batch_iteration``."""
        raise NotImplementedError

    def _write_lr(self, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _advance(self, iteration: int | None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1 if iteration is None
                                     else int(iteration))
        self._write_lr(self.get_lr())

    def step(self, last_batch_iteration: int | None = None) -> None:
        """Move to the next step (or to ``last_batch_iteration``) and write its rates into the
        optimizer's groups; call it after each optimizer step."""
        self._advance(last_batch_iteration)

    def get_last_lr(self) -> list[float]:
        """The rates last written into the optimizer (by ``step()``, or construction at -1)."""
        if self._last_lr is None:
            raise RuntimeError(f"{type(self).__name__}.get_last_lr: no rate was written yet "
                               f"(constructed with last_batch_iteration="
                               f"{self.last_batch_iteration}); call step() first")
        return self._last_lr

    def state_dict(self) -> dict:
        """DeepSpeed's state: ``{"last_batch_iteration": n}``."""
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict) -> None:
        """Continue from the saved step index (the rates come back with the optimizer's state,
        as in DeepSpeed; the next ``step()`` writes the following step's)."""
        self.last_batch_iteration = int(sd["last_batch_iteration"])

    def __repr__(self) -> str:
        rates = ", ".join(f"{g['lr']:.6g}" for g in self.optimizer.param_groups)
        return (f"{type(self).__name__}(last_batch_iteration={self.last_batch_iteration}, "
                f"lr=[{rates}])")


class LRRangeTest(_StepScheduler):
    """The learning-rate range test: the rate grows from ``lr_range_test_min_lr`` (a number or
    one per group) by ``lr_range_test_step_rate`` every ``lr_range_test_step_size`` steps,
    continuously or (``lr_range_test_staircase``) in stairs; it finds the largest rate that
    still trains."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        if lr_range_test_step_size <= 0:
            raise ValueError(f"LRRangeTest: lr_range_test_step_size must be > 0, got "
                             f"{lr_range_test_step_size}")
        self.min_lr = _per_group("LRRangeTest", self.optimizer, "lr_range_test_min_lr",
                                 lr_range_test_min_lr)
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        if self.last_batch_iteration == -1:
            self._write_lr(self.min_lr)

    def _interval(self) -> float:
        fraction = (self.last_batch_iteration + 1) / self.step_size
        return math.floor(fraction) if self.staircase else fraction

    def get_lr(self) -> list[float]:
        """``min_lr * (1 + step_rate * interval)`` for each group."""
        factor = 1 + self.step_rate * self._interval()
        return [lr * factor for lr in self.min_lr]

    def step(self, batch_iteration: int | None = None) -> None:
        """Move to the next step (or to ``batch_iteration``) and write its rates."""
        self._advance(batch_iteration)


class OneCycle(_StepScheduler):
    """The 1Cycle policy: the rate rises from ``cycle_min_lr`` to ``cycle_max_lr`` over
    ``cycle_first_step_size`` steps and falls back over ``cycle_second_step_size`` (default: the
    same), then decays as ``min / (1 + decay_lr_rate * k / decay_step_size)`` (none when either
    is 0). With ``cycle_momentum`` and an optimizer with ``betas`` (Adam), ``betas`` become
    ``(m, 0.99)`` with ``m`` moving inversely between ``cycle_max_mom`` and ``cycle_min_mom``
    (then ``max_mom * (1 + decay_mom_rate * k / decay_step_size)``). The stair counts are
    accepted and, as in DeepSpeed, do not change the curve."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True,
                 cycle_min_mom: float = 0.8, cycle_max_mom: float = 0.9,
                 decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = first if cycle_second_step_size is None else float(cycle_second_step_size)
        if first <= 0 or second <= 0:
            raise ValueError(f"OneCycle: cycle_first_step_size and cycle_second_step_size must "
                             f"be > 0, got {cycle_first_step_size} and {cycle_second_step_size}")
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = (cycle_first_stair_count if cycle_second_stair_count is None
                                   else cycle_second_stair_count)
        self.decay_step_size = decay_step_size
        no_decay_interval = math.isclose(decay_step_size, 0)
        groups = self.optimizer.param_groups
        self.min_lrs = _per_group("OneCycle", self.optimizer, "cycle_min_lr", cycle_min_lr)
        self.max_lrs = _per_group("OneCycle", self.optimizer, "cycle_max_lr", cycle_max_lr)
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = no_decay_interval or math.isclose(decay_lr_rate, 0)
        if self.last_batch_iteration == -1:
            for group, lr in zip(groups, self.min_lrs, strict=True):
                group["lr"] = lr
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and not all("betas" in g for g in groups):
            _LOG.warning(f"OneCycle: cycle_momentum is disabled because optimizer "
                         f"{type(self.optimizer).__name__} has no betas")
            self.cycle_momentum = False
        if self.cycle_momentum:
            self.decay_mom_rate = decay_mom_rate
            self.skip_mom_decay = no_decay_interval or math.isclose(decay_mom_rate, 0)
            self.min_moms = [(m, 0.99) for m in _per_group(
                "OneCycle", self.optimizer, "cycle_min_mom", cycle_min_mom)]
            self.max_moms = [(m, 0.99) for m in _per_group(
                "OneCycle", self.optimizer, "cycle_max_mom", cycle_max_mom)]
            if self.last_batch_iteration == -1:
                for group, betas in zip(groups, self.min_moms, strict=True):
                    group["betas"] = betas

    def _scale(self) -> float:
        """Where in the cycle the current step is: 0 at the ends, 1 at the peak."""
        position = (self.last_batch_iteration + 1) / self.total_size
        x = position + 1.0 - math.floor(1 + position)
        if x <= self.step_ratio:
            return x / self.step_ratio
        return (x - 1) / (self.step_ratio - 1)

    def _decay_steps(self) -> int:
        return self.last_batch_iteration - self.total_size + 1

    def get_lr(self) -> list[float]:
        """The rate of each group: on the cycle, then decaying."""
        if self.last_batch_iteration < self.total_size:
            s = self._scale()
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * self._decay_steps() / self.decay_step_size
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self) -> list[tuple] | None:
        """Each group's ``betas`` at the current step (None when momentum is not cycled)."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            s = self._scale()
            return [(hi[0] - (hi[0] - lo[0]) * s, lo[1])
                    for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * self._decay_steps() / self.decay_step_size
        return [(hi[0] * factor, hi[1]) for hi in self.max_moms]

    def step(self, batch_iteration: int | None = None) -> None:
        """Move to the next step (or to ``batch_iteration``); write its rates and momenta."""
        self._advance(batch_iteration)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.get_mom(), strict=True):
                group["betas"] = betas


class WarmupLR(_StepScheduler):
    """Warm the rate up from ``warmup_min_lr`` to ``warmup_max_lr`` (numbers or one per group)
    over ``warmup_num_steps`` steps (at least 2), along a ``"log"`` or ``"linear"`` curve
    (another ``warmup_type`` warns and uses log, as DeepSpeed), then hold it."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        owner = type(self).__name__
        self.min_lrs = _per_group(owner, self.optimizer, "warmup_min_lr", warmup_min_lr)
        self.max_lrs = _per_group(owner, self.optimizer, "warmup_max_lr", warmup_max_lr)
        self.delta_lrs = [hi - lo for lo, hi in zip(self.min_lrs, self.max_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        if warmup_type not in _WARMUP_TYPES:
            _LOG.warning(f"{owner}: unknown warmup_type {warmup_type!r} (expected 'log' or "
                         f"'linear'); using 'log'")
            warmup_type = "log"
        self.warmup_type = warmup_type
        if self.last_batch_iteration == -1:
            self._write_lr(self.get_lr())

    def _gamma(self) -> float:
        """The fraction of ``max - min`` added at the current step."""
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_fraction(self.warmup_type, self.last_batch_iteration,
                                    self.warmup_num_steps)
        return 1.0

    def get_lr(self) -> list[float]:
        """``min + (max - min) * gamma`` for each group (``min`` before the first step)."""
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """:class:`WarmupLR`'s warm-up, then a linear decay reaching 0 at ``total_num_steps``."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            _LOG.warning(f"WarmupDecayLR: total_num_steps {total_num_steps} is less than "
                         f"warmup_num_steps {warmup_num_steps}")

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._gamma()
        left = self.total_num_steps - self.last_batch_iteration
        return max(0.0, left / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_StepScheduler):
    """Scale each group's rate (as set when the scheduler is built) by a ratio that warms up from
    ``warmup_min_ratio`` to 1 over ``warmup_num_steps`` (log or linear), then follows a cosine
    down to ``cos_min_ratio`` at ``total_num_steps`` (past it the cosine rises again, as in
    DeepSpeed)."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001,
                 warmup_type: str = "log", last_batch_iteration: int = -1):
        super().__init__(optimizer, last_batch_iteration)
        if warmup_type not in _WARMUP_TYPES:
            raise ValueError(f"WarmupCosineLR: warmup_type must be 'log' or 'linear', got "
                             f"{warmup_type!r}")
        self.total_num_steps = total_num_steps
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        if self.total_num_steps < self.warmup_num_steps:
            _LOG.warning(f"WarmupCosineLR: total_num_steps {total_num_steps} is less than "
                         f"warmup_num_steps {warmup_num_steps}")
        self.org_lrs = [group["lr"] for group in self.optimizer.param_groups]
        if self.last_batch_iteration == -1:
            self._write_lr(self.get_lr())

    def get_lr_ratio(self) -> float:
        """The factor applied to every group's original rate at the current step."""
        i = self.last_batch_iteration
        if i < 0:
            return 0.0
        if i < self.warmup_num_steps:
            rising = _warmup_fraction(self.warmup_type, i, self.warmup_num_steps)
            return self.warmup_min_ratio + rising * (1.0 - self.warmup_min_ratio)
        decay_steps = self.total_num_steps - self.warmup_num_steps
        if decay_steps == 0:
            raise ValueError(f"WarmupCosineLR: no steps to decay over: total_num_steps "
                             f"{self.total_num_steps} equals warmup_num_steps "
                             f"{self.warmup_num_steps}")
        cosine = (1 + math.cos(math.pi * (i - self.warmup_num_steps + 1) / decay_steps)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> list[float]:
        """Each group's original rate times :meth:`get_lr_ratio` (0 before the first step)."""
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]
