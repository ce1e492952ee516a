"""``Sequential``: a chain of modules, built positionally or from an ``OrderedDict``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

from minigrad.module.module import Module


class Sequential(Module):
    """Apply modules in order. Sub-modules are attributes named ``"0"``, ``"1"``... (or the dict
    keys), so ``state_dict`` names read ``0.weight`` as in MegEngine and PyTorch.

    Supports ``len``, iteration, integer indexing and slicing (a slice is a new ``Sequential``
    sharing the same layers, which is how pipeline code cuts a model into stages).

    Example::

        net = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
        head = net[1:]  # Sequential(ReLU, Linear)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(**kwargs)
        self._keys: list[str] = []
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            items = list(args[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(args)]
        for key, module in items:
            self._add(str(key), module)

    def _add(self, key: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(
                f"Sequential: element {key!r} must be a Module, got {type(module).__name__}"
            )
        if key in self.__dict__:
            raise ValueError(f"Sequential: duplicate or reserved layer name {key!r}")
        setattr(self, key, module)
        self._keys.append(key)

    def append(self, module: Module) -> "Sequential":
        """Add a layer at the end, named by its position."""
        self._add(str(len(self._keys)), module)
        return self

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Module]:
        return (getattr(self, k) for k in self._keys)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(OrderedDict((k, getattr(self, k)) for k in self._keys[idx]))
        try:
            key = self._keys[idx]
        except (IndexError, TypeError):
            raise IndexError(
                f"Sequential: index {idx!r} out of range for {len(self)} layers"
            ) from None
        return getattr(self, key)

    def forward(self, x):
        for key in self._keys:
            x = getattr(self, key)(x)
        return x
