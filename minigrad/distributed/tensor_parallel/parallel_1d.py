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

Colossal-AI's 1D layers, by the names and arguments its programs use: :class:`Linear1D_Col`,
:class:`Linear1D_Row` (``parallel_input``, ``skip_bias_add``, ``stream_chunk_num``),
:class:`Embedding1D` (the embedding dimension split, output gathered whole),
:class:`Classifier1D` (the input features split, logits whole) and :class:`VanillaClassifier`
(not split at all); ``weight=`` ties a classifier to an embedding's (local) table.
"""

from __future__ import annotations

import minigrad.functional as F
import minigrad.module as M
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.mesh.parallel_context import ParallelContext
from minigrad.distributed.tensor_parallel.layouts import (
    REPLICATED,
    SPLIT_1D,
    advance_layout,
    current_layout,
)
from minigrad.distributed.tensor_parallel.regions import (
    copy_to_region,
    gather_from_region,
    reduce_from_region,
    split_to_region,
)
from minigrad.distributed.tensor_parallel.sharding import ParallelModule, ShardSpec

__all__ = [
    "Classifier1D",
    "Embedding1D",
    "LayerNorm1D",
    "Linear1DCol",
    "Linear1DRow",
    "Linear1D_Col",
    "Linear1D_Row",
    "VanillaClassifier",
    "VocabParallelClassifier1D",
    "VocabParallelEmbedding1D",
]


def _row_parallel_linear(layer: ParallelModule, x: Tensor, input_is_split: bool) -> Tensor:
    """The forward of a layer whose weight is split by input features (``Linear1DRow``,
    ``Classifier1D``): split a whole input along its features unless it is split already,
    multiply by this rank's block of the weight, sum the partial products over the layer's group,
    then add the (whole) bias."""
    if not input_is_split:
        layer.check_features(x, layer.in_features)
        x = split_to_region(x, layer.group, -1)
    layer.check_features(x, layer.weight.shape[1])
    y = reduce_from_region(F.linear(x, layer.weight), layer.group)
    return y if layer.bias is None else y + layer.bias


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
        return _row_parallel_linear(self, x, self.input_is_parallel)

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


def _colossal_options(owner: str, dtype, weight_initializer, bias_initializer) -> None:
    """Colossal-AI's constructor options that need torch objects: only their defaults."""
    for name, value in (("weight_initializer", weight_initializer),
                        ("bias_initializer", bias_initializer)):
        if value is not None:
            raise TypeError(f"{owner}: {name} takes a torch initializer in Colossal-AI; minigrad "
                            "layers initialise as their single-device twins (leave it out)")
    del dtype  # applied by _cast_parameters


def _cast_parameters(module, dtype) -> None:
    """Store the module's own tensors in ``dtype`` (Colossal-AI's ``dtype=`` argument)."""
    if dtype is not None:
        for t in module.tensors(recursive=False):
            t._data = t._data.astype(dtype)


def _tied_weight(owner: str, weight: Tensor | None, shape: tuple) -> Tensor | None:
    if weight is not None and tuple(weight.shape) != tuple(shape):
        raise ValueError(f"{owner}: the tied weight on this rank must have shape {tuple(shape)}, "
                         f"got {tuple(weight.shape)}")
    return weight


class VocabParallelClassifier1D(Linear1DCol):
    """The output layer of a language model, split by vocabulary: ``(in_features, num_classes)``,
    logits ``(..., V/P)`` per rank (the full logits never exist on one rank). Pair it with
    ``tp.cross_entropy``. Colossal-AI's arguments: ``weight`` ties it to a vocabulary-split
    table (this rank's ``(V/P, in_features)`` block, e.g. a :class:`VocabParallelEmbedding1D`'s
    weight), ``dtype`` stores the parameters in that dtype, ``gather_output`` gathers the logits.

    Example::

        head = tp.VocabParallelClassifier1D(256, 50304, bias=False)
    """

    def __init__(self, in_features: int, num_classes: int, weight: Tensor | None = None,
                 bias: bool = True, dtype=None, gather_output: bool = False,
                 weight_initializer=None, bias_initializer=None,
                 ctx: ParallelContext | None = None, out_chunks: int = 1):
        _colossal_options("VocabParallelClassifier1D", dtype, weight_initializer,
                          bias_initializer)
        super().__init__(in_features, num_classes, bias, gather_output=gather_output,
                         out_chunks=out_chunks, ctx=ctx)
        if weight is not None:
            self.weight = _tied_weight("VocabParallelClassifier1D", weight, self.weight.shape)
        _cast_parameters(self, dtype)


