"""Learning-rate schedulers: ``MultiStepLR``, ``StepLR``, ``CosineAnnealingLR``, ``LinearWarmup``.

Every scheduler is a closed-form function of the epoch counter, which makes ``state_dict`` tiny and
composition simple. MegEngine semantics: construction records each group's ``initial_lr`` and
applies the epoch-0 rate; each ``step()`` advances one epoch and writes the new rates into the
optimizer's groups.

Example::

    sched = LinearWarmup(opt, warmup_steps=5, scheduler=CosineAnnealingLR(opt, T_max=95))
    for epoch in range(100):
        train_one_epoch()
        sched.step()
"""

from __future__ import annotations

import bisect
import math

from minigrad.optimizer.optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses implement ``lr_at(epoch) -> list of rates`` (one per group)."""

    def __init__(self, optimizer: Optimizer, current_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(self).__name__}: expected an Optimizer, got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.current_epoch = current_epoch
        self.step()

    def lr_at(self, epoch: int) -> list[float]:
        """The rate of each param group at ``epoch`` (a pure function: what subclasses define)."""
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """The rates of the current epoch."""
        return self.lr_at(self.current_epoch)

    def step(self, epoch: int | None = None) -> None:
        """Advance to the next epoch (or jump to ``epoch``) and set the groups' ``lr``."""
        self.current_epoch = self.current_epoch + 1 if epoch is None else int(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr

    def state_dict(self) -> dict:
        """Everything but the optimizer (which saves its own state)."""
        out = {}
        for key, value in self.__dict__.items():
            if key == "optimizer":
                continue
            out[key] = value.state_dict() if isinstance(value, LRScheduler) else value
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what ``state_dict`` saved and apply the restored epoch's rates."""
        unknown = set(state_dict) - set(self.__dict__)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: unexpected keys {sorted(unknown)}"
            )
        for key, value in state_dict.items():
            current = self.__dict__[key]
            if isinstance(current, LRScheduler):
                current.load_state_dict(value)
            else:
                self.__dict__[key] = value
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr

    def extra_repr(self) -> str:
        """The hyper-parameters ``repr`` shows; schedulers override this (as modules do)."""
        return ""

    def __repr__(self) -> str:
        rates = ", ".join(f"{group['lr']:.6g}" for group in self.optimizer.param_groups)
        head = self.extra_repr()
        return (f"{type(self).__name__}({head + ', ' if head else ''}"
                f"current_epoch={self.current_epoch}, lr=[{rates}])")


def _positive(owner: str, name: str, value) -> int:
    if value <= 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value}")
    return int(value)


class MultiStepLR(LRScheduler):
    """Multiply the rate by ``gamma`` at each milestone epoch:
    ``lr = base * gamma ** (number of milestones <= epoch)``."""

    def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1,
                 current_epoch: int = -1):
        milestones = list(milestones)
        if milestones != sorted(milestones):
            raise ValueError(f"MultiStepLR: milestones must be increasing, got {milestones}")
        self.milestones = milestones
        self.gamma = float(gamma)
        super().__init__(optimizer, current_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        factor = self.gamma ** bisect.bisect_right(self.milestones, epoch)
        return [base * factor for base in self.base_lrs]

    def extra_repr(self) -> str:
        return f"milestones={self.milestones}, gamma={self.gamma}"


class StepLR(LRScheduler):
    """Multiply the rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 current_epoch: int = -1):
        self.step_size = _positive("StepLR", "step_size", step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, current_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        return [base * self.gamma ** (epoch // self.step_size) for base in self.base_lrs]

    def extra_repr(self) -> str:
        return f"step_size={self.step_size}, gamma={self.gamma}"


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``, held at ``eta_min``
    after ``T_max`` epochs."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803
                 current_epoch: int = -1):
        self.T_max = _positive("CosineAnnealingLR", "T_max", T_max)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, current_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        e = min(max(epoch, 0), self.T_max)
        c = (1 + math.cos(math.pi * e / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]

    def extra_repr(self) -> str:
        return f"T_max={self.T_max}, eta_min={self.eta_min}"


class LinearWarmup(LRScheduler):
    """Ramp linearly from ``start_factor * base`` to ``base`` over ``warmup_steps`` epochs, then
    hand over to ``scheduler`` (if given), which runs from its own epoch 0 as if started then."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, start_factor: float = 0.0,
                 scheduler: LRScheduler | None = None, current_epoch: int = -1):
        if warmup_steps < 0:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 0, got {warmup_steps}")
        if scheduler is not None and scheduler.optimizer is not optimizer:
            raise ValueError("LinearWarmup: the wrapped scheduler must drive the same optimizer")
        self.warmup_steps = int(warmup_steps)
        self.start_factor = float(start_factor)
        self.scheduler = scheduler
        super().__init__(optimizer, current_epoch)

    def lr_at(self, epoch: int) -> list[float]:
        if epoch < self.warmup_steps:
            f = self.start_factor + (1 - self.start_factor) * max(epoch, 0) / self.warmup_steps
            return [base * f for base in self.base_lrs]
        if self.scheduler is not None:
            return self.scheduler.lr_at(epoch - self.warmup_steps)
        return list(self.base_lrs)

    def step(self, epoch: int | None = None) -> None:
        super().step(epoch)
        if self.scheduler is not None:  # keep the wrapped counter meaningful for get_lr()
            self.scheduler.current_epoch = self.current_epoch - self.warmup_steps

    def extra_repr(self) -> str:
        return (f"warmup_steps={self.warmup_steps}, start_factor={self.start_factor}, "
                f"scheduler={self.scheduler!r}")
