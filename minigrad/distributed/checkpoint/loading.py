"""``dist.checkpoint.load`` (in place, into whatever layout this job has) and ``latest``.

Every rank reads the index and checks it (every tensor covered exactly once), works out the
logical elements it holds now (its :class:`~.pieces.Shard` of each tensor, from its current
layout) and reads only the stored pieces that overlap them. Problems are gathered from every
rank before anything is modified, so a missing or corrupt file is reported on every rank — naming
the file and the tensor — instead of one rank failing while the others wait for it.
"""

from __future__ import annotations

import os

import numpy as np

from minigrad.distributed.checkpoint.pieces import Box, assemble, check_coverage
from minigrad.distributed.checkpoint.saving import describe_layout, gather, world
from minigrad.distributed.checkpoint.state import collect
from minigrad.distributed.checkpoint.storage import (
    INDEX,
    LATEST,
    PieceReader,
    np_dtype,
    read_index,
)
from minigrad.distributed.runtime.log import get_logger
from minigrad.serialization import CheckpointError

__all__ = ["latest", "load", "validate_index"]


def validate_index(index: dict, directory: str) -> None:
    """Raise unless every tensor of ``index`` is covered by its pieces exactly once."""
    for key, meta in index.get("tensors", {}).items():
        pieces = [(Box(tuple(p["offsets"]), tuple(p["sizes"])), f"{p['file']}: {p['name']}")
                  for p in meta["pieces"]]
        why = check_coverage(key, tuple(meta["shape"]), pieces)
        if why is not None:
            raise CheckpointError(
                f"dist.checkpoint.load: {os.path.join(directory, INDEX)!r} is inconsistent: {why}")


def _read_shard(shard, meta: dict, reader: PieceReader) -> np.ndarray:
    if tuple(meta["shape"]) != tuple(shard.shape):
        raise CheckpointError(
            f"dist.checkpoint.load: tensor {shard.key!r} has shape {tuple(meta['shape'])} in the "
            f"checkpoint, but {tuple(shard.shape)} here")
    if shard.flat is None:
        for piece in meta["pieces"]:  # the same layout: one stored piece is exactly this shard
            if list(piece["sizes"]) == list(shard.local_shape) and all(
                    len(i) == 0 or (i[0] == a and i[-1] == a + n - 1)
                    for i, a, n in zip(shard.index, piece["offsets"], piece["sizes"])):
                return reader.read(shard.key, meta["dtype"], piece)
    out = assemble(shard, np_dtype(meta["dtype"]), meta["pieces"],
                   lambda piece: reader.read(shard.key, meta["dtype"], piece))
    if out is None:
        raise CheckpointError(
            f"dist.checkpoint.load: tensor {shard.key!r}: some of the elements this rank needs "
            "are in no piece")
    return out


def load(state: dict, checkpoint_id, *, rng: bool = True) -> dict:
    """Load the checkpoint in the directory ``checkpoint_id`` into ``state`` in place (modules,
    optimizers and stateful objects through their own state; plain values replaced in
    ``state``), resharding to this job's layout. Collective; returns ``state``. When the layout
    differs from the saved one, rank 0 says so once.

    Example::

        dist.checkpoint.load(state, dist.checkpoint.latest("ckpt"))
    """
    if checkpoint_id is None:
        raise CheckpointError("dist.checkpoint.load: no checkpoint given (latest() found none?)")
    directory = os.fspath(checkpoint_id)
    rank, _ = world()
    error, pending, items, index = None, [], None, None
    try:
        index = read_index(directory)
        validate_index(index, directory)
        items = collect(state, loading=True, index=index, rng=rng,
                        saved_world_size=index.get("world_size", 1))
        reader = PieceReader(directory)
        for shard in items.shards:
            meta = index["tensors"].get(shard.key)
            if meta is None:
                raise CheckpointError(
                    f"dist.checkpoint.load: tensor {shard.key!r} is not in {directory!r}")
            pending.append((shard, _read_shard(shard, meta, reader)))
    except CheckpointError as exc:
        error = str(exc)
    except Exception as exc:  # reported on every rank below, instead of one rank leaving
        error = f"dist.checkpoint.load: {type(exc).__name__}: {str(exc).strip(chr(39))}"
    errors = gather(error)
    if any(errors):
        messages = []
        for r, e in enumerate(errors):
            if e and e not in messages:
                messages.append(e if world()[1] == 1 else f"rank {r}: {e}")
        raise CheckpointError("\n".join(messages))
    for shard, value in pending:
        shard.write(value)
    for finish in items.finishers:
        finish(index["objects"], items.loaded)
    here = describe_layout()
    if rank == 0 and index.get("layout") != here:
        get_logger().warning(f"dist.checkpoint.load: {directory} was saved with "
                             f"{index.get('layout')}; resharding to {here}")
    return state


def latest(root) -> str | None:
    """The newest committed checkpoint under ``root``: the one its ``latest`` file names, or
    else the subdirectory whose index is newest; None when there is none.

    Example::

        path = dist.checkpoint.latest("ckpt")       # 'ckpt/step-1000'
    """
    root = os.fspath(root)
    try:
        with open(os.path.join(root, LATEST)) as f:
            name = f.read().strip()
        if name and os.path.exists(os.path.join(root, name, INDEX)):
            return os.path.join(root, name)
    except OSError:
        pass
    try:
        names = os.listdir(root)
    except OSError:
        return None
    found = [(os.path.getmtime(os.path.join(root, n, INDEX)), n) for n in names
             if os.path.exists(os.path.join(root, n, INDEX))]
    return os.path.join(root, max(found)[1]) if found else None
