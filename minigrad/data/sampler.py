"""Samplers decide which samples form each batch, and which rank sees them.

Iterating a sampler yields batches (lists of int indices); ``len(sampler)`` is the number of
batches this rank gets per epoch. Sharding follows MegEngine: the epoch's index list is padded by
repeating its head to a multiple of ``world_size`` and rank ``r`` takes ``indices[r::world_size]``,
so every rank gets the same number of batches (collectives stay in lockstep). Random samplers
derive each epoch's permutation from ``(seed, epoch)``, so all ranks draw the same permutation
without communicating.

``epoch`` has one meaning: the number of the current epoch, i.e. the pass being iterated (or the
last one), counted from 0. Each new ``iter()`` starts the next epoch; ``set_epoch(e)`` makes ``e``
current so that the next ``iter()`` draws epoch ``e`` (to replay or resume one).

``world_size`` and ``rank`` left out come from the initialised process group, as MegEngine's
samplers do. This package sits below ``minigrad.distributed`` in the layer order, so it asks
through a seam, :data:`minigrad.seams.WORLD`, which the distributed runtime fills when imported.
Nothing is guessed silently: a rank without a world size (or the reverse) is an error, and so is a
process started by a launcher (``RANK``/``WORLD_SIZE`` set) that builds a sampler before
``init_process_group``, since it would otherwise read the whole dataset on every rank.

Example::

    sampler = RandomSampler(dataset, batch_size=64, drop_last=True, seed=0)
    for epoch in range(3):
        for batch in sampler:          # batch: list of 64 ints, new order every epoch
            ...
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from minigrad import seams

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
#: The environment variables a launcher sets in each rank it starts (torchrun's names, which
#: ``python -m minigrad.distributed.launch`` and ``@dist.launcher`` use too).
RANK_ENV, WORLD_SIZE_ENV = "RANK", "WORLD_SIZE"

def _launched_world() -> tuple[int, int] | None:
    """(world_size, rank) a launcher put in the environment, or None."""
    world, rank = os.environ.get(WORLD_SIZE_ENV), os.environ.get(RANK_ENV)
    if world is None or rank is None:
        return None
    return int(world), int(rank)


def _resolve_world(owner: str, world_size: int | None, rank: int | None) -> tuple[int, int]:
    """Explicit world_size/rank win; missing ones come from the process group, never a guess."""
    world = None if world_size is None else _check_int("world_size", owner, world_size, 1)
    if rank is not None:
        rank = _check_int("rank", owner, rank, 0)
    job = seams.WORLD.value()  # (world_size, rank) of the process group, or None
    if world is None and rank is None:
        if job is not None:
            return job
        launched = _launched_world()
        if launched is not None and launched[0] > 1:
            raise RuntimeError(
                f"{owner}: this process is rank {launched[1]} of {launched[0]} ({RANK_ENV} and "
                f"{WORLD_SIZE_ENV} are set by the launcher) but no process group is initialised, "
                f"so the sampler cannot tell its shard; call dist.init_process_group() before "
                f"building samplers, or pass world_size= and rank="
            )
        return 1, 0
    if world is None:
        if job is None:
            raise ValueError(
                f"{owner}: rank={rank} given without world_size and no process group is "
                f"initialised; pass world_size= too"
            )
        world = job[0]
    if rank is None:
        if job is not None and job[0] == world:
            rank = job[1]
        elif world == 1:
            rank = 0
        else:
            group = "no process group is initialised" if job is None else (
                f"the process group has world size {job[0]}")
            raise ValueError(
                f"{owner}: world_size={world} given without rank ({group}); pass rank= too"
            )
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
    """Base class: an iterable of batches (lists of indices) that counts epochs (see above)."""

    epoch: int = 0
    _epoch_started: bool = False

    def __iter__(self) -> Iterator[list[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def next_epoch(self) -> int:
        """Start a pass: advance ``epoch`` unless it has not been iterated yet; return it."""
        if self._epoch_started:
            self.epoch += 1
        self._epoch_started = True
        return self.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` current: the next pass draws it (e.g. when resuming training)."""
        self.epoch = _check_int("epoch", type(self).__name__, epoch, 0)
        self._epoch_started = False

    def state_dict(self) -> dict:
        """The epoch counter (``epoch`` and whether it was iterated): what the next pass draws
        follows from it, and the order of an epoch from ``(seed, epoch)``."""
        return {"epoch": self.epoch, "started": self._epoch_started}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: the next pass draws what it would have drawn then."""
        self.epoch = _check_int("epoch", type(self).__name__, state["epoch"], 0)
        self._epoch_started = bool(state["started"])

    def upcoming_epoch(self) -> int:
        """The epoch the next pass will draw."""
        return self.epoch + 1 if self._epoch_started else self.epoch


class MapSampler(Sampler):
    """Shared machinery of the map-style samplers: validation, sharding and batching.

    The epoch's samples are ``num_samples`` draws (default: the dataset's length), or the given
    ``indices`` (a subset of the dataset, in this order). Subclasses implement :meth:`sample`
    returning this epoch's full (unsharded) index list.
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
        indices: Sequence[int] | None = None,
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
        self.indices = _check_indices(owner, indices, len(dataset))
        if self.indices is not None:
            num_samples = len(self.indices)
        total = len(dataset) if num_samples is None else _check_int(
            "num_samples", owner, num_samples, 1)
        self.total_samples = total
        # Samples per rank after padding to a multiple of world_size.
        self.num_samples = math.ceil(total / self.world_size)

    def sample(self, epoch: int) -> list[int]:
        """The full index list of ``epoch``, identical on every rank."""
        raise NotImplementedError

    def base_indices(self) -> np.ndarray:
        """The samples an epoch is drawn from: ``indices`` if given, else the whole dataset."""
        if self.indices is None:
            return np.arange(len(self.dataset))
        return np.asarray(self.indices, dtype=np.int64)

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
        return self.batching(self.scatter(list(self.sample(self.next_epoch()))))

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def _repr_fields(self) -> str:
        return (f"n={self.total_samples}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last}, world_size={self.world_size}, rank={self.rank}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._repr_fields()}, seed={self.seed}, epoch={self.epoch})"


def _check_indices(owner: str, indices: Sequence[int] | None, length: int) -> list[int] | None:
    if indices is None:
        return None
    out = [int(i) for i in indices]
    bad = [i for i in out if not 0 <= i < length]
    if bad:
        raise ValueError(f"{owner}: indices must lie in [0, {length}), got e.g. {bad[:3]}")
    return out


class SequentialSampler(MapSampler):
    """Indices in order (``0..len-1``, or the given ``indices``); sharded across ranks, no
    shuffling (the usual evaluation sampler).

    Example::

        loader = DataLoader(test_set, SequentialSampler(test_set, batch_size=500))
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 indices: Sequence[int] | None = None, world_size: int | None = None,
                 rank: int | None = None) -> None:
        super().__init__(dataset, batch_size, drop_last, world_size=world_size, rank=rank,
                         seed=0, indices=indices)

    def sample(self, epoch: int) -> list[int]:
        return self.base_indices().tolist()

    def __repr__(self) -> str:
        return f"SequentialSampler({self._repr_fields()}, shuffle=False)"


class RandomSampler(MapSampler):
    """A fresh permutation of the dataset (or of ``indices``) each epoch, the same on all ranks
    (it depends only on ``seed`` and the epoch).

    Example::

        sampler = RandomSampler(train_set, batch_size=64, drop_last=True, seed=0)
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 indices: Sequence[int] | None = None, world_size: int | None = None,
                 rank: int | None = None, seed: int | None = None) -> None:
        super().__init__(dataset, batch_size, drop_last, world_size=world_size, rank=rank,
                         seed=seed, indices=indices)

    def sample(self, epoch: int) -> list[int]:
        return self._rng(epoch).permutation(self.base_indices()).tolist()

    def _repr_fields(self) -> str:
        return super()._repr_fields() + ", shuffle=True"


