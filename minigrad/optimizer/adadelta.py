"""Adadelta: step sizes from running averages of squared gradients and squared updates."""

from __future__ import annotations

from minigrad.backend.xp import get_array_module
from minigrad.optimizer.optimizer import Optimizer


class Adadelta(Optimizer):
    r"""Adadelta (Zeiler), MegEngine/PyTorch rule::

        g = grad + weight_decay * p
        s = rho * s + (1 - rho) * g^2
        d = sqrt(u + eps) / sqrt(s + eps) * g
        u = rho * u + (1 - rho) * d^2
        p = p - lr * d
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        if not 0.0 <= group["rho"] <= 1.0:
            raise ValueError(f"Adadelta: rho must be in [0, 1], got {group['rho']}")

    def _update(self, p, g, state, group):
        xp = get_array_module(p)
        rho, eps = group["rho"], group["eps"]
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        if "square_avg" not in state:
            state["square_avg"] = xp.zeros_like(p)
            state["acc_delta"] = xp.zeros_like(p)
        s = state["square_avg"] = rho * state["square_avg"] + (1 - rho) * (g * g)
        d = xp.sqrt(state["acc_delta"] + eps) / xp.sqrt(s + eps) * g
        state["acc_delta"] = rho * state["acc_delta"] + (1 - rho) * (d * d)
        p -= group["lr"] * d
