"""``deepspeed.pipe``: the names a DeepSpeed pipeline program imports, minigrad's own classes.

``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec`` come from :mod:`minigrad.distributed.pipeline`
and the topologies from :mod:`minigrad.distributed.mesh.topology`; ``deepspeed.initialize`` turns
a ``PipelineModule`` into a :class:`~minigrad.distributed.deepspeed.pipe_engine.
DeepSpeedPipelineEngine`.

Example::

    from minigrad.distributed.deepspeed.pipe import PipelineModule, LayerSpec
    net = PipelineModule(layers=[LayerSpec(M.Linear, 4, 4)], num_stages=2, loss_fn=loss_fn)
"""

from minigrad.distributed.mesh.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)
from minigrad.distributed.pipeline.module import PipelineModule
from minigrad.distributed.pipeline.specs import LayerSpec, TiedLayerSpec

__all__ = [
    "LayerSpec",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipelineModule",
    "ProcessTopology",
    "TiedLayerSpec",
]
