"""float32 master weights for low-precision parameters: :func:`master_weights`.

A float16 parameter cannot take small updates: with ``w = 1.0`` the next float16 is ``1.001``,
so ``w -= 1e-4`` does nothing, and a model trained in float16 stalls. The usual cure keeps a float32
*master* copy of every float16/bfloat16 parameter: the optimizer updates the master copy (which
accumulates the small steps), and the model's parameter is the master copy rounded after each
step. The model computes in low precision; only the optimizer sees float32.

minigrad's spelling wraps an optimizer once, before its first step::

    net = net.astype("float16")            # or parameters created in float16
    opt = amp.master_weights(optim.SGD(net.parameters(), lr=0.1))
    ...
    opt.step().clear_grad()                # same calls as the optimizer

The wrapper swaps each low-precision parameter of the optimizer's param groups for its float32
master :class:`~minigrad.autodiff.tensor.Parameter`, so the optimizer's state (momentum, Adam's
moments) is float32 too; parameters that are float32 already are updated directly.
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.dtypes import is_floating
from minigrad.backend.xp import to_numpy

FLOAT32 = np.dtype(np.float32)


def _is_low(t: Tensor) -> bool:
    return is_floating(t.dtype) and t.dtype.itemsize < 4


class MasterWeights:
    """An optimizer that keeps float32 master copies of its low-precision parameters (made by
    :func:`master_weights`). ``step``, ``clear_grad``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` act on both copies; anything else (``param_groups``, hyper-parameters)
    is the wrapped optimizer's, whose groups hold the master copies."""

    def __init__(self, optimizer):
        if optimizer.state_dict()["state"]:
            raise ValueError(
                "amp.master_weights: the optimizer has state already; wrap it before its first "
                "step (its state would belong to the low-precision parameters)"
            )
        self.optimizer = optimizer
        self._pairs: list[tuple[Parameter, Parameter]] = []  # (model parameter, master)
        for group in optimizer.param_groups:
            params = []
            for p in group["params"]:
                if _is_low(p):
                    master = Parameter(to_numpy(p.data).astype(FLOAT32), device=p.device)
                    master.name = p.name
                    self._pairs.append((p, master))
                    params.append(master)
                else:
                    params.append(p)
            group["params"] = params
        self._copied = False

    def __getattr__(self, name):
        # only reached for names this wrapper does not define: the optimizer's own
        return getattr(self.__dict__["optimizer"], name)

    def model_parameters(self) -> list[Parameter]:
        """The parameters the model computes with (low precision where they were)."""
        masters = {id(m): p for p, m in self._pairs}
        return [masters.get(id(q), q) for g in self.optimizer.param_groups for q in g["params"]]

    def copy_grads_to_master(self) -> list[tuple[Parameter, Parameter]]:
        """Give each master copy its model parameter's gradient in float32 (None stays None);
        returns ``(model parameter, tensor holding the gradient)`` for every parameter, which
        is what ``GradScaler.unscale_`` unscales. Done once per step."""
        for p, m in self._pairs:
            m.grad = None if p.grad is None else Tensor(
                to_float32(p.grad.data if isinstance(p.grad, Tensor) else p.grad),
                device=m.device)
        self._copied = True
        masters = {id(m): p for p, m in self._pairs}
        return [(masters.get(id(q), q), q) for g in self.optimizer.param_groups
                for q in g["params"]]

    def step(self) -> "MasterWeights":
        """The optimizer's step on the master copies, then each model parameter becomes its
        master copy rounded to the parameter's dtype."""
        if not self._copied:
            self.copy_grads_to_master()
        self.optimizer.step()
        for p, m in self._pairs:
            if m.grad is not None:
                p.set_value(m.data.astype(p.dtype))
        self._copied = False
        return self

    def clear_grad(self) -> "MasterWeights":
        """Drop the gradients of the model parameters and of the master copies."""
        for p, m in self._pairs:
            p.grad = None
            m.grad = None
        self.optimizer.clear_grad()
        self._copied = False
        return self

    def zero_grad(self) -> "MasterWeights":
        """Zero existing gradients of the model parameters and of the master copies."""
        for p, _ in self._pairs:
            if p.grad is not None:
                p.grad = Tensor(p.xp.zeros_like(p.grad.data), device=p.device)
        self.optimizer.zero_grad()
        self._copied = False
        return self

    def state_dict(self) -> dict:
        """The optimizer's state dict plus the master copies (``"master"``: float32 arrays in the
        order of the low-precision parameters)."""
        return {"optimizer": self.optimizer.state_dict(),
                "master": [np.array(to_numpy(m.data), copy=True) for _, m in self._pairs]}

    def load_state_dict(self, state: dict) -> "MasterWeights":
        """Restore :meth:`state_dict`'s result; the model parameters become the rounded masters."""
        masters = state["master"]
        if len(masters) != len(self._pairs):
            raise ValueError(
                f"MasterWeights.load_state_dict: {len(masters)} master copies saved, "
                f"{len(self._pairs)} low-precision parameters here"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        for (p, m), saved in zip(self._pairs, masters, strict=True):
            m.set_value(np.asarray(saved, dtype=FLOAT32))
            p.set_value(m.data.astype(p.dtype))
        return self

    def __repr__(self) -> str:
        return f"MasterWeights({len(self._pairs)} float32 masters, {self.optimizer!r})"


def to_float32(arr):
    """``arr`` as float32 (a copy)."""
    return arr.astype(FLOAT32)


def master_weights(optimizer) -> MasterWeights:
    """Wrap ``optimizer`` so that it updates float32 master copies of its float16/bfloat16
    parameters and writes them back rounded after each step (see the module's docstring).
    Call it on a fresh optimizer, before its first step.

    Example::

        opt = amp.master_weights(optim.Adam(net.parameters(), lr=1e-3))
    """
    return MasterWeights(optimizer)
