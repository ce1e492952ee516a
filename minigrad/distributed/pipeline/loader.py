"""``RepeatingLoader``: an endless iterator over a data loader, for ``train_batch(data_iter)``.

A pipeline step pulls a fixed number of micro-batches (``micro_batches``) from one iterator, and
steps do not line up with epochs; wrapping the loader makes "the next micro-batch" always exist.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

__all__ = ["RepeatingLoader"]


class RepeatingLoader:
    """Iterate over ``loader`` forever: when an epoch ends, start a new one (``iter(loader)``
    again, so a shuffling sampler reshuffles).

    Example::

        data = iter(RepeatingLoader(loader))
        for step in range(100):
            loss = engine.train_batch(data)    # pulls micro_batches items per step
    """

    def __init__(self, loader: Iterable):
        self.loader = loader
        self._iterator = iter(loader)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.loader)
            try:
                return next(self._iterator)
            except StopIteration:
                raise ValueError(
                    "RepeatingLoader: the loader yields no items, so it cannot repeat"
                ) from None
