"""``Optimizer``: parameter groups, per-parameter state and the ``step`` loop.

Subclasses implement ``_update(param, grad, state, group)`` on raw backend arrays (NumPy or CuPy):
it updates ``param`` and the per-parameter ``state`` dict *in place* and returns nothing. The base
class skips parameters without a gradient, makes read-only parameter arrays writable first, and
keeps the state dicts that ``state_dict``/``load_state_dict`` save and restore.

Example::

    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with gm:
        gm.backward(loss_fn(model(x), y))
    opt.step().clear_grad()
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.xp import to_numpy


class _Required:
    def __repr__(self) -> str:
        return "<required>"


required = _Required()


class Optimizer:
    """Base class. ``params`` is an iterable of Parameters or of dicts (param groups) that each
    hold ``"params"`` and optional per-group hyper-parameters overriding ``defaults``.

    Example::

        opt = optim.SGD([{"params": body.parameters()},
                         {"params": head.parameters(), "lr": 0.01}], lr=0.1)
    """

    def __init__(self, params, defaults: dict):
        self._defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self._state: dict[int, dict] = {}
        if isinstance(params, Tensor):
            params = [params]
        params = list(params)
        if not params:
            raise ValueError(f"{self._name}: got an empty parameter list")
        if isinstance(params[0], dict):
            for group in params:
                self.add_param_group(group)
        else:
            self.add_param_group({"params": params})

    @property
    def _name(self) -> str:
        return type(self).__name__

    def add_param_group(self, param_group: dict) -> "Optimizer":
        """Add a group of parameters with its own hyper-parameters (e.g. no weight decay)."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"{self._name}.add_param_group: expected a dict with a 'params' key")
        group = dict(param_group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(params):
            if not isinstance(p, Parameter):
                raise TypeError(
                    f"{self._name}: can only optimize Parameters, but parameter {i} of group "
                    f"{len(self.param_groups)} is a {type(p).__name__} (shape "
                    f"{getattr(p, 'shape', None)}); wrap trainable tensors in mg.Parameter"
                )
            if id(p) in taken:
                raise ValueError(
                    f"{self._name}: parameter {i} (shape {p.shape}) appears in more than one "
                    "param group (or twice in this one)"
                )
            taken.add(id(p))
        group["params"] = params
        for key, value in self._defaults.items():
            if value is required and key not in group:
                raise ValueError(f"{self._name}: hyper-parameter {key!r} is required")
            group.setdefault(key, value)
        self._check_group(group)
        self.param_groups.append(group)
        return self

    def _check_group(self, group: dict) -> None:
        """Validate hyper-parameters (subclasses extend); errors name the optimizer and value."""
        if group["lr"] < 0:
            raise ValueError(f"{self._name}: lr must be >= 0, got {group['lr']}")
        if group.get("weight_decay", 0.0) < 0:
            raise ValueError(
                f"{self._name}: weight_decay must be >= 0, got {group['weight_decay']}"
            )

    # -- the update loop --------------------------------------------------------------------------
    def step(self) -> "Optimizer":
        """Update every parameter that has a gradient; returns self: ``opt.step().clear_grad()``.

        A parameter with a ``replaced_by`` attribute was swapped out of its module (sharded by
        ``dist.fully_shard``): updating it would train nothing, so this raises, naming it."""
        self._check_not_replaced()
        states = self._state
        for group in self.param_groups:
            updates = []
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if isinstance(grad, Tensor):
                    grad = grad.data
                data = p.data
                if grad.shape != data.shape:  # the arrays updated (a global tensor's pieces)
                    raise ValueError(
                        f"{self._name}.step: gradient shape {grad.shape} does not match parameter "
                        f"shape {p.shape}"
                    )
                state = states.get(id(p))
                if state is None:
                    state = states[id(p)] = {}
                if not getattr(data.flags, "writeable", True):  # e.g. a loaded read-only array
                    p.set_value(data)  # set_value keeps a writable copy
                updates.append((p, grad, state))
            if updates:
                self._update_group(updates, group)
        return self

    def _update_group(self, updates: list, group: dict) -> None:
        """Update the parameters of ``group`` that have a gradient (``updates``: ``(param,
        gradient array, state)`` in the group's order): :meth:`_update_param` on each, on its own
        device. Rules whose update is one kernel over many parameters (SGD, Adam) override this
        with a call per device."""
        for p, grad, state in updates:
            with p.device.context():  # a GPU parameter is updated on its own GPU
                self._update_param(p, grad, state, group)

    @staticmethod
    def _by_device(updates: list) -> list:
        """``updates`` split by the parameters' device (in order): ``[(device, updates)]``."""
        split: dict = {}
        for u in updates:
            split.setdefault(u[0].device, []).append(u)
        return list(split.items())

    def _update_param(self, param: Parameter, grad, state: dict, group: dict) -> None:
        """Update one parameter: ``_update`` on its array. Rules that need more than the array
        (LAMB's norms over a sharded parameter) override this."""
        self._update(param.data, grad, state, group)

    def _check_not_replaced(self) -> None:
        for i, p in enumerate(self._params()):
            replaced = getattr(p, "replaced_by", None)
            if replaced is not None:
                raise RuntimeError(
                    f"{self._name}.step: parameter {i} (shape {p.shape}) was replaced by "
                    f"{replaced}; build the optimizer after sharding, on module.parameters()"
                )

    def _update(self, param, grad, state: dict, group: dict) -> None:
        """Update ``param`` (the parameter's array) and ``state`` in place: no new parameter-sized
        arrays per step, which is most of an optimizer's cost on a CPU."""
        raise NotImplementedError(f"{self._name}._update is not implemented")

    def clear_grad(self) -> "Optimizer":
        """Drop every parameter's gradient (``.grad = None``) before the next backward: the usual
        call, which frees the gradients' memory until backward writes new ones."""
        for p in self._params():
            p.grad = None
        return self

    def zero_grad(self) -> "Optimizer":
        """Set every existing gradient to zeros (parameters without one keep None).

        Same meaning as ``Module.zero_grad`` and as both in MegEngine: *zero* fills with zeros,
        *clear* (``clear_grad``) drops. Unlike ``clear_grad``, a parameter that receives no
        gradient in the next backward still gets a step (with a zero gradient: momentum and
        weight decay act), as with PyTorch's ``zero_grad(set_to_none=False)``.
        """
        for p in self._params():
            if p.grad is not None:
                p.grad = F.zeros_like(p.grad)
        return self

    # -- printing ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        """Hyper-parameters and parameter count per group, e.g.
        ``SGD(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, params=4)``; one line per
        group when there are several."""

        def describe(group: dict) -> str:
            hyper = ", ".join(f"{k}={v!r}" for k, v in group.items() if k != "params")
            return f"{hyper}, params={len(group['params'])}"

        if len(self.param_groups) == 1:
            return f"{self._name}({describe(self.param_groups[0])})"
        lines = [f"  ({i}): {describe(g)}" for i, g in enumerate(self.param_groups)]
        return "\n".join([f"{self._name}({len(self.param_groups)} param groups", *lines, ")"])

    # -- state ------------------------------------------------------------------------------------
    def _params(self) -> list[Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        """``{"param_groups": [...], "state": {index: {name: array}}}``; parameters are named by
        their position across groups, so the dict can be loaded into a freshly built optimizer."""
        index = {id(p): i for i, p in enumerate(self._params())}
        groups = []
        for g in self.param_groups:
            hyper = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            hyper["params"] = [index[id(p)] for p in g["params"]]
            groups.append(hyper)
        state = {}
        for p in self._params():
            st = self._state.get(id(p))
            if st:
                state[index[id(p)]] = {k: _export(v) for k, v in st.items()}
        return {"param_groups": groups, "state": state}

    def load_state_dict(self, state_dict: dict) -> "Optimizer":
        """Restore hyper-parameters and state saved by ``state_dict`` (validated first)."""
        if not isinstance(state_dict, dict) or not {"param_groups", "state"} <= set(state_dict):
            raise ValueError(
                f"{self._name}.load_state_dict: expected a dict with 'param_groups' and 'state'"
            )
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"{self._name}.load_state_dict: the state has {len(groups)} param group(s), "
                f"this optimizer has {len(self.param_groups)}"
            )
        params = self._params()
        for i, (saved, own) in enumerate(zip(groups, self.param_groups, strict=True)):
            if len(saved["params"]) != len(own["params"]):
                raise ValueError(
                    f"{self._name}.load_state_dict: param group {i} has {len(saved['params'])} "
                    f"parameter(s) in the state but {len(own['params'])} here"
                )
        new_state: dict[int, dict] = {}
        for key, st in state_dict["state"].items():
            idx = int(key)
            if not 0 <= idx < len(params):
                raise ValueError(
                    f"{self._name}.load_state_dict: state for parameter {idx}, but there are "
                    f"only {len(params)} parameters"
                )
            p = params[idx]
            restored = {}
            for name, value in st.items():
                if _is_array(value):
                    arr = to_numpy(value.data if isinstance(value, Tensor) else value)
                    own = tuple(p.data.shape)  # a global parameter's state is its local piece
                    if arr.ndim and arr.shape != own:
                        raise ValueError(
                            f"{self._name}.load_state_dict: state {name!r} of parameter {idx} "
                            f"has shape {arr.shape}, expected {own}"
                        )
                    value = p.device.put(arr)
                    value = value.copy() if value is arr else value
                restored[name] = value
            new_state[id(p)] = restored
        for saved, own in zip(groups, self.param_groups, strict=True):
            for k, v in saved.items():
                if k != "params":
                    own[k] = copy.deepcopy(v)
        self._state = new_state
        return self


def _is_array(value: Any) -> bool:
    return isinstance(value, Tensor) or hasattr(value, "__array_interface__") or (
        hasattr(value, "shape") and hasattr(value, "dtype")
    )


def _export(value):
    """Optimizer state as host NumPy copies (safe to save; never aliases the live buffers)."""
    if _is_array(value) and not isinstance(value, (int, float)):
        arr = to_numpy(value.data if isinstance(value, Tensor) else value)
        return np.array(arr, copy=True)
    return copy.deepcopy(value)
