"""``Module``: the base class of every layer.

A module finds its parameters, buffers and sub-modules by *scanning its attributes* (and lists,
tuples and dicts of them) in definition order, instead of registering them in ``__setattr__``.
That is MegEngine's design, and it means a subclass that forgets ``super().__init__()`` still works:
everything the base class needs has a class-level default.

Example::

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(4, 2)
            self.scale = mg.Parameter(np.ones(2, "float32"))

        def forward(self, x):
            return self.fc(x) * self.scale

    [name for name, _ in Net().named_parameters()]  # ['fc.weight', 'fc.bias', 'scale']
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any, Callable, Iterator

import numpy as np

import minigrad.functional as F
from minigrad import seams
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.device import Device
from minigrad.backend.xp import to_numpy
from minigrad.logger import get_logger
from minigrad.module.graph import GraphModule

_log = get_logger("minigrad.module")


class StateDictKeyError(KeyError, ValueError):
    """``load_state_dict(strict=True)`` found names missing from the state dict or not used by
    the module (a ``KeyError``, as in MegEngine; also a ``ValueError``, as minigrad raised before).
    """

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


# Attributes of the base class itself; they never hold tensors, so the scan skips them.
_INTERNAL = frozenset({"training", "name", "_forward_pre_hooks", "_forward_hooks"})
_hook_ids = itertools.count()


def no_parameters(*args, **kwargs) -> int:
    """The ``count_parameters`` of a layer without trainable parameters (activations, pooling,
    dropout...): 0 whatever the constructor arguments."""
    return 0


class HookHandler:
    """Returned by ``register_forward_*hook``; ``remove()`` unregisters the hook."""

    def __init__(self, hooks: dict, key: int):
        self._hooks = hooks
        self._key = key

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        self._hooks.pop(self._key, None)


class Module:
    """Base class for layers and models (MegEngine's ``Module``): subclasses set parameters and
    sub-modules as attributes in ``__init__`` and define ``forward``.

    Example::

        class MLP(M.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2 = M.Linear(784, 128), M.Linear(128, 10)

            def forward(self, x):
                return self.fc2(F.relu(self.fc1(x)))
    """

    # Class-level defaults: what makes a subclass without super().__init__() work.
    training: bool = True
    name: str | None = None

    def __init__(self, name: str | None = None):
        self.training = True
        self.name = name
        self._forward_pre_hooks: dict[int, Callable] = OrderedDict()
        self._forward_hooks: dict[int, Callable] = OrderedDict()

    def forward(self, *args, **kwargs):
        """The layer's computation; ``module(x)`` calls it (with the forward hooks around it)."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    # -- calling and hooks ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        pre = self.__dict__.get("_forward_pre_hooks")
        if pre:
            for hook in list(pre.values()):
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        out = self.forward(*args, **kwargs)
        post = self.__dict__.get("_forward_hooks")
        if post:
            for hook in list(post.values()):
                result = hook(self, args, out)
                if result is not None:
                    out = result
        return out

    def _hook_dict(self, attr: str) -> dict:
        hooks = self.__dict__.get(attr)
        if hooks is None:
            hooks = OrderedDict()
            object.__setattr__(self, attr, hooks)
        return hooks

    def register_forward_pre_hook(self, hook: Callable) -> HookHandler:
        """``hook(module, inputs)`` runs before ``forward``; non-None replaces the inputs."""
        hooks = self._hook_dict("_forward_pre_hooks")
        key = next(_hook_ids)
        hooks[key] = hook
        return HookHandler(hooks, key)

    def register_forward_hook(self, hook: Callable) -> HookHandler:
        """``hook(module, inputs, output)`` runs after ``forward``; non-None replaces the output."""
        hooks = self._hook_dict("_forward_hooks")
        key = next(_hook_ids)
        hooks[key] = hook
        return HookHandler(hooks, key)

    # -- discovery --------------------------------------------------------------------------------
    def _walk(self, prefix: str, recursive: bool, seen: set) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, obj)`` for every Tensor and Module reachable from the attributes.

        Sub-modules are yielded before their own contents; ``seen`` guards against cycles (a child
        that keeps a reference to its parent) and counts a shared module once.
        """
        for key, value in vars(self).items():
            if key in _INTERNAL:
                continue
            yield from _walk_value(value, prefix + key, recursive, seen)

    def _named(self, want: Callable[[Any], bool], prefix: str, recursive: bool):
        seen_tensors: set[int] = set()
        for name, obj in self._walk(prefix, recursive, {id(self)}):
            if want(obj) and id(obj) not in seen_tensors:  # a shared tensor is listed once
                seen_tensors.add(id(obj))
                yield name, obj

    def named_parameters(self, prefix: str = "",
                         recursive: bool = True) -> Iterator[tuple[str, Parameter]]:
        """``(dotted name, Parameter)`` pairs in definition order (shared ones once)."""
        return self._named(lambda o: isinstance(o, Parameter), _dot(prefix), recursive)

    def parameters(self, recursive: bool = True) -> Iterator[Parameter]:
        """The Parameters, what optimizers update, in definition order (shared ones once).

        Example::

            opt = optim.SGD(model.parameters(), lr=0.1)
        """
        return _values(self.named_parameters(recursive=recursive))

    def named_buffers(self, prefix: str = "",
                      recursive: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Tensors that are state but not trained (BatchNorm running statistics), with names."""
        return self._named(_is_buffer, _dot(prefix), recursive)

    def buffers(self, recursive: bool = True) -> Iterator[Tensor]:
        """The buffers of :meth:`named_buffers` without their names."""
        return _values(self.named_buffers(recursive=recursive))

    def named_tensors(self, prefix: str = "",
                      recursive: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Parameters and buffers together: everything a replica must share (``bcast_list_``)."""
        return self._named(lambda o: isinstance(o, Tensor), _dot(prefix), recursive)

    def tensors(self, recursive: bool = True) -> Iterator[Tensor]:
        """Parameters and buffers without their names (``dist.bcast_list_(model.tensors())``)."""
        return _values(self.named_tensors(recursive=recursive))

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct sub-modules (one level), with their attribute names."""
        return ((name, obj) for name, obj in self._walk("", False, {id(self)})
                if isinstance(obj, Module))

    def children(self) -> Iterator["Module"]:
        """Direct sub-modules (one level)."""
        return _values(self.named_children())

    def named_modules(self, prefix: str = "", with_parent: bool = False) -> Iterator[tuple]:
        """This module (named ``prefix``) and every sub-module, depth first: ``(name, module)``,
        or with ``with_parent`` (MegEngine's) ``(name, module, parent)``, the parent being the
        module whose attribute holds it (None for this module itself)."""
        if with_parent:
            yield prefix, self, None
            yield from self._modules_with_parent(_dot(prefix), {id(self)})
            return
        yield prefix, self
        for name, obj in self._walk(_dot(prefix), True, {id(self)}):
            if isinstance(obj, Module):
                yield name, obj

    def _modules_with_parent(self, prefix: str, seen: set) -> Iterator[tuple]:
        for name, obj in self._walk(prefix, False, seen):
            if isinstance(obj, Module):
                yield name, obj, self
                yield from obj._modules_with_parent(name + ".", seen)

    def modules(self, with_parent: bool = False) -> Iterator:
        """This module and every sub-module, depth first; with ``with_parent``
        ``(module, parent)`` pairs (see :meth:`named_modules`)."""
        if with_parent:
            return (item[1:] for item in self.named_modules(with_parent=True))
        return _values(self.named_modules())

    def apply(self, fn: Callable[["Module"], Any]) -> "Module":
        """Call ``fn`` on every module (self included), e.g. a custom initialiser."""
        for m in list(self.modules()):
            fn(m)
        return self

    # -- modes and gradients ----------------------------------------------------------------------
    def train(self, mode: bool = True, recursive: bool = True) -> "Module":
        """Set training mode (Dropout drops, BatchNorm uses batch statistics)."""
        targets = self.modules() if recursive else [self]
        for m in list(targets):
            m.training = bool(mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Set every parameter's existing gradient to zeros (parameters without one keep None).

        *zero* fills with zeros, here and in ``Optimizer.zero_grad`` (MegEngine's meaning for
        both); to drop gradients instead, use ``Optimizer.clear_grad``. The zeros are a new
        array, so a tensor that shares the old gradient's memory is left alone.
        """
        for p in self.parameters():
            if p.grad is not None:
                p.grad = F.zeros_like(p.grad)

    def to(self, target) -> Any:
        """``module.to(device)`` (PyTorch, OneFlow): move every parameter and buffer to ``device``
        in place (``"cpu"``, ``"gpu0"``, ``"cuda"``...) and return the module, so optimizers built
        on its parameters keep them. OneFlow's ``module.to(nn.graph.GraphModule)`` returns the
        module's graph settings (:class:`~minigrad.module.graph.GraphModule`, whose
        ``set_stage`` marks a pipeline stage).

        Example::

            model = NeuralNetwork().to(DEVICE)
        """
        if target is GraphModule:
            return GraphModule(self)
        if not isinstance(target, (str, Device)):
            raise TypeError(f"{type(self).__name__}.to: expected a device or "
                            f"nn.graph.GraphModule, got {target!r}")
        for t in itertools.chain(self.parameters(), self.buffers()):
            t.move_to_(target)
        return self

    def to_global(self, placement, sbp) -> "Module":
        """OneFlow's ``Module.to_global``: make every parameter and buffer a global tensor on
        ``placement`` with ``sbp``, in place (each keeps its identity, so optimizers and
        GradManagers made earlier still hold it). As in ``Tensor.to_global``, a tensor's value is
        this rank's piece: with ``broadcast`` the placement's first rank's values win. Every rank
        must call it. Returns the module.

        Example::

            stage0.to_global(placement=mg.placement("cpu", [0]), sbp=mg.sbp.broadcast)
        """
        if placement is None or sbp is None:
            raise RuntimeError(
                f"{type(self).__name__}.to_global: needs both placement and sbp, got placement="
                f"{placement!r} and sbp={sbp!r}"
            )
        for t in self.tensors():
            placement.make_global(t, sbp, logical=False)
        return self

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Ordered ``name -> NumPy array`` copy of every parameter and buffer, in logical form
        (see :meth:`state_to_logical`). A global parameter stays a (detached) global tensor, as in
        OneFlow: its logical value lives on several ranks, and ``mg.save(...,
        global_dst_rank=0)`` gathers it."""
        out: OrderedDict[str, np.ndarray] = OrderedDict()
        for name, t in self.named_tensors():
            if t.is_global:
                out[name] = t.detach()
                continue
            arr = to_numpy(t.data)
            out[name] = arr.copy() if arr is t.data else arr
        for prefix, module in self.named_modules():
            module.state_to_logical(out, _dot(prefix))
        return out

    def state_to_logical(self, state: dict, prefix: str) -> None:
        """Hook of :meth:`state_dict`: replace this module's entries (``prefix + name``) of
        ``state`` by their logical values. Layers whose tensors are shards of larger ones (tensor
        parallelism) return the full tensors, so checkpoints do not depend on how a model is
        split. The default leaves ``state`` as it is."""

    def state_from_logical(self, state: dict, prefix: str) -> None:
        """Hook of :meth:`load_state_dict`, the inverse of :meth:`state_to_logical`: replace this
        module's logical entries of ``state`` (a copy of the caller's) by the local values to
        load. The default leaves ``state`` as it is."""

    def load_state_dict(self, state_dict: dict | Callable, strict: bool = True) -> "Module":
        """Copy values (NumPy arrays or Tensors) into the parameters and buffers by name.

        As in MegEngine: with ``strict`` every name must match both ways, and names missing from
        ``state_dict`` or left unused by the module raise :class:`StateDictKeyError` (a
        ``KeyError``); with ``strict=False`` they are skipped, and a warning on the
        ``minigrad.module`` logger names them. ``state_dict`` may also be a function ``(name,
        tensor) -> value or None`` asked for every tensor (None leaves it as it is). Shape
        mismatches are always an error (``ValueError``), except that a 1-D ``(C,)`` value fills a
        tensor whose other axes have size 1 (MegEngine stores the ``(1, C, 1, 1)`` tensors of norm
        layers as ``(C,)``). All problems are reported in one message, and nothing is modified
        unless everything checks out.
        """
        own = OrderedDict(self.named_tensors())
        if callable(state_dict) and not isinstance(state_dict, dict):
            asked = ((k, state_dict(k, t)) for k, t in own.items())
            state_dict = {k: v for k, v in asked if v is not None}
            strict = False  # what the function leaves out stays as it is
        if not isinstance(state_dict, dict):
            raise TypeError(
                f"{type(self).__name__}.load_state_dict: expected a dict of name -> array, got "
                f"{type(state_dict).__name__}"
            )
        state_dict = dict(state_dict)  # the hooks replace entries; the caller's dict stays
        for prefix, module in self.named_modules():
            module.state_from_logical(state_dict, _dot(prefix))
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append(f"missing keys: {missing} (Missing params violate `strict=True`)")
        if strict and unexpected:
            problems.append(f"unexpected keys: {unexpected} (Unused params violate "
                            "`strict=True`)")
        updates = []
        for name, t in own.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            if shape != t.shape and len(shape) == 1 and _squeezed(shape) == _squeezed(t.shape):
                # MegEngine's state_dict flattens norm layers' (1, C, 1, 1) tensors to (C,)
                value = value.reshape(t.shape) if isinstance(value, Tensor) else np.reshape(
                    value, t.shape)
                shape = t.shape
            if shape != t.shape:
                problems.append(f"shape mismatch for {name!r}: expected {t.shape}, got {shape}")
                continue
            updates.append((t, value))
        if problems:
            error = StateDictKeyError if strict and (missing or unexpected) else ValueError
            raise error(f"{type(self).__name__}.load_state_dict: " + "; ".join(problems))
        if not strict and (missing or unexpected):
            _log.warning("%s.load_state_dict(strict=False): missing keys %s, unused keys %s",
                         type(self).__name__, missing, unexpected)
        for t, value in updates:
            t.set_value(value.data if isinstance(value, Tensor) else value)
        return self

    # -- printing ---------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The constructor arguments shown by ``repr``; layers override this."""
        return ""

    def __repr__(self) -> str:
        # every attribute that holds a module is shown, also a second name for a shared one
        # (MegEngine's and PyTorch's repr); only a reference back to this module is left out
        children = [(name, obj) for key, value in vars(self).items() if key not in _INTERNAL
                    for name, obj in _walk_value(value, key, False, {id(self)})
                    if isinstance(obj, Module)]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not children:
            return head + ")"
        lines = [head]
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


def _squeezed(shape) -> tuple:
    return tuple(n for n in shape if n != 1)
def _values(named: Iterator[tuple[str, Any]]) -> Iterator[Any]:
    return (obj for _, obj in named)


def _is_buffer(obj) -> bool:
    return isinstance(obj, Tensor) and not isinstance(obj, Parameter)


def _dot(prefix: str) -> str:
    return prefix + "." if prefix else ""


def _walk_value(value, name: str, recursive: bool, seen: set):
    if isinstance(value, Tensor):
        yield name, value
    elif isinstance(value, Module):
        if id(value) in seen:
            return
        seen.add(id(value))
        yield name, value
        if recursive:
            yield from value._walk(name + ".", True, seen)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk_value(item, f"{name}.{i}", recursive, seen)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk_value(item, f"{name}.{key}", recursive, seen)


# -- tracing (the profiler): swapped in only while a tracer is set
_untraced_module_call = Module.__call__


def _traced_module_call(self, *args, **kwargs):
    return seams.TRACER.value.module(self, lambda: _untraced_module_call(self, *args, **kwargs))


def _use_tracer(tracer) -> None:
    Module.__call__ = _untraced_module_call if tracer is None else _traced_module_call


seams.TRACER.watch(_use_tracer)
