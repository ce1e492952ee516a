"""Pipeline parallelism: a model as a sequence of layers, cut into stages, driven by schedules.

* :mod:`.module` — :class:`PipelineModule`, :class:`LayerSpec`, :class:`TiedLayerSpec`: the
  model, its partition into stages, tied layers and checkpoints keyed by global layer index.
* :mod:`.partition` — the partition arithmetic (uniform, balanced).
* :mod:`.actions`, :mod:`.schedule` — schedules as data (GPipe, 1F1B, interleaved 1F1B,
  zero-bubble H1, inference, custom), validated and rendered as a stage x step grid.
* :mod:`.simulator`, :mod:`.timeline` — simulate a schedule, measure its bubble, draw a Gantt
  chart.
* :mod:`.loader` — :class:`RepeatingLoader`.

Example::

    from minigrad.distributed.pipeline import OneFOneB, plot_timeline

    sched = OneFOneB(stages=4, micro_batches=8)
    print(sched.render())
    plot_timeline(sched.simulate(tF=1, tB=2), "1f1b.png")
"""

from minigrad.distributed.pipeline.actions import (
    Action,
    Backward,
    BackwardInput,
    BackwardWeight,
    Communication,
    Forward,
    MicroBatchAction,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ReduceGrads,
    ReduceTiedGrads,
    ScheduleError,
    SendActivation,
    SendGrad,
    parse_action,
    parse_actions,
)
from minigrad.distributed.pipeline.loader import RepeatingLoader
from minigrad.distributed.pipeline.module import (
    LayerSpec,
    PipelineModule,
    TiedLayerSpec,
    layer_state_path,
    load_layer_states,
    save_layer_states,
)
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
    peak_activations,
)
from minigrad.distributed.pipeline.simulator import simulate
from minigrad.distributed.pipeline.timeline import (
    Timeline,
    TimelineEvent,
    bubble_fraction,
    plot_timeline,
)

__all__ = [
    "SCHEDULES",
    "Action",
    "Backward",
    "BackwardInput",
    "BackwardWeight",
    "Communication",
    "CustomSchedule",
    "Forward",
    "GPipe",
    "InferenceSchedule",
    "Interleaved1F1B",
    "LayerSpec",
    "MicroBatchAction",
    "OneFOneB",
    "OptimizerStep",
    "PipelineModule",
    "RecvActivation",
    "RecvGrad",
    "ReduceGrads",
    "ReduceTiedGrads",
    "RepeatingLoader",
    "Schedule",
    "ScheduleError",
    "SendActivation",
    "SendGrad",
    "TiedLayerSpec",
    "Timeline",
    "TimelineEvent",
    "ZeroBubbleH1",
    "bubble_fraction",
    "get_schedule",
    "layer_state_path",
    "load_layer_states",
    "parse_action",
    "parse_actions",
    "peak_activations",
    "plot_timeline",
    "save_layer_states",
    "simulate",
]
