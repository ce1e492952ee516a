"""``dist.checkpoint.save`` and ``async_save``: every rank writes the pieces it owns, rank 0
commits the index.

A save runs in three steps:

1. **plan** (collective, on the caller's thread): every rank sends the boxes it holds of each
   logical tensor, and its plain values, to every rank (``all_gather_object``: no data). Each rank
   then computes the same plan: the lowest rank holding a box writes it (replicas write once),
   and every tensor must be covered exactly once; a missing or overlapping piece raises on every
   rank before anything is written;
2. **write**: each rank writes its pieces to its own safetensors file;
3. **commit**: rank 0 writes ``index.json`` (atomic rename) once every rank's file is there, then
   the parent's ``latest``.

``save`` waits for the commit and reports a failure on every rank. ``async_save`` copies this
rank's pieces (so training may go on changing the tensors), returns a
:class:`concurrent.futures.Future` at once and writes in a background thread; the ranks then
meet through small manifest files in the directory instead of collectives (which must stay on
the training thread), and the future's ``result()`` is the checkpoint path once committed.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import Future

from minigrad.distributed.checkpoint.pieces import Box, boxes, check_coverage
from minigrad.distributed.checkpoint.state import collect, dtype_name
from minigrad.distributed.checkpoint.storage import (
    FORMAT,
    INDEX,
    VERSION,
    write_index,
    write_latest,
    write_pieces,
)
from minigrad.distributed.comm.collectives import all_gather_object
from minigrad.distributed.comm.group import get_rank, get_world_size, is_initialized
from minigrad.distributed.mesh.parallel_context import get_parallel_context
from minigrad.serialization import CheckpointError, atomic_write

__all__ = ["async_save", "describe_layout", "gather", "save"]

#: Seconds an asynchronous save waits for the other ranks' files before giving up.
ASYNC_TIMEOUT = 600.0
_POLL = 0.01


def world() -> tuple[int, int]:
    """``(rank, world size)``; one rank without a process group."""
    return (get_rank(), get_world_size()) if is_initialized() else (0, 1)


def gather(obj) -> list:
    """Every rank's ``obj`` on every rank (plain values only)."""
    if world()[1] == 1:
        return [obj]
    out = [None] * world()[1]
    all_gather_object(out, obj)
    return out


def describe_layout() -> str:
    """This job's layout: world size and parallel topology (for the index and load messages)."""
    ctx = get_parallel_context(required=False)
    text = f"world size {world()[1]}"
    if ctx is not None:
        text += f", {ctx.topology!r}" + (f", tensor mode {ctx.mode}" if ctx.mode else "")
    return text


class _Plan:
    """The agreed plan of one save (identical on every rank)."""

    def __init__(self, gathered: list, rank: int):
        self.save_id = gathered[0]["save_id"]
        self.world_size = len(gathered)
        self.layout = gathered[0]["layout"]
        self.tensors: dict[str, dict] = {}
        owners: dict[str, dict] = {}
        for r, proposal in enumerate(gathered):
            for key, shape, dtype, offsets, sizes in proposal["pieces"]:
                meta = self.tensors.setdefault(key, {"shape": list(shape), "dtype": dtype,
                                                     "rank": r})
                if list(shape) != meta["shape"] or dtype != meta["dtype"]:
                    raise CheckpointError(
                        f"dist.checkpoint.save: tensor {key!r} is {tuple(meta['shape'])} "
                        f"{meta['dtype']} on rank {meta['rank']} but {tuple(shape)} {dtype} on "
                        f"rank {r}")
                owners.setdefault(key, {}).setdefault((tuple(offsets), tuple(sizes)), r)
        for key, boxes_of in owners.items():
            why = check_coverage(key, tuple(self.tensors[key]["shape"]),
                                 [(Box(o, s), f"rank {r}") for (o, s), r in boxes_of.items()])
            if why is not None:
                raise CheckpointError(f"dist.checkpoint.save: incomplete checkpoint: {why}")
        self.mine = {(key, box) for key, b in owners.items() for box, r in b.items() if r == rank}
        self.objects: dict = {}
        for proposal in gathered:
            for key, value in proposal["objects"].items():
                self.objects.setdefault(key, value)

    def index(self, records: list) -> dict:
        """The index, from every rank's file record."""
        tensors = {key: {"shape": m["shape"], "dtype": m["dtype"], "pieces": []}
                   for key, m in self.tensors.items()}
        files = {}
        for record in records:
            if record is None:
                continue
            files[record["file"]] = {"bytes": record["bytes"]}
            for p in record["pieces"]:
                tensors[p["key"]]["pieces"].append(
                    {k: p[k] for k in ("name", "offsets", "sizes", "crc32")} | {
                        "file": record["file"]})
        return {"format": FORMAT, "version": VERSION, "save_id": self.save_id,
                "world_size": self.world_size, "layout": self.layout, "files": files,
                "tensors": tensors, "objects": self.objects}


