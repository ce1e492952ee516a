"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay)."""

from __future__ import annotations

from minigrad.backend import kernels
from minigrad.backend.xp import get_array_module
from minigrad.optimizer.optimizer import Optimizer, required


def check_betas_and_eps(name: str, group: dict) -> None:
    """Validate the Adam-family hyper-parameters of a param group (errors name the optimizer)."""
    b1, b2 = group["betas"]
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"{name}: betas must be in [0, 1), got {group['betas']}")
    if group["eps"] < 0:
        raise ValueError(f"{name}: eps must be >= 0, got {group['eps']}")


def start_moments(state: dict, grad, xp) -> None:
    """Adam's state before its first step: ``step`` 0 and zero moments shaped like ``grad``."""
    if "exp_avg" not in state:
        state.update(step=0, exp_avg=xp.zeros_like(grad), exp_avg_sq=xp.zeros_like(grad))


def adam_moments(state: dict, grad, betas: tuple, xp):
    """Advance Adam's moment estimates in ``state`` by one step, in place (no new arrays)::

        m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g^2 ;  t += 1

    and return ``(m, v, t)``. Shared by Adam, AdamW and LAMB, which differ only in how they turn
    the moments into an update.
    """
    b1, b2 = betas
    start_moments(state, grad, xp)
    state["step"] += 1
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m *= b1
    m += (1 - b1) * grad
    v *= b2
    v += (1 - b2) * (grad * grad)
    return m, v, state["step"]


class Adam(Optimizer):
    r"""Adam (Kingma & Ba), MegEngine/PyTorch rule::

        g = grad + weight_decay * p
        m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g^2 ;  t += 1
        p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    Example::

        opt = optim.Adam(model.parameters(), lr=1e-3)
    """

    _decoupled = False

    def __init__(self, params, lr: float = required, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        check_betas_and_eps(self._name, group)

    def _update(self, p, g, state, group):
        start_moments(state, g, get_array_module(g))
        state["step"] += 1
        kernels.adam_step(p, g, state["exp_avg"], state["exp_avg_sq"], group["lr"],
                          group["betas"], group["eps"], group["weight_decay"], self._decoupled,
                          state["step"])

    def _update_group(self, updates, group):
        if type(self)._update is not Adam._update:  # a subclass's own rule: parameter by parameter
            super()._update_group(updates, group)
            return
        for device, on_device in self._by_device(updates):
            with device.context():  # new moments are made on the parameters' GPU
                states = []
                for _, g, state in on_device:
                    start_moments(state, g, get_array_module(g))
                    state["step"] += 1
                    states.append(state)
                kernels.adam_steps([p.data for p, _, _ in on_device],
                                   [g for _, g, _ in on_device],
                                   [s["exp_avg"] for s in states],
                                   [s["exp_avg_sq"] for s in states],
                                   group["lr"], group["betas"], group["eps"],
                                   group["weight_decay"], self._decoupled,
                                   [s["step"] for s in states])


class AdamW(Adam):
    r"""Adam with decoupled weight decay (Loshchilov & Hutter)::

        p = p - lr * (adam_direction + weight_decay * p)

    i.e. PyTorch's ``p *= 1 - lr * wd`` followed by the Adam step; default ``weight_decay=1e-2``.
    """

    _decoupled = True

    def __init__(self, params, lr: float = required, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
