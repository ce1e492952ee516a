"""Collator: merge a list of samples into one batch of NumPy arrays, keeping the sample structure.

Arrays (and Tensors, as NumPy arrays) are stacked along a new leading axis; Python/NumPy scalars
become 1-D arrays; tuples, namedtuples, lists and dicts are collated field by field (recursively);
strings stay a list. :func:`as_tensors` turns a collated batch's arrays into Tensors (the batches
of PyTorch's spelling of the DataLoader).

Example::

    Collator().apply([(img0, 3), (img1, 7)])  # -> (array of shape (2, *img.shape), array([3, 7]))
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from minigrad.autodiff.tensor import Tensor

__all__ = ["Collator", "as_tensors"]


class Collator:
    """Default batch builder of the DataLoader; subclass and override ``apply`` to customise."""

    def apply(self, inputs: Sequence[Any]) -> Any:
        """Collate ``inputs`` (a non-empty list of samples with the same structure)."""
        if len(inputs) == 0:
            raise ValueError("Collator: cannot collate an empty batch")
        return _collate(list(inputs), "batch")

    __call__ = apply

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def as_tensors(batch: Any) -> Any:
    """``batch`` with every NumPy array inside it (in tuples, lists, dicts) made a Tensor on the
    default device, keeping its dtype (PyTorch's batches: int64 labels stay int64)."""
    if isinstance(batch, np.ndarray):
        return Tensor(batch)
    if isinstance(batch, Mapping):
        return {k: as_tensors(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(as_tensors(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(as_tensors(v) for v in batch)
    return batch


def _collate(batch: list[Any], where: str) -> Any:
    elem = batch[0]
    if isinstance(elem, Tensor):  # a sample that a transform made a Tensor (ToTensor)
        batch = [x.numpy() if isinstance(x, Tensor) else x for x in batch]
        elem = batch[0]
    if isinstance(elem, np.ndarray):
        shapes = {x.shape for x in batch if isinstance(x, np.ndarray)}
        if len(shapes) != 1 or not all(isinstance(x, np.ndarray) for x in batch):
            kinds = sorted({getattr(x, "shape", type(x).__name__).__str__() for x in batch})
            raise ValueError(
                f"Collator: cannot stack {where}: every sample needs an array of the same shape, "
                f"got {kinds}"
            )
        return np.stack(batch)
    if isinstance(elem, (np.generic, numbers.Number)) and not isinstance(elem, (str, bytes)):
        try:
            return np.asarray(batch)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Collator: cannot make an array of {where} ({exc})") from exc
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, Mapping):
        keys = set(elem)
        for x in batch:
            if not isinstance(x, Mapping) or set(x) != keys:
                raise ValueError(f"Collator: samples of {where} are dicts with different keys")
        return {k: _collate([x[k] for x in batch], f"{where}[{k!r}]") for k in elem}
    if isinstance(elem, (tuple, list)):
        n = len(elem)
        if any(not isinstance(x, (tuple, list)) or len(x) != n for x in batch):
            lens = sorted({len(x) if isinstance(x, (tuple, list)) else -1 for x in batch})
            raise ValueError(
                f"Collator: samples of {where} must all be sequences of length {n}, got "
                f"lengths {lens} (-1: not a sequence)"
            )
        columns = zip(*batch, strict=True)
        fields = [_collate(list(col), f"{where}[{i}]") for i, col in enumerate(columns)]
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
            return type(elem)(*fields)
        return tuple(fields) if isinstance(elem, tuple) else fields
    raise TypeError(f"Collator: don't know how to collate {where} of type {type(elem).__name__}")
