"""DeepSpeed's entry point on minigrad: ``import minigrad.distributed.deepspeed as deepspeed``.

A DeepSpeed training program runs with only that import changed (and ``deepspeed.pipe`` /
``deepspeed.utils`` the same way): ``deepspeed.add_config_arguments(parser)``,
``deepspeed.init_distributed()``, ``deepspeed.initialize(args=..., model=..., ...)`` returning
``(engine, optimizer, training_dataloader, lr_scheduler)``, then either DeepSpeed's
``engine(x)`` / ``engine.backward(loss)`` / ``engine.step()`` loop or, for a ``PipelineModule``,
``engine.train_batch()``. Everything runs on minigrad's own parts; this package only reads the
config and wires them together:

* :mod:`.config` — the JSON/dict config, DeepSpeed's defaults and consistency rules;
* :mod:`.components` — the optimizer, scheduler, loss scaler, autocast and loader a config
  builds;
* :mod:`.engine` — :class:`DeepSpeedEngine` (data parallelism, ZeRO 0-3, accumulation);
* :mod:`.pipe_engine` — :class:`DeepSpeedPipelineEngine`, the pipeline engine configured;
* :mod:`.entry` — ``add_config_arguments``, ``init_distributed``, ``initialize``;
* :mod:`.pipe`, :mod:`.utils` — DeepSpeed's module paths of the pipeline names and
  ``RepeatingLoader``;
* :mod:`.runtime.lr_schedules` — DeepSpeed's schedulers (``WarmupLR``, ``WarmupDecayLR``,
  ``WarmupCosineLR``, ``OneCycle``, ``LRRangeTest``), at DeepSpeed's module path.

It sits above ``minigrad.amp`` in the layer order (the ``fp16`` section builds a ``GradScaler``)
and above every other folder of ``minigrad.distributed``; nothing imports it. The config keys and
what each maps to are in ``docs/deepspeed.md``.

Example::

    import minigrad.distributed.deepspeed as deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    deepspeed.init_distributed()
    engine, _, loader, _ = deepspeed.initialize(args=args, model=net,
                                                model_parameters=net.parameters(),
                                                training_data=trainset)
    for x, y in loader:
        loss = F.nn.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
"""

import minigrad.distributed as comm
from minigrad.distributed.deepspeed import pipe, runtime, utils
from minigrad.distributed.deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from minigrad.distributed.deepspeed.engine import DeepSpeedEngine
from minigrad.distributed.deepspeed.entry import (
    add_config_arguments,
    init_distributed,
    initialize,
)
from minigrad.distributed.deepspeed.pipe_engine import DeepSpeedPipelineEngine

#: DeepSpeed's name of the pipeline engine class (``isinstance(engine, deepspeed.PipelineEngine)``)
PipelineEngine = DeepSpeedPipelineEngine

__all__ = [
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "DeepSpeedEngine",
    "DeepSpeedPipelineEngine",
    "PipelineEngine",
    "add_config_arguments",
    "comm",
    "init_distributed",
    "initialize",
    "pipe",
    "runtime",
    "utils",
]
