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

    @staticmethod
    def _buffer(state: dict, g, momentum: float):
        """The momentum buffer (None without momentum); a new one is zeros, so that the first step
        makes it exactly g (+ weight decay)."""
        if not momentum:
            return None
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = get_array_module(g).zeros_like(g)
        return buf

    def _update(self, p, g, state, group):
        momentum = group["momentum"]
        kernels.sgd_step(p, g, self._buffer(state, g, momentum), group["lr"], momentum,
                         group["weight_decay"], group["nesterov"])

    def _update_group(self, updates, group):
        if type(self)._update is not SGD._update:  # a subclass's own rule: parameter by parameter
            super()._update_group(updates, group)
            return
        momentum = group["momentum"]
        for device, on_device in self._by_device(updates):
            with device.context():
                kernels.sgd_steps([p.data for p, _, _ in on_device], [g for _, g, _ in on_device],
                                  [self._buffer(state, g, momentum) for _, g, state in on_device],
                                  group["lr"], momentum, group["weight_decay"], group["nesterov"])
