"""Distributed checkpoints: one logical, sharded format every strategy saves to and loads from
(PyTorch DCP's API), resharding to whatever layout the loading job has.

* :mod:`.pieces`: logical tensors and the boxes (pieces) ranks hold of them;
* :mod:`.values`: plain values in the JSON index, exactly, never pickled;
* :mod:`.state`: what a run's state is made of (modules, optimizers, stateful objects, random
  generators) as shards and values;
* :mod:`.storage`: the directory: one safetensors file per writing rank, ``index.json`` (the
  commit), ``latest``;
* :mod:`.saving`: ``save`` and ``async_save``; :mod:`.loading`: ``load`` and ``latest``;
* :mod:`.engine`: DeepSpeed's ``engine.save_checkpoint``/``load_checkpoint`` on the pipeline
  engine (through :data:`minigrad.seams.CHECKPOINT`);
* :mod:`.consolidate`: one full-weights file (``python -m minigrad.distributed.checkpoint
  consolidate DIR OUT``).

This folder sits above every strategy (it imports pipeline, tensor_parallel and global_tensor to
know their layouts); no strategy imports it.

Example::

    import minigrad.distributed as dist

    state = {"model": net, "optim": opt, "sched": sched, "data": loader, "step": step}
    dist.checkpoint.save(state, f"ckpt/step-{step}")
    dist.checkpoint.load(state, dist.checkpoint.latest("ckpt"))
"""

from minigrad import seams
from minigrad.distributed.checkpoint.consolidate import consolidate, full_tensors
from minigrad.distributed.checkpoint.engine import EngineCheckpoints
from minigrad.distributed.checkpoint.loading import latest, load
from minigrad.distributed.checkpoint.saving import async_save, save
from minigrad.distributed.checkpoint.storage import read_index
from minigrad.serialization import CheckpointError

seams.CHECKPOINT.install(EngineCheckpoints())

__all__ = [
    "CheckpointError",
    "async_save",
    "consolidate",
    "full_tensors",
    "latest",
    "load",
    "read_index",
    "save",
]
