"""LAMB: Adam directions rescaled per parameter by the trust ratio ``||p|| / ||update||``."""

from __future__ import annotations

import numpy as np

from minigrad.backend.xp import get_array_module
from minigrad.optimizer.adam import adam_moments, check_betas_and_eps
from minigrad.optimizer.optimizer import Optimizer, required


class LAMB(Optimizer):
    r"""LAMB (You et al.), MegEngine's rule::

        m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g^2 ;  t += 1
        u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p   (hats: bias-corrected if enabled)
        r = ||p|| / ||u|| if both > 0 else 1   (only when weight_decay != 0 or always_adapt)
        p = p - lr * r * u

    The norms and ``r`` are computed on the parameter's device: a GPU step never waits for them.
    """

    def __init__(self, params, lr: float = required, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, bias_correction: bool = True, weight_decay: float = 0.0,
                 always_adapt: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      bias_correction=bias_correction,
                                      weight_decay=weight_decay, always_adapt=always_adapt))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        check_betas_and_eps(self._name, group)

    def _update_param(self, param, grad, state, group):
        # a shard of a parameter split over ranks (dist.fully_shard, ZeroRedundancyOptimizer)
        # carries the object that sums its norms over the ranks: the trust ratio is global
        self._reducer = getattr(param, "shard_reducer", None)
        try:
            super()._update_param(param, grad, state, group)
        finally:
            self._reducer = None

    def _norm(self, x, xp):
        """``||x||`` as a float64 0-d array; over all ranks' shards for a sharded parameter."""
        if getattr(self, "_reducer", None) is None:
            return xp.linalg.norm(x.ravel()).astype(np.float64)
        local = float(xp.sum(x.astype(np.float64) ** 2))
        return xp.asarray(float(self._reducer.all_reduce([local], "sum")[0]) ** 0.5)

    def _update(self, p, g, state, group):
        xp = get_array_module(p)
        b1, b2 = group["betas"]
        wd = group["weight_decay"]
        m, v, t = adam_moments(state, g, (b1, b2), xp)
        if group["bias_correction"]:
            m, v = m / (1 - b1**t), v / (1 - b2**t)
        update = m / (xp.sqrt(v) + group["eps"])
        if wd:
            update = update + wd * p
        if not (wd or group["always_adapt"]):
            p -= group["lr"] * update
            return
        # the trust ratio stays on the device (no wait for the GPU): float64 0-d arrays, so the
        # step is the one Python floats would give, cast to the update's dtype
        p_norm = self._norm(p, xp)
        u_norm = self._norm(update, xp)
        both = (p_norm > 0) & (u_norm > 0)
        ratio = xp.where(both, p_norm / xp.where(both, u_norm, 1.0), 1.0)
        p -= (group["lr"] * ratio).astype(update.dtype) * update