class Linear1D_Col(Linear1DCol):  # noqa: N801  (Colossal-AI's name)
    """Colossal-AI's ``Linear1D_Col``: :class:`Linear1DCol` with Colossal-AI's arguments;
    ``skip_bias_add=True`` returns ``(output, bias)`` and leaves the addition to the caller (to
    fuse it into the next op), as Colossal-AI does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None,
                 gather_output: bool = False, skip_bias_add: bool = False,
                 weight_initializer=None, bias_initializer=None,
                 ctx: ParallelContext | None = None):
        _colossal_options("Linear1D_Col", dtype, weight_initializer, bias_initializer)
        super().__init__(in_features, out_features, bias, gather_output=gather_output, ctx=ctx)
        self.skip_bias_add = bool(skip_bias_add)
        _cast_parameters(self, dtype)

    def forward(self, x: Tensor):
        if not self.skip_bias_add or self.bias is None:
            return super().forward(x)
        self.check_features(x, self.in_features)
        y = F.linear(copy_to_region(x, self.group), self.weight)
        bias = self.bias
        if self.gather_output:
            y, bias = gather_from_region(y, self.group, -1), gather_from_region(bias, self.group)
        return y, bias


class Linear1D_Row(Linear1DRow):  # noqa: N801  (Colossal-AI's name)
    """Colossal-AI's ``Linear1D_Row``: :class:`Linear1DRow` with Colossal-AI's arguments
    (``parallel_input`` is ``input_is_parallel``; ``skip_bias_add=True`` returns ``(output,
    bias)``). ``stream_chunk_num`` > 1, for inference only, computes the output features in that
    many chunks, each summed over the ranks as soon as it is ready (the same numbers; in training
    mode it raises, as in Colossal-AI)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None,
                 parallel_input: bool = True, skip_bias_add: bool = False,
                 weight_initializer=None, bias_initializer=None, stream_chunk_num: int = 1,
                 ctx: ParallelContext | None = None):
        _colossal_options("Linear1D_Row", dtype, weight_initializer, bias_initializer)
        if int(stream_chunk_num) < 1 or int(out_features) % int(stream_chunk_num):
            raise ValueError(f"Linear1D_Row: stream_chunk_num must be a positive divisor of "
                             f"out_features {out_features}, got {stream_chunk_num}")
        super().__init__(in_features, out_features, bias, input_is_parallel=parallel_input,
                         ctx=ctx)
        self.skip_bias_add, self.stream_chunk_num = bool(skip_bias_add), int(stream_chunk_num)
        _cast_parameters(self, dtype)

    def forward(self, x: Tensor):
        if self.stream_chunk_num == 1 and not self.skip_bias_add:
            return super().forward(x)
        if not self.input_is_parallel:
            self.check_features(x, self.in_features)
            x = split_to_region(x, self.group, -1)
        self.check_features(x, self.weight.shape[1])
        if self.stream_chunk_num == 1:
            y = reduce_from_region(F.linear(x, self.weight), self.group)
        elif self.training:
            raise RuntimeError("Linear1D_Row: stream_chunk_num > 1 is for inference; call "
                               "model.eval() first, or use stream_chunk_num=1 for training")
        else:
            rows = self.out_features // self.stream_chunk_num
            y = F.concat([reduce_from_region(F.linear(x, self.weight[k * rows:(k + 1) * rows]),
                                             self.group)
                          for k in range(self.stream_chunk_num)], axis=-1)
        if self.skip_bias_add:
            return y, self.bias
        return y if self.bias is None else y + self.bias


