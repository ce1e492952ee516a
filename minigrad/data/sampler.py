"""Samplers decide which samples form each batch, and which rank sees them.

Iterating a sampler yields batches (lists of int indices); ``len(sampler)`` is the number of
batches this rank gets per epoch. Sharding follows MegEngine: the epoch's index list is padded by
repeating its head to a multiple of ``world_size`` and rank ``r`` takes ``indices[r::world_size]``,
so every rank gets the same number of batches (collectives stay in lockstep). Random samplers
derive each epoch's permutation from ``(seed, epoch)``, so all ranks draw the same permutation
without communicating, and every ``__iter__`` starts a new epoch (``set_epoch`` resets it).

Example::

    sampler = RandomSampler(dataset, batch_size=64, drop_last=True, seed=0)
    for epoch in range(3):
        for batch in sampler:          # batch: list of 64 ints, new order every epoch
            ...
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Sampler",
    "MapSampler",
    "SequentialSampler",
    "RandomSampler",
    "ReplacementSampler",
    "Infinite",
    "StreamSampler",
]

# Seed used when seed=None but several ranks must agree on the order without communicating.
DEFAULT_DISTRIBUTED_SEED = 0


def _distributed_world() -> tuple[int, int]:
    """(world_size, rank) of the initialised distributed group, or (1, 0) without one."""
    try:
        from minigrad import distributed as dist
    except ImportError:
        return 1, 0
    try:
        if dist.is_distributed():
            return int(dist.get_world_size()), int(dist.get_rank())
    except AttributeError:  # distributed package present but not (yet) providing these
        pass
    return 1, 0


def _resolve_world(owner: str, world_size: int | None, rank: int | None) -> tuple[int, int]:
    """Explicit world_size/rank win; missing ones come from the distributed group (or 1, 0)."""
    dist_world, dist_rank = _distributed_world()
    world = dist_world if world_size is None else _check_int("world_size", owner, world_size, 1)
    if rank is None:
        rank = dist_rank if world == dist_world else 0
    rank = _check_int("rank", owner, rank, 0)
    if rank >= world:
        raise ValueError(f"{owner}: rank must be < world_size ({world}), got rank {rank}")
    return world, rank


def _check_int(name: str, owner: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return int(value)


class Sampler:
    """Base class: an iterable of batches (lists of indices) with a per-epoch counter."""

    epoch: int = 0

    def __iter__(self) -> Iterator[list[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``__iter__`` produce epoch ``epoch`` (e.g. when resuming training)."""
        self.epoch = _check_int("epoch", type(self).__name__, epoch, 0)


class MapSampler(Sampler):
    """Shared machinery of the map-style samplers: validation, sharding and batching.

    Subclasses implement :meth:`sample` returning this epoch's full (unsharded) index list.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_samples: int | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        seed: int | None = None,
    ) -> None:
        owner = type(self).__name__
        if not hasattr(dataset, "__len__"):
            raise TypeError(
                f"{owner}: needs a map-style dataset with __len__, got {type(dataset).__name__} "
                f"(use StreamSampler for a StreamDataset)"
            )
        self.dataset = dataset
        self.batch_size = _check_int("batch_size", owner, batch_size, 1)
        self.drop_last = bool(drop_last)
        self.world_size, self.rank = _resolve_world(owner, world_size, rank)
        if seed is None:
            seed = (
                DEFAULT_DISTRIBUTED_SEED
                if self.world_size > 1
                else int(np.random.SeedSequence().generate_state(1)[0])
            )
        self.seed = _check_int("seed", owner, seed, 0)
        total = len(dataset) if num_samples is None else _check_int(
            "num_samples", owner, num_samples, 1)
        self.total_samples = total
        # Samples per rank after padding to a multiple of world_size.
        self.num_samples = math.ceil(total / self.world_size)
        self.epoch = 0

    def sample(self, epoch: int) -> list[int]:
        """The full index list of ``epoch``, identical on every rank."""
        raise NotImplementedError

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def scatter(self, indices: list[int]) -> list[int]:
        """Pad ``indices`` by repeating its head to a multiple of world_size; keep this rank's."""
        if self.world_size == 1:
            return indices
        total = self.num_samples * self.world_size
        if indices and len(indices) < total:
            reps = math.ceil(total / len(indices))
            indices = (indices * reps)[:total]
        return indices[self.rank:total:self.world_size]

    def batching(self, indices: list[int]) -> Iterator[list[int]]:
        """Cut ``indices`` into batches of batch_size, dropping the short tail if drop_last."""
        stop = len(indices)
        if self.drop_last:
            stop -= stop % self.batch_size
        for start in range(0, stop, self.batch_size):
            yield indices[start:start + self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return self.batching(self.scatter(list(self.sample(epoch))))

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self.total_samples}, batch_size={self.batch_size}, "
            f"drop_last={self.drop_last}, world_size={self.world_size}, rank={self.rank}, "
            f"seed={self.seed})"
        )


