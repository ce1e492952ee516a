"""Pipeline parallelism: a model as a sequence of layers, cut into stages, driven by schedules.

* :mod:`.engine` — :class:`PipelineEngine`: runs a schedule on every stage (``train_batch``,
  ``eval_batch``), with tied and data-parallel gradient reduction and a measured timeline.
* :mod:`.transport` — :class:`~.transport.Transport`: the engine's messages between stages.
* :mod:`.accumulation` — the ``1 / M`` loss seed of each micro-batch's backward (shared with the
  global-tensor ``Graph``).
* :mod:`.module` — :class:`PipelineModule`: the model's part on this stage, tied layers.
* :mod:`.specs` — :class:`LayerSpec`, :class:`TiedLayerSpec`: layers described by class and
  arguments, with parameter counts known before building.
* :mod:`.partition` — the partition of the layers into stages (uniform, balanced, by type).
* :mod:`.checkpoint` — checkpoints keyed by global layer index, one file per layer.
* :mod:`.errors` — :class:`PipelineError`.
* :mod:`.grid` — :class:`PipelineParallelGrid`, DeepSpeed's ``mpu`` of a pipe x data topology.
* :mod:`.actions`, :mod:`.schedule` — schedules as data (GPipe, 1F1B, interleaved 1F1B,
  zero-bubble H1, inference, custom), validated and rendered as a stage x step grid. The
  action classes (``Forward``, ``BackwardInput``, ``SendActivation``...) live in
  :mod:`.actions`.
* :mod:`.simulator`, :mod:`.timeline` — simulate a schedule, measure its bubble, draw a Gantt
  chart.
* :mod:`.loader` — :class:`RepeatingLoader`.

Example::

    from minigrad.distributed.pipeline import OneFOneB, plot_timeline

    sched = OneFOneB(stages=4, micro_batches=8)
    print(sched.render())
    plot_timeline(sched.simulate(tF=1, tB=2), "1f1b.png")

    net = PipelineModule(specs, num_stages=4, loss_fn=F.nn.cross_entropy)   # in each rank
    engine = PipelineEngine(net, optim.Adam(net.parameters()), micro_batches=8)
    loss = engine.train_batch(iter(RepeatingLoader(loader)))
    plot_timeline(engine.timeline(), "measured.png")                        # every rank calls
"""

from minigrad.distributed.pipeline.actions import ScheduleError, parse_actions
from minigrad.distributed.pipeline.checkpoint import load_layer_states, save_layer_states
from minigrad.distributed.pipeline.engine import PipelineEngine
from minigrad.distributed.pipeline.errors import PipelineError
from minigrad.distributed.pipeline.grid import PipelineParallelGrid
from minigrad.distributed.pipeline.loader import RepeatingLoader
from minigrad.distributed.pipeline.module import PipelineModule
from minigrad.distributed.pipeline.partition import partition_balanced, partition_uniform
from minigrad.distributed.pipeline.schedule import (
    SCHEDULES,
    CustomSchedule,
    GPipe,
    InferenceSchedule,
    Interleaved1F1B,
    OneFOneB,
    Schedule,
    ZeroBubbleH1,
    get_schedule,
)
from minigrad.distributed.pipeline.simulator import simulate
from minigrad.distributed.pipeline.specs import LayerSpec, TiedLayerSpec
from minigrad.distributed.pipeline.timeline import (
    Timeline,
    TimelineEvent,
    bubble_fraction,
    plot_timeline,
)

__all__ = [
    "SCHEDULES",
    "CustomSchedule",
    "GPipe",
    "InferenceSchedule",
    "Interleaved1F1B",
    "LayerSpec",
    "OneFOneB",
    "PipelineEngine",
    "PipelineError",
    "PipelineModule",
    "PipelineParallelGrid",
    "RepeatingLoader",
    "Schedule",
    "ScheduleError",
    "TiedLayerSpec",
    "Timeline",
    "TimelineEvent",
    "ZeroBubbleH1",
    "bubble_fraction",
    "get_schedule",
    "load_layer_states",
    "parse_actions",
    "partition_balanced",
    "partition_uniform",
    "plot_timeline",
    "save_layer_states",
    "simulate",
]
