"""DeepSpeed's ``engine.save_checkpoint(dir, tag=None, client_state={})`` and
``engine.load_checkpoint(dir, tag=None)`` for the pipeline engine, on the logical format.

The engine reaches these through :data:`minigrad.seams.CHECKPOINT` (the pipeline folder sits
below this one). A checkpoint is ``dir/tag`` (default ``global_step<N>``) with ``dir/latest``
naming the newest tag, like DeepSpeed's; its content is an ordinary ``dist.checkpoint``, so it
loads into any other layout too (``{"module": net, "optimizer": opt}`` in a data-parallel job).
"""

from __future__ import annotations

import os

from minigrad.distributed.checkpoint.loading import load
from minigrad.distributed.checkpoint.saving import save
from minigrad.distributed.checkpoint.storage import INDEX, LATEST, read_index
from minigrad.distributed.runtime.log import get_logger

__all__ = ["EngineCheckpoints"]

#: the key of the learning-rate scheduler's state in an engine checkpoint (DeepSpeed's name)
SCHEDULER_KEY = "lr_scheduler"


class _Held:
    """A stateful wrapper of one plain value (the client state, the step counter)."""

    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _state(engine, client_state, scheduler: bool = True) -> tuple[dict, _Held, _Held]:
    steps, client = _Held(engine.global_steps), _Held(client_state)
    state = {"module": engine.module, "optimizer": engine.optimizer, "global_steps": steps,
             "client_state": client}
    if engine.optimizer is None:
        del state["optimizer"]
    if scheduler and getattr(engine, "lr_scheduler", None) is not None:  # DeepSpeed's engines
        state[SCHEDULER_KEY] = engine.lr_scheduler
    if engine.scaler is not None:  # the loss scale and its growth counter travel with the run
        state["scaler"] = engine.scaler
    return state, steps, client


class EngineCheckpoints:
    """What the pipeline engine calls (installed in ``seams.CHECKPOINT``)."""

    def save_checkpoint(self, engine, save_dir, tag, client_state: dict) -> str:
        """See ``PipelineEngine.save_checkpoint``."""
        tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
        state, _, _ = _state(engine, dict(client_state))
        return save(state, os.path.join(os.fspath(save_dir), tag))

    def load_checkpoint(self, engine, load_dir, tag, load_lr_scheduler: bool = True) -> tuple:
        """See ``PipelineEngine.load_checkpoint``; the engine's ``lr_scheduler`` (if any) is
        loaded too when ``load_lr_scheduler`` and the checkpoint has one (a checkpoint saved
        without a scheduler leaves it as it is, with a warning)."""
        load_dir = os.fspath(load_dir)
        if tag is None:
            try:
                with open(os.path.join(load_dir, LATEST)) as f:
                    tag = f.read().strip()
            except OSError:
                return None, None
        path = os.path.join(load_dir, tag)
        if not os.path.exists(os.path.join(path, INDEX)):
            return None, None
        has_scheduler = SCHEDULER_KEY in read_index(path).get("objects", {})
        wanted = load_lr_scheduler and getattr(engine, "lr_scheduler", None) is not None
        if wanted and not has_scheduler:
            get_logger().warning(f"load_checkpoint: {path} has no lr_scheduler state; the "
                                 f"scheduler keeps its position")
        state, steps, client = _state(engine, {}, scheduler=wanted and has_scheduler)
        load(state, path)
        engine.global_steps = int(steps.value)
        return path, client.value