def _check_indices(owner: str, indices: Sequence[int] | None, length: int) -> list[int] | None:
    if indices is None:
        return None
    out = [int(i) for i in indices]
    bad = [i for i in out if not 0 <= i < length]
    if bad:
        raise ValueError(f"{owner}: indices must lie in [0, {length}), got e.g. {bad[:3]}")
    return out


class SequentialSampler(MapSampler):
    """Indices in order (``0..len-1``, or the given ``indices``); sharded across ranks."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        indices: Sequence[int] | None = None,
        world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        owner = type(self).__name__
        n = len(dataset) if hasattr(dataset, "__len__") else 0
        self.indices = _check_indices(owner, indices, n)
        num = None if self.indices is None else len(self.indices)
        super().__init__(dataset, batch_size, drop_last, num, world_size, rank, seed=0)

    def sample(self, epoch: int) -> list[int]:
        return list(range(len(self.dataset))) if self.indices is None else list(self.indices)


class RandomSampler(MapSampler):
    """A fresh permutation of the dataset (or of ``indices``) each epoch, same on all ranks."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        indices: Sequence[int] | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        seed: int | None = None,
    ) -> None:
        owner = type(self).__name__
        n = len(dataset) if hasattr(dataset, "__len__") else 0
        self.indices = _check_indices(owner, indices, n)
        num = None if self.indices is None else len(self.indices)
        super().__init__(dataset, batch_size, drop_last, num, world_size, rank, seed)

    def sample(self, epoch: int) -> list[int]:
        base = (np.arange(len(self.dataset)) if self.indices is None
                else np.asarray(self.indices, dtype=np.int64))
        return self._rng(epoch).permutation(base).tolist()


class ReplacementSampler(MapSampler):
    """``num_samples`` indices drawn with replacement, optionally with per-sample ``weights``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_samples: int | None = None,
        weights: Sequence[float] | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(dataset, batch_size, drop_last, num_samples, world_size, rank, seed)
        self.weights = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            n = len(dataset)
            if w.shape != (n,):
                raise ValueError(
                    f"ReplacementSampler: weights must have shape ({n},), got {w.shape}"
                )
            if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
                raise ValueError(
                    "ReplacementSampler: weights must be finite, non-negative, with a positive sum"
                )
            self.weights = w / w.sum()

    def sample(self, epoch: int) -> list[int]:
        return self._rng(epoch).choice(
            len(self.dataset), size=self.total_samples, replace=True, p=self.weights
        ).tolist()


class Infinite(Sampler):
    """Repeat ``sampler`` forever, one epoch after another (each pass advances its epoch)."""

    def __init__(self, sampler: MapSampler) -> None:
        if not isinstance(sampler, Sampler) or isinstance(sampler, Infinite):
            raise TypeError(
                f"Infinite: needs a finite Sampler to wrap, got {type(sampler).__name__}"
            )
        self.sampler = sampler

    def __getattr__(self, name: str) -> Any:
        # batch_size, drop_last, seed, world_size, rank, dataset... come from the wrapped sampler.
        if name == "sampler":
            raise AttributeError(name)
        return getattr(self.sampler, name)

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            empty = True
            for batch in self.sampler:
                empty = False
                yield batch
            if empty:
                raise ValueError(f"Infinite: wrapped {self.sampler!r} yields no batches")

    def __len__(self) -> int:
        return sys.maxsize

    def __repr__(self) -> str:
        return f"Infinite({self.sampler!r})"


class StreamSampler(Sampler):
    """Batching (and rank sharding) for a StreamDataset: item ``i`` goes to rank ``i % world``.

    It has no length; the DataLoader groups the stream's items into batches of ``batch_size``.
    """

    def __init__(
        self,
        batch_size: int = 1,
        drop_last: bool = False,
        world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        owner = type(self).__name__
        self.batch_size = _check_int("batch_size", owner, batch_size, 1)
        self.drop_last = bool(drop_last)
        self.world_size, self.rank = _resolve_world(owner, world_size, rank)
        self.epoch = 0

    def batches(self, stream: Any) -> Iterator[list[Any]]:
        """Group this rank's share of the items of ``stream`` into batches."""
        batch: list[Any] = []
        for i, item in enumerate(stream):
            if i % self.world_size != self.rank:
                continue
            batch.append(item)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __iter__(self) -> Iterator[list[int]]:
        raise TypeError("StreamSampler: pass it to a DataLoader together with a StreamDataset")

    def __len__(self) -> int:
        raise TypeError("StreamSampler: a stream has no length")
