"""Dataset abstractions: map-style (random access) and stream-style (iteration only).

Map-style datasets are what samplers index into; stream datasets are read front to back (e.g. from
a socket or a huge file) and are batched by the DataLoader as they arrive.

Example::

    ds = ArrayDataset(images, labels)      # ds[i] == (images[i], labels[i])
    both = ConcatDataset([ds, other])      # indices continue across the parts
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["Dataset", "StreamDataset", "ArrayDataset", "ConcatDataset"]


class Dataset(ABC):
    """A map-style dataset: ``len(ds)`` samples, each fetched by an integer index."""

    @abstractmethod
    def __getitem__(self, index: int) -> Any:
        """Return sample ``index`` (usually a tuple such as ``(image, label)``)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    def __add__(self, other: Dataset) -> ConcatDataset:
        """``a + b``: the samples of ``a`` then those of ``b`` (a :class:`ConcatDataset`)."""
        return ConcatDataset([self, other])


class StreamDataset(ABC):
    """An iterable dataset with no random access and possibly no known length."""

    @abstractmethod
    def __iter__(self) -> Iterator[Any]:
        """Yield samples one by one."""

    def __getitem__(self, index: int) -> Any:
        """Refused: a stream has no random access."""
        raise TypeError(f"{type(self).__name__} is a StreamDataset: it can only be iterated")


def _check_index(index: Any, length: int, owner: str) -> int:
    """Turn ``index`` into a non-negative int, with Python's negative-index convention."""
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"{owner}: index must be an integer, got {type(index).__name__}")
    i = int(index)
    if i < 0:
        i += length
    if not 0 <= i < length:
        raise IndexError(f"{owner}: index {int(index)} out of range for length {length}")
    return i


class ArrayDataset(Dataset):
    """Zip equally long arrays into a dataset whose items are tuples ``(a0[i], a1[i], ...)``.

    Example::

        ds = ArrayDataset(images, labels)   # ds[3] == (images[3], labels[3])
    """

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset: need at least one array")
        lengths = [len(a) for a in arrays]
        if len(set(lengths)) != 1:
            raise ValueError(f"ArrayDataset: all arrays must have the same length, got {lengths}")
        self.arrays = arrays

    def __getitem__(self, index: int) -> tuple:
        i = _check_index(index, len(self), "ArrayDataset")
        return tuple(a[i] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(np.shape(a))) for a in self.arrays)
        return f"ArrayDataset(n={len(self)}, arrays=[{shapes}])"


class ConcatDataset(Dataset):
    """Concatenation of map-style datasets; index ``i`` runs through them in order."""

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: need at least one dataset")
        for k, ds in enumerate(self.datasets):
            if isinstance(ds, StreamDataset) or not hasattr(ds, "__len__"):
                raise TypeError(
                    f"ConcatDataset: dataset {k} ({type(ds).__name__}) is not map-style"
                )
        self.cumulative_sizes = np.cumsum([len(ds) for ds in self.datasets]).tolist()

    def __getitem__(self, index: int) -> Any:
        i = _check_index(index, len(self), "ConcatDataset")
        part = bisect.bisect_right(self.cumulative_sizes, i)
        offset = self.cumulative_sizes[part - 1] if part > 0 else 0
        return self.datasets[part][i - offset]

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __repr__(self) -> str:
        return f"ConcatDataset(n={len(self)}, datasets={self.datasets!r})"
