"""Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay."""

from __future__ import annotations

from minigrad.backend import kernels
from minigrad.backend.xp import get_array_module
from minigrad.optimizer.optimizer import Optimizer, required


class SGD(Optimizer):
    r"""SGD (MegEngine/PyTorch rule, dampening 0)::

        g = grad + weight_decay * p
        buf = momentum * buf + g                 (buf starts at g)
        d = g + momentum * buf if nesterov else buf   (d = g without momentum)
        p = p - lr * d

    Example::

        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    """

    def __init__(self, params, lr: float = required, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0):
        if nesterov and momentum <= 0:
            raise ValueError(f"SGD: nesterov needs momentum > 0, got momentum={momentum}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        if group["momentum"] < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {group['momentum']}")

    def _update(self, p, g, state, group):
        wd, momentum = group["weight_decay"], group["momentum"]
        buf = None
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:  # zeros: the first step makes it exactly g (+ weight decay)
                buf = state["momentum_buffer"] = get_array_module(g).zeros_like(g)
        kernels.sgd_step(p, g, buf, group["lr"], momentum, wd, group["nesterov"])
