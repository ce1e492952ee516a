"""Layer specifications: pipeline layers described by class and arguments, built where needed.

A :class:`LayerSpec` names a layer class and its constructor arguments; a pipeline stage builds
only the specs it owns, so a 100-layer model never materialises on every rank. A
:class:`TiedLayerSpec` is a layer whose weights several positions share (an embedding reused as the
output head).

Parameter counts. ``partition_method="parameters"`` balances trainable parameters, so it must
know each layer's count. Where it can, a spec's count comes from its arguments, asked of the class,
without building anything:

* a classmethod ``parameter_count(*args, **kwargs)`` (a user's layer; subclasses inherit it);
* else the layer's ``count_parameters(*args, **kwargs)``, which minigrad's layers define
  (``M.Linear.count_parameters(64, 32) == 2080``). The count mirrors a constructor, so it is asked
  of the class that defines it, or inherited from a base that defines it for the constructor it
  inherits itself (a base without its own ``__init__``, such as the activations' shared base),
  as long as no class in between adds an ``__init__``. A subclass of a layer that defines both
  may take other arguments, so its count is not guessed.

Otherwise (:meth:`LayerSpec.num_parameters` is None) the spec is built once, its trainable
parameters counted and the layer discarded, as DeepSpeed does (:meth:`LayerSpec.count_by_building`).
That build draws nothing from the random generators as far as the rest of the program can tell:
the CPU generators' states are restored afterwards, so the layers a stage then builds get the same
initial weights whether or not a count was needed.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

from minigrad.backend.rng import get_rng
from minigrad.module import Module

__all__ = ["LayerSpec", "TiedLayerSpec", "layer_name", "layer_parameter_count"]


class LayerSpec:
    """A layer described by its class and constructor arguments, built only where it is needed.

    ``LayerSpec(M.Linear, 64, 64, bias=False).build()`` is ``M.Linear(64, 64, bias=False)``; a
    :class:`~minigrad.distributed.pipeline.PipelineModule` calls :meth:`build` only on the stage
    that owns the layer.
    """

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any):
        if not (isinstance(typename, type) and issubclass(typename, Module)):
            raise TypeError(
                f"LayerSpec: expected a Module subclass, got {typename!r}; pass a built layer "
                f"or a plain callable to PipelineModule directly"
            )
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self) -> Module:
        """Construct the layer."""
        return self.typename(*self.module_args, **self.module_kwargs)

    def num_parameters(self) -> int | None:
        """The number of trainable parameters of the built layer, computed from the arguments
        without building it; None when unknown (see the module docstring)."""
        counter = getattr(self.typename, "parameter_count", None)
        if counter is not None:
            return int(counter(*self.module_args, **self.module_kwargs))
        if not _counts_its_constructor(self.typename):
            return None
        counter = self.typename.count_parameters
        try:
            inspect.signature(counter).bind(*self.module_args, **self.module_kwargs)
        except TypeError:
            return None  # arguments the constructor would reject: no count
        return int(counter(*self.module_args, **self.module_kwargs))

    def count_by_building(self) -> int:
        """The trainable parameters of the layer, counted on a copy built once and discarded
        (DeepSpeed's way, for layers that cannot be counted from their arguments). The count is
        kept, so the layer is built at most once for counting; the CPU random generators are left
        as they were."""
        count = self.__dict__.get("_built_count")
        if count is None:
            cpu = get_rng("cpu0").bit_generator
            saved = cpu.state, np.random.get_state()
            try:
                layer = self.build()
                count = sum(p.size for p in layer.parameters() if p.requires_grad)
            finally:
                cpu.state = saved[0]
                np.random.set_state(saved[1])
            del layer
            self._built_count = count = int(count)
        return count

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args]
        args += [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{type(self).__name__}({', '.join([self.typename.__name__, *args])})"


def _defining_class(cls: type, name: str) -> type | None:
    """The nearest class in ``cls``'s MRO whose own namespace holds ``name`` (None: none does)."""
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _counts_its_constructor(cls: type) -> bool:
    """Whether ``cls.count_parameters`` describes ``cls``'s constructor: it is ``cls``'s own, or
    it comes from a base that defines no ``__init__`` and sits below the class whose ``__init__``
    ``cls`` uses (a count written for the constructor that the base inherits, so for ``cls`` too).
    A count defined next to a constructor (``M.Linear``'s) is not passed to subclasses."""
    owner = _defining_class(cls, "count_parameters")
    if owner is None or vars(owner)["count_parameters"] is None:
        return False
    if owner is cls:
        return True
    init_owner = _defining_class(cls, "__init__")
    return owner is not init_owner and issubclass(owner, init_owner)


class TiedLayerSpec(LayerSpec):
    """A layer whose weights are shared by every position that uses the same ``key``.

    Each stage owning a position of ``key`` builds one copy (once, however many positions it
    owns); the engine broadcasts it from the lowest owning stage at start and sums its gradients
    over the owning stages, so the copies stay identical. ``forward_fn(layer, x)``, if given,
    replaces ``layer(x)`` at this position (e.g. an embedding used as the output projection).
    ``tied_weight_attr`` names the shared attribute(s) (a string or a list of strings).
    """

    def __init__(
        self,
        key: str,
        typename: type,
        *module_args: Any,
        forward_fn: Callable | None = None,
        tied_weight_attr: str | Sequence[str] = "weight",
        **module_kwargs: Any,
    ):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        attrs = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        if not attrs or not all(isinstance(a, str) for a in attrs):
            raise TypeError(
                f"TiedLayerSpec({key!r}): tied_weight_attr must be a name or a list of names, "
                f"got {tied_weight_attr!r}"
            )
        self.tied_weight_attr = tuple(attrs)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, key={self.key!r})"


def layer_name(layer) -> str:
    """The class name of a pipeline layer (a spec, a module or a callable): what a ``type:REGEX``
    partition matches and the partition table shows."""
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, Module):
        return type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


def layer_parameter_count(layer, build: bool = True) -> int | None:
    """The trainable parameters of a pipeline layer: a spec's count from its arguments, or from a
    copy built once when the arguments cannot tell (see the module docstring; with
    ``build=False`` None instead, unless it was already counted); a built module's actual count;
    0 for a plain callable."""
    if isinstance(layer, LayerSpec):
        count = layer.num_parameters()
        if count is None and (build or "_built_count" in layer.__dict__):
            count = layer.count_by_building()
        return count
    if isinstance(layer, Module):
        return sum(p.size for p in layer.parameters())
    return 0