class Embedding1D(ParallelModule):
    """Colossal-AI's ``Embedding1D``: the table's embedding dimension is split over the ranks
    (rank j keeps columns ``[j·D/P, (j+1)·D/P)`` of every row); the looked-up pieces are
    all-gathered, so the output ``(..., D)`` is whole on every rank. Same parameters and
    results as ``M.Embedding``."""

    mode = "1d"

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype=None, weight_initializer=None, ctx: ParallelContext | None = None):
        _colossal_options("Embedding1D", dtype, weight_initializer, None)
        super().__init__(ctx)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        self.group = self.ctx.group("1d")
        self.adopt(M.Embedding(num_embeddings, embedding_dim, padding_idx), {
            "weight": ShardSpec((self.num_embeddings, self.embedding_dim), ((), ("tensor",))),
        }, names=("weight",))
        _cast_parameters(self, dtype)
        self.input_layout = self.output_layout = REPLICATED
        advance_layout(self.ctx, self.output_layout)

    def forward(self, ids) -> Tensor:
        ids = self.check_ids(ids, self.num_embeddings)
        rows = F.embedding(ids, self.weight, padding_idx=self.padding_idx)
        return gather_from_region(rows, self.group, -1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, P={self.group.size}"


class Classifier1D(ParallelModule):
    """Colossal-AI's ``Classifier1D``: the weight ``(num_classes, in_features)`` is split by input
    feature (rank j keeps columns ``[j·K/P, (j+1)·K/P)``), the partial logits are summed by one
    all-reduce, and the logits ``(..., num_classes)`` come out whole on every rank (the bias,
    replicated, is added after the sum). The input is whole, or split when the layer built before
    it leaves it split (a column-parallel Linear), as in Colossal-AI. ``weight`` ties it to an
    :class:`Embedding1D`'s table, whose local block ``(num_classes, K/P)`` has this shape."""

    mode = "1d"

    def __init__(self, in_features: int, num_classes: int, weight: Tensor | None = None,
                 bias: bool = True, dtype=None, weight_initializer=None, bias_initializer=None,
                 ctx: ParallelContext | None = None):
        _colossal_options("Classifier1D", dtype, weight_initializer, bias_initializer)
        super().__init__(ctx)
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        self.group = self.ctx.group("1d")
        self.input_layout = current_layout(self.ctx)
        self.adopt(M.Linear(in_features, num_classes, bias), {
            "weight": ShardSpec((self.num_classes, self.in_features), ((), ("tensor",))),
        })
        if weight is not None:
            self.weight = _tied_weight("Classifier1D", weight, self.weight.shape)
            self.shard_specs.pop("weight")  # saved by the layer that owns it
        _cast_parameters(self, dtype)
        self.output_layout = REPLICATED
        advance_layout(self.ctx, self.output_layout)

    def forward(self, x: Tensor) -> Tensor:
        return _row_parallel_linear(self, x, self.input_layout is SPLIT_1D)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, "
                f"bias={self.bias is not None}, P={self.group.size}")


class VanillaClassifier(M.Module):
    """Colossal-AI's ``VanillaClassifier``: a classifier that is not split (every rank computes
    the whole logits from a whole input), with Colossal-AI's arguments; ``weight`` ties it to a
    whole ``(num_classes, in_features)`` table (an embedding's)."""

    def __init__(self, in_features: int, num_classes: int, weight: Tensor | None = None,
                 bias: bool = True, dtype=None, weight_initializer=None, bias_initializer=None):
        _colossal_options("VanillaClassifier", dtype, weight_initializer, bias_initializer)
        super().__init__()
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        twin = M.Linear(in_features, num_classes, bias)
        self.weight = twin.weight if weight is None else _tied_weight(
            "VanillaClassifier", weight, twin.weight.shape)
        self.bias = twin.bias
        _cast_parameters(self, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, "
                f"bias={self.bias is not None}")


class LayerNorm1D(M.LayerNorm):
    """LayerNorm in 1D tensor parallelism: activations between column/row pairs are whole on every
    rank, so this is the single-device LayerNorm with replicated parameters (their gradients are
    equal on every rank without communication)."""
