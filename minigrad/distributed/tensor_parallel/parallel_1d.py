"""1D tensor parallelism (Megatron-LM): weights split along one dimension over P ranks.

A column-parallel Linear keeps the rows ``W[cols_j]`` of the weight (``(out, in)`` storage: a
block of output features) and takes the whole input; a row-parallel Linear keeps ``W[:, rows_j]``
(a block of input features) and sums the partial products. A column layer followed by a row layer
(an MLP; attention with its heads split across ranks) keeps the activation between them split, so
the pair costs exactly one all-reduce forward (the row layer's sum) and one backward (the column
layer's input gradient):

=================  =========================  ==============================================
layer              forward                    backward
=================  =========================  ==============================================
Linear1DCol        — (all-gather to gather)   all-reduce of dX (copy_to_region)
Linear1DRow        all-reduce of Y            — (all-gather of dX if the input was whole)
=================  =========================  ==============================================

Vocabulary-parallel embedding and classifier split the vocabulary; the loss
(:func:`..loss.vocab_parallel_cross_entropy`) never builds the full logits on one rank.
"""

from __future__ import annotations

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.layouts import REPLICATED, SPLIT_1D, advance_layout
from minigrad.distributed.tensor_parallel.regions import (
    copy_to_region,
    gather_from_region,
    reduce_from_region,
    split_to_region,
)
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec

__all__ = [
    "LayerNorm1D",
    "Linear1DCol",
    "Linear1DRow",
    "VocabParallelClassifier1D",
    "VocabParallelEmbedding1D",
]


class Linear1DCol(ParallelModule):
    """Column-parallel ``y = x @ weight.T + bias``: this rank keeps ``out_features / P`` output
    features (rows of the ``(out, in)`` weight and the bias). The input is whole; the output is
    split unless ``gather_output``. ``out_chunks`` > 1 splits each of that many chunks of the
    output separately (a fused query/key/value projection keeps whole heads of each).

    Example::

        fc1 = tp.Linear1DCol(256, 1024)   # output (..., 1024 / P), split
    """

    mode = "1d"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, out_chunks: int = 1,
                 ctx: ParallelContext | None = None):
        super().__init__(ctx)
        if gather_output and out_chunks > 1:
            raise ValueError("Linear1DCol: gather_output=True needs out_chunks=1")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.gather_output, self.out_chunks = bool(gather_output), int(out_chunks)
        self.group = self.ctx.group("1d")
        split = (("tensor",),)
        self.adopt(M.Linear(in_features, out_features, bias), {
            "weight": ShardSpec((self.out_features, self.in_features), split + ((),), out_chunks),
            "bias": ShardSpec((self.out_features,), split, out_chunks),
        })
        self.input_layout = REPLICATED
        self.output_layout = REPLICATED if gather_output else SPLIT_1D
        advance_layout(self.ctx, self.output_layout)

    def forward(self, x: Tensor) -> Tensor:
        self.check_features(x, self.in_features)
        y = F.linear(copy_to_region(x, self.group), self.weight, self.bias)
        return gather_from_region(y, self.group, -1) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, gather_output={self.gather_output}, "
                f"P={self.group.size}")


class Linear1DRow(ParallelModule):
    """Row-parallel ``y = x @ weight.T + bias``: this rank keeps ``in_features / P`` input
    features (columns of the weight); the partial products are summed by one all-reduce and the
    whole bias (replicated) is added after it. With ``input_is_parallel`` the input is already
    split (the output of a :class:`Linear1DCol`), otherwise each rank takes its part of it.

    Example::

        fc2 = tp.Linear1DRow(1024, 256)   # input (..., 1024 / P), output whole
    """

    mode = "1d"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, ctx: ParallelContext | None = None):
        super().__init__(ctx)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.input_is_parallel = bool(input_is_parallel)
        self.group = self.ctx.group("1d")
        self.adopt(M.Linear(in_features, out_features, bias), {
            "weight": ShardSpec((self.out_features, self.in_features), ((), ("tensor",))),
        })
        self.input_layout = SPLIT_1D if input_is_parallel else REPLICATED
        self.output_layout = REPLICATED
        advance_layout(self.ctx, self.output_layout)

    def forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel:
            self.check_features(x, self.in_features)
            x = split_to_region(x, self.group, -1)
        self.check_features(x, self.weight.shape[1])
        y = reduce_from_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}, "
                f"P={self.group.size}")


class VocabParallelEmbedding1D(ParallelModule):
    """Embedding whose table is split by vocabulary: rank j keeps rows ``[j·V/P, (j+1)·V/P)``.
    Ids outside this rank's range contribute zeros and one all-reduce sums the parts, so the
    output is whole on every rank.

    Example::

        emb = tp.VocabParallelEmbedding1D(50304, 256)   # ids (N, L) -> (N, L, 256)
    """

    mode = "1d"

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 ctx: ParallelContext | None = None):
        super().__init__(ctx)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.group = self.ctx.group("1d")
        self.adopt(M.Embedding(num_embeddings, embedding_dim, padding_idx), {
            "weight": ShardSpec((self.num_embeddings, self.embedding_dim), (("tensor",), ())),
        }, names=("weight",))
        rows = self.weight.shape[0]
        self.vocab_start = self.group.rank * rows
        self.padding_idx = padding_idx
        inside = padding_idx is not None and 0 <= padding_idx - self.vocab_start < rows
        self.local_padding_idx = padding_idx - self.vocab_start if inside else None
        self.input_layout = self.output_layout = REPLICATED
        advance_layout(self.ctx, self.output_layout)

    def forward(self, ids) -> Tensor:
        ids = self.check_ids(ids, self.num_embeddings)
        local = ids.data - self.vocab_start
        inside = (local >= 0) & (local < self.weight.shape[0])
        safe = Tensor(ids.xp.where(inside, local, 0), device=ids.device)
        rows = F.embedding(safe, self.weight, padding_idx=self.local_padding_idx)
        rows = rows * Tensor(inside[..., None].astype(rows.dtype), device=ids.device)
        return reduce_from_region(rows, self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, P={self.group.size}"


class VocabParallelClassifier1D(Linear1DCol):
    """The output layer of a language model, split by vocabulary: ``(in_features, num_classes)``,
    logits ``(..., V/P)`` per rank (the full logits never exist on one rank). Pair it with
    ``tp.cross_entropy``.

    Example::

        head = tp.VocabParallelClassifier1D(256, 50304, bias=False)
    """


class LayerNorm1D(M.LayerNorm):
    """LayerNorm in 1D tensor parallelism: activations between column/row pairs are whole on every
    rank, so this is the single-device LayerNorm with replicated parameters (their gradients are
    equal on every rank without communication)."""
