"""Tensor parallelism (Colossal-AI's 1D, 2D, 2.5D and 3D modes), set up by ``dist.init_parallel``.

Example::

    ctx = dist.init_parallel(dict(tensor=dict(size=4, mode="2d")))
    from minigrad.distributed import tensor_parallel as tp
    block = M.Sequential(tp.LayerNorm(256), tp.Linear(256, 1024), M.GELU(), tp.Linear(1024, 256))
    x = tp.split_input(batch)                       # this rank's block of the activations
    with gm:
        loss = tp.cross_entropy(tp.Classifier(256, vocab)(block(x)), tp.split_input(labels))
        gm.backward(loss)

Modules: :mod:`.regions` (every collective, as autodiff Functions), :mod:`.collective_log`,
:mod:`.layouts` (which block of an activation each rank holds; ``split_input``/``gather_output``),
:mod:`.sharding` (parameters as blocks of full tensors; logical state dicts), one file per mode
(:mod:`.parallel_1d`, :mod:`.parallel_2d`, :mod:`.parallel_2p5d`, :mod:`.parallel_3d`, with
:mod:`.blocked` shared by the last three), :mod:`.loss`, :mod:`.dropout`, :mod:`.layers` (the
mode-dispatching ``tp.Linear`` ...) and :mod:`.transformer`.
"""

from minigrad.distributed.tensor_parallel.blocked import BlockedEmbedding, BlockedLayerNorm
from minigrad.distributed.tensor_parallel.collective_log import (
    CollectiveLog,
    CollectiveRecord,
    log_collectives,
)
from minigrad.distributed.tensor_parallel.dropout import Dropout
from minigrad.distributed.tensor_parallel.layers import (
    Classifier,
    Embedding,
    LayerNorm,
    Linear,
    tensor_parallel_context,
)
from minigrad.distributed.tensor_parallel.layouts import (
    CUBE_3D_A,
    CUBE_3D_B,
    GRID_2D,
    GRID_2P5D,
    REPLICATED,
    SPLIT_1D,
    Layout,
    current_layout,
    gather_output,
    input_layout,
    reset_layout,
    split_input,
)
from minigrad.distributed.tensor_parallel.loss import cross_entropy, vocab_parallel_cross_entropy
from minigrad.distributed.tensor_parallel.parallel_1d import (
    Classifier1D,
    Embedding1D,
    LayerNorm1D,
    Linear1D_Col,
    Linear1D_Row,
    Linear1DCol,
    Linear1DRow,
    VanillaClassifier,
    VocabParallelClassifier1D,
    VocabParallelEmbedding1D,
)
from minigrad.distributed.tensor_parallel.parallel_2d import (
    Classifier2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    SummaLinear,
)
from minigrad.distributed.tensor_parallel.parallel_2p5d import (
    Classifier2p5D,
    Embedding2p5D,
    LayerNorm2p5D,
    Linear2p5D,
)
from minigrad.distributed.tensor_parallel.parallel_3d import (
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
)
from minigrad.distributed.tensor_parallel.regions import (
    all_gather_region,
    all_reduce_region,
    broadcast_step,
    copy_to_region,
    gather_from_region,
    max_from_region,
    reduce_from_region,
    reduce_scatter_region,
    reduce_step,
    split_to_region,
)
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec, full_grads
from minigrad.distributed.tensor_parallel.transformer import (
    MLP,
    SelfAttention,
    TensorParallelLayers,
    TransformerBlock,
    TransformerLM,
)

__all__ = [
    "CUBE_3D_A",
    "CUBE_3D_B",
    "GRID_2D",
    "GRID_2P5D",
    "MLP",
    "REPLICATED",
    "SPLIT_1D",
    "BlockedEmbedding",
    "BlockedLayerNorm",
    "Classifier",
    "Classifier1D",
    "Classifier2D",
    "Classifier2p5D",
    "Classifier3D",
    "CollectiveLog",
    "CollectiveRecord",
    "Dropout",
    "Embedding",
    "Embedding1D",
    "Embedding2D",
    "Embedding2p5D",
    "Embedding3D",
    "LayerNorm",
    "LayerNorm1D",
    "LayerNorm2D",
    "LayerNorm2p5D",
    "LayerNorm3D",
    "Layout",
    "Linear",
    "Linear1DCol",
    "Linear1DRow",
    "Linear1D_Col",
    "Linear1D_Row",
    "Linear2D",
    "Linear2p5D",
    "Linear3D",
    "ParallelModule",
    "SelfAttention",
    "ShardSpec",
    "SummaLinear",
    "TensorParallelLayers",
    "TransformerBlock",
    "TransformerLM",
    "VanillaClassifier",
    "VocabParallelClassifier1D",
    "VocabParallelEmbedding1D",
    "all_gather_region",
    "all_reduce_region",
    "broadcast_step",
    "copy_to_region",
    "cross_entropy",
    "current_layout",
    "full_grads",
    "gather_from_region",
    "gather_output",
    "input_layout",
    "log_collectives",
    "max_from_region",
    "reduce_from_region",
    "reduce_scatter_region",
    "reduce_step",
    "reset_layout",
    "split_input",
    "split_to_region",
    "tensor_parallel_context",
    "vocab_parallel_cross_entropy",
]
