"""``tp.Linear``, ``tp.LayerNorm``, ``tp.Embedding``, ``tp.Classifier``: the layer of the configured
mode, so one model definition runs single-device and in every tensor-parallel mode.

Each returns the mode's class (below) built from the current seed, or the single-device layer when
there is no tensor parallelism (no parallel context, mode None, or mode "sequence", whose token-wise
layers are replicated). The returned layers have the single-device state-dict keys.

=====  ========================  =============  ========================  =========================
mode   Linear                    LayerNorm      Embedding                 Classifier
=====  ========================  =============  ========================  =========================
1d     Linear1DCol/Linear1DRow   LayerNorm1D    VocabParallelEmbedding1D  VocabParallelClassifier1D
2d     Linear2D                  LayerNorm2D    Embedding2D               Classifier2D
2.5d   Linear2p5D                LayerNorm2p5D  Embedding2p5D             Classifier2p5D
3d     Linear3D                  LayerNorm3D    Embedding3D               Classifier3D
=====  ========================  =============  ========================  =========================

In 1D consecutive ``tp.Linear`` layers alternate column- and row-parallel (as in Colossal-AI), so
a pair keeps its intermediate activation split and needs no gather.
"""

from __future__ import annotations

import minigrad.module as M
from minigrad.distributed.mesh.parallel_context import ParallelContext, get_parallel_context
from minigrad.distributed.tensor_parallel import (
    parallel_1d,
    parallel_2d,
    parallel_2p5d,
    parallel_3d,
)
from minigrad.distributed.tensor_parallel.layouts import REPLICATED, current_layout

__all__ = ["Classifier", "Embedding", "LayerNorm", "Linear", "tensor_parallel_context"]

_LINEAR = {"2d": parallel_2d.Linear2D, "2.5d": parallel_2p5d.Linear2p5D,
           "3d": parallel_3d.Linear3D}
_LAYER_NORM = {"1d": parallel_1d.LayerNorm1D, "2d": parallel_2d.LayerNorm2D,
               "2.5d": parallel_2p5d.LayerNorm2p5D, "3d": parallel_3d.LayerNorm3D}
_EMBEDDING = {"1d": parallel_1d.VocabParallelEmbedding1D, "2d": parallel_2d.Embedding2D,
              "2.5d": parallel_2p5d.Embedding2p5D, "3d": parallel_3d.Embedding3D}
_CLASSIFIER = {"1d": parallel_1d.VocabParallelClassifier1D, "2d": parallel_2d.Classifier2D,
               "2.5d": parallel_2p5d.Classifier2p5D, "3d": parallel_3d.Classifier3D}


def tensor_parallel_context() -> ParallelContext | None:
    """The parallel context if its mode splits layers (1d, 2d, 2.5d, 3d), else None."""
    ctx = get_parallel_context(required=False)
    return ctx if ctx is not None and ctx.mode in _LAYER_NORM else None


def _whole_input_1d(ctx: ParallelContext, what: str) -> None:
    if current_layout(ctx) is not REPLICATED:
        raise ValueError(
            f"tp.{what} in 1D needs a whole (replicated) input, but the last tp.Linear built is "
            "column-parallel and leaves its output split; add the row-parallel tp.Linear first"
        )


def Linear(in_features: int, out_features: int, bias: bool = True,
           out_chunks: int = 1) -> M.Module:
    """A Linear of the configured mode (``out_chunks``: see :class:`Linear1DCol`).

    Example::

        mlp = M.Sequential(tp.Linear(256, 1024), M.GELU(), tp.Linear(1024, 256))
    """
    ctx = tensor_parallel_context()
    if ctx is None:
        return M.Linear(in_features, out_features, bias)
    if ctx.mode != "1d":
        return _LINEAR[ctx.mode](in_features, out_features, bias, out_chunks=out_chunks, ctx=ctx)
    if current_layout(ctx) is REPLICATED:
        return parallel_1d.Linear1DCol(in_features, out_features, bias, out_chunks=out_chunks,
                                       ctx=ctx)
    if out_chunks != 1:
        raise ValueError("tp.Linear: out_chunks needs a column-parallel layer in 1D (whole input)")
    return parallel_1d.Linear1DRow(in_features, out_features, bias, ctx=ctx)


def LayerNorm(normalized_shape: int, eps: float = 1e-5, affine: bool = True) -> M.Module:
    """A LayerNorm of the configured mode."""
    ctx = tensor_parallel_context()
    if ctx is None:
        return M.LayerNorm(normalized_shape, eps, affine)
    if ctx.mode == "1d":
        _whole_input_1d(ctx, "LayerNorm")
        return parallel_1d.LayerNorm1D(normalized_shape, eps, affine)
    return _LAYER_NORM[ctx.mode](normalized_shape, eps, affine, ctx=ctx)


def Embedding(num_embeddings: int, embedding_dim: int,
              padding_idx: int | None = None) -> M.Module:
    """An Embedding of the configured mode (1D: split by vocabulary, output whole)."""
    ctx = tensor_parallel_context()
    if ctx is None:
        return M.Embedding(num_embeddings, embedding_dim, padding_idx)
    return _EMBEDDING[ctx.mode](num_embeddings, embedding_dim, padding_idx, ctx=ctx)


def Classifier(in_features: int, num_classes: int, bias: bool = True) -> M.Module:
    """The output layer of the configured mode, logits split by class; use ``tp.cross_entropy``.

    Example::

        head = tp.Classifier(256, vocab)
    """
    ctx = tensor_parallel_context()
    if ctx is None:
        return M.Linear(in_features, num_classes, bias)
    if ctx.mode == "1d":
        _whole_input_1d(ctx, "Classifier")
    return _CLASSIFIER[ctx.mode](in_features, num_classes, bias=bias, ctx=ctx)