def _prepare(state: dict, directory: str, rng: bool, copy: bool):
    """Steps 1 (plan) and the choice of this rank's pieces: ``(plan, pieces to write)``."""
    rank, _ = world()
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    if rank == 0:  # saving over a checkpoint: it stops being one until the new index
        for name in os.listdir(directory):
            if name == INDEX or name.endswith(".manifest.json"):
                os.unlink(os.path.join(directory, name))
    proposals, local, objects, error = [], {}, {}, None
    try:
        items = collect(state, rng=rng)
        objects = items.objects
        for shard in items.shards:
            dtype = dtype_name(shard.dtype)
            for box, where in boxes(shard):
                proposals.append([shard.key, list(shard.shape), dtype, list(box.offsets),
                                  list(box.sizes)])
                local[(shard.key, (box.offsets, box.sizes))] = (shard, box, where, dtype)
    except (TypeError, ValueError, KeyError) as exc:  # told to every rank: none waits alone
        error = f"rank {rank}: {exc}"
    gathered = gather({"save_id": uuid.uuid4().hex, "layout": describe_layout(),
                       "pieces": proposals, "objects": objects, "error": error})
    errors = [g["error"] for g in gathered if g["error"]]
    if errors:
        raise CheckpointError("dist.checkpoint.save: " + "; ".join(errors))
    plan = _Plan(gathered, rank)
    pieces, arrays = [], {}
    for (key, box_key), (shard, box, where, dtype) in local.items():
        if (key, box_key) not in plan.mine:
            continue
        if id(shard) not in arrays:
            arrays[id(shard)] = shard.read()
        arr = where(arrays[id(shard)])
        pieces.append((key, box, arr.copy() if copy else arr, dtype))
    return directory, plan, pieces


def save(state: dict, checkpoint_id, *, rng: bool = True) -> str:
    """Save ``state`` (see :mod:`.state`) to the directory ``checkpoint_id``: each rank writes
    the pieces it owns, in parallel, and rank 0 commits the index and ``latest``. Collective;
    returns the directory. ``rng=False`` leaves the random generators out.

    Example::

        dist.checkpoint.save({"model": net, "optim": opt, "step": step}, f"ckpt/step-{step}")
    """
    rank, _ = world()
    directory, plan, pieces = _prepare(state, checkpoint_id, rng, copy=False)
    try:
        record, error = write_pieces(directory, rank, pieces), None
    except OSError as exc:
        record, error = None, f"rank {rank}: writing its pieces failed: {exc}"
    results = gather({"record": record, "error": error})
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        raise CheckpointError("dist.checkpoint.save: " + "; ".join(errors))
    error = None
    if rank == 0:
        try:
            write_index(directory, plan.index([r["record"] for r in results]))
            write_latest(directory)
        except OSError as exc:
            error = f"rank 0: writing the index failed: {exc}"
    errors = [e for e in gather(error) if e]
    if errors:
        raise CheckpointError("dist.checkpoint.save: " + "; ".join(errors))
    return directory


def _manifest(directory: str, rank: int) -> str:
    return os.path.join(directory, f".rank{rank:05d}.manifest.json")


def _wait(what: str, ready, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise CheckpointError(f"dist.checkpoint.async_save: timed out after {timeout:g} s "
                                  f"waiting for {what}")
        time.sleep(_POLL)


def _read_json(path: str):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _write_async(directory: str, plan: _Plan, pieces: list, rank: int, timeout: float) -> str:
    """The background half of :func:`async_save` (see the module docstring)."""
    try:
        record, error = write_pieces(directory, rank, pieces), None
    except OSError as exc:
        record, error = None, f"rank {rank}: writing its pieces failed: {exc}"
    atomic_write(_manifest(directory, rank), json.dumps(
        {"save_id": plan.save_id, "record": record, "error": error}).encode())
    if error:
        raise CheckpointError("dist.checkpoint.async_save: " + error)
    if rank == 0:
        def manifests():
            found = [_read_json(_manifest(directory, r)) for r in range(plan.world_size)]
            ok = all(m is not None and m.get("save_id") == plan.save_id for m in found)
            return found if ok else None
        found = _wait("every rank's files", manifests, timeout)
        errors = [m["error"] for m in found if m["error"]]
        if errors:
            raise CheckpointError("dist.checkpoint.async_save: " + "; ".join(errors))
        write_index(directory, plan.index([m["record"] for m in found]))
        write_latest(directory)
        for r in range(plan.world_size):
            try:
                os.unlink(_manifest(directory, r))
            except OSError:
                pass
        return directory

    def committed():
        index = _read_json(os.path.join(directory, INDEX))
        if index is not None and index.get("save_id") == plan.save_id:
            return True
        manifest = _read_json(_manifest(directory, 0))
        if manifest is not None and manifest.get("save_id") == plan.save_id and \
                manifest.get("error"):
            raise CheckpointError("dist.checkpoint.async_save: " + manifest["error"])
        return None

    _wait("rank 0's commit", committed, timeout)
    return directory


def async_save(state: dict, checkpoint_id, *, rng: bool = True,
               timeout: float = ASYNC_TIMEOUT) -> Future:
    """Like :func:`save`, but return once this rank's pieces are copied: the files are written
    and committed in a background thread while training goes on. The returned future's
    ``result()`` is the directory once the index is committed (or raises why not). Collective
    (the plan); call ``result()`` before the next save to the same directory.

    Example::

        future = dist.checkpoint.async_save(state, f"ckpt/step-{step}")
        ...                                 # more training steps
        future.result()                     # committed
    """
    rank, _ = world()
    directory, plan, pieces = _prepare(state, checkpoint_id, rng, copy=True)
    future: Future = Future()

    def run():
        try:
            future.set_result(_write_async(directory, plan, pieces, rank, timeout))
        except BaseException as exc:  # the future reports it to the caller
            future.set_exception(exc)

    threading.Thread(target=run, name="dist.checkpoint.async_save", daemon=True).start()
    return future
