"""Adagrad: per-coordinate learning rates from the running sum of squared gradients."""

from __future__ import annotations

from minigrad.backend.xp import get_array_module
from minigrad.optimizer.optimizer import Optimizer


class Adagrad(Optimizer):
    r"""Adagrad, MegEngine's rule (``eps`` inside the square root, unlike PyTorch's outside)::

        g = grad + weight_decay * p ;  t += 1
        s = s + g^2
        p = p - lr / (1 + (t - 1) * lr_decay) * g / sqrt(s + eps)
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, eps: float = 1e-10,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        if group["lr_decay"] < 0 or group["eps"] < 0:
            raise ValueError(
                f"Adagrad: lr_decay and eps must be >= 0, got {group['lr_decay']}, {group['eps']}"
            )

    def _update(self, p, g, state, group):
        xp = get_array_module(p)
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        if "square_sum" not in state:
            state["step"] = 0
            state["square_sum"] = xp.zeros_like(p)
        state["step"] += 1
        s = state["square_sum"] = state["square_sum"] + g * g
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        p -= clr * (g / xp.sqrt(s + group["eps"]))