class ReplacementSampler(MapSampler):
    """``num_samples`` indices drawn with replacement, optionally with per-sample ``weights``
    (e.g. to oversample rare classes).

    Example::

        sampler = ReplacementSampler(ds, batch_size=32, num_samples=10_000, weights=w, seed=0)
    """

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False,
                 num_samples: int | None = None, weights: Sequence[float] | None = None,
                 world_size: int | None = None, rank: int | None = None,
                 seed: int | None = None) -> None:
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

    def _repr_fields(self) -> str:
        weighted = self.weights is not None
        return super()._repr_fields() + f", replacement=True, weighted={weighted}"


class Infinite(Sampler):
    """Repeat ``sampler`` forever, one epoch after another (each pass advances its epoch), for
    step-based training loops.

    Example::

        batches = iter(DataLoader(ds, Infinite(RandomSampler(ds, batch_size=64, seed=0))))
    """

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

    def state_dict(self) -> dict:
        """The wrapped sampler's epoch counter."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the wrapped sampler's epoch counter."""
        self.sampler.load_state_dict(state)

    def upcoming_epoch(self) -> int:
        """The epoch the wrapped sampler's next pass will draw."""
        return self.sampler.upcoming_epoch()

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

    It has no length and no epochs; the DataLoader groups the stream's items into batches of
    ``batch_size``.

    Example::

        loader = DataLoader(stream_ds, StreamSampler(batch_size=32))
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

    def __repr__(self) -> str:
        return (f"StreamSampler(batch_size={self.batch_size}, drop_last={self.drop_last}, "
                f"world_size={self.world_size}, rank={self.rank})")
