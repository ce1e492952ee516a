"""``PipelineModule``: a model given as a sequence of layers, cut into pipeline stages.

A pipelined model is a list of layers applied one after the other (DeepSpeed's form). Each item
of ``layers`` is

* a :class:`LayerSpec` ``LayerSpec(cls, *args, **kwargs)``: the layer is *described*, and built
  only on the stage that owns it — a 100-layer model never materialises on every rank;
* a :class:`TiedLayerSpec`: a layer whose weight is shared by several positions (an embedding
  reused as the output head); one copy lives on every stage that owns one of the positions;
* a built :class:`~minigrad.module.Module`, or any callable (``lambda x: x.reshape(...)``).

An ``M.Sequential`` is accepted as the list of its layers. The layers are cut into
``num_stages * chunks`` contiguous parts by ``partition_method``; stage ``s`` owns parts
``s, s + S, ...`` (one per chunk) and builds only those layers. Everything that decides the
partition is pure — it depends only on the arguments, never on communication — so every rank
computes the same partition and rejects the same bad configuration, before any message is sent.

Example::

    specs = [TiedLayerSpec("embed", M.Embedding, 256, 64),
             *[LayerSpec(Block, 64) for _ in range(6)],
             LayerSpec(M.LayerNorm, 64),
             TiedLayerSpec("embed", M.Embedding, 256, 64,
                           forward_fn=lambda emb, h: F.matmul(h, emb.weight.T))]
    net = PipelineModule(specs, num_stages=2, loss_fn=F.nn.cross_entropy,
                         partition_method="type:block")
    net.parts          # [0, 4, 9]: stage 0 runs layers 0-3, stage 1 layers 4-8
    y = net(x)         # this stage's layers (chunk 0), one after the other

Parameter counts without building. ``partition_method="parameters"`` balances trainable
parameters, so it must know each layer's count — but a LayerSpec's constructor is never called
on a stage that does not own the layer (DeepSpeed builds every spec once to count it; minigrad
does not). A spec's count therefore comes from its arguments: the class may define a classmethod
``parameter_count(*args, **kwargs)``, and minigrad's own layers (Linear, Embedding, LayerNorm,
Conv, attention, parameter-free layers...) are known. For another class the constructor
raises a clear error naming the layer and the ways out (add ``parameter_count``, or pick
``"uniform"``, ``"type:REGEX"`` or explicit bounds).

Checkpoints are keyed by **global layer index**: the state of layer ``i`` is named ``"i.weight"``,
``"i.bias"``..., exactly like an ``M.Sequential`` of the same layers, and a tied layer's state
is named after the first position of its key. :meth:`PipelineModule.save_state_dict` writes one
file per layer (``layer_05-model_states.mgc``), so a checkpoint can be loaded with any number of
stages (:meth:`PipelineModule.load_state_dir`) or by a single-process model
(``seq.load_state_dict(load_layer_states(path))``).

Testing seam: ``stage_id=s`` builds stage ``s``'s part in a plain process, without a process
group, e.g. to check a partition or write and read checkpoints for several stage counts.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import minigrad.module as M
from minigrad import serialization
from minigrad.autodiff import checkpoint
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.comm.group import get_rank, get_world_size, is_distributed
from minigrad.distributed.mesh.topology import PipeDataParallelTopology, ProcessTopology
from minigrad.distributed.pipeline.partition import (
    check_bounds,
    partition_balanced,
    partition_uniform,
)
from minigrad.module import Module

__all__ = [
    "LayerSpec",
    "PipelineError",
    "PipelineModule",
    "TiedLayerSpec",
    "layer_state_path",
    "load_layer_states",
    "save_layer_states",
]

logger = logging.getLogger("minigrad.distributed.pipeline")


class PipelineError(RuntimeError):
    """A pipeline is used the wrong way (a stage run outside its engine's steps, ``train_batch``
    under ``no_grad``), or a pipelined step failed on some rank (the message names it)."""


# ------------------------------------------------------------------------------------------------
# Layer specifications
# ------------------------------------------------------------------------------------------------
class LayerSpec:
    """A layer described by its class and constructor arguments, built only where it is needed.

    ``LayerSpec(M.Linear, 64, 64, bias=False).build()`` is ``M.Linear(64, 64, bias=False)``; a
    :class:`PipelineModule` calls :meth:`build` only on the stage that owns the layer.
    """

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any):
        if not (isinstance(typename, type) and issubclass(typename, Module)):
            raise TypeError(
                f"LayerSpec: expected a Module subclass, got {typename!r}; pass a built layer "
                f"or a plain callable to PipelineModule directly"
            )
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self) -> Module:
        """Construct the layer."""
        return self.typename(*self.module_args, **self.module_kwargs)

    def num_parameters(self) -> int | None:
        """The number of trainable parameters of the built layer, computed from the arguments
        without building it; None when unknown (see the module docstring)."""
        counter = getattr(self.typename, "parameter_count", None)
        if counter is not None:
            return int(counter(*self.module_args, **self.module_kwargs))
        cls = self.typename          # exact classes only: a subclass may take other arguments
        if cls in _PARAMETER_FREE:
            return 0
        if cls not in _KNOWN_COUNTS:
            return None
        try:
            bound = inspect.signature(cls).bind(*self.module_args, **self.module_kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        return _KNOWN_COUNTS[cls](bound.arguments)

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args]
        args += [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{type(self).__name__}({', '.join([self.typename.__name__, *args])})"


class TiedLayerSpec(LayerSpec):
    """A layer whose weights are shared by every position that uses the same ``key``.

    Each stage owning a position of ``key`` builds one copy (once, however many positions it
    owns); the engine broadcasts it from the lowest owning stage at start and sums its gradients
    over the owning stages, so the copies stay identical. ``forward_fn(layer, x)``, if given,
    replaces ``layer(x)`` at this position (e.g. an embedding used as the output projection).
    ``tied_weight_attr`` names the shared attribute(s) (a string or a list of strings).
    """

    def __init__(
        self,
        key: str,
        typename: type,
        *module_args: Any,
        forward_fn: Callable | None = None,
        tied_weight_attr: str | Sequence[str] = "weight",
        **module_kwargs: Any,
    ):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        attrs = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        if not attrs or not all(isinstance(a, str) for a in attrs):
            raise TypeError(
                f"TiedLayerSpec({key!r}): tied_weight_attr must be a name or a list of names, "
                f"got {tied_weight_attr!r}"
            )
        self.tied_weight_attr = tuple(attrs)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, key={self.key!r})"


def _size(shape) -> int:
    return math.prod((shape,) if isinstance(shape, int) else shape)


def _conv_count(nd: int, transposed: bool) -> Callable[[dict], int]:
    def count(a: dict) -> int:
        kernel = a["kernel_size"]
        kernel = _size((kernel,) * nd if isinstance(kernel, int) else kernel)
        return (a["in_channels"] * a["out_channels"] // a["groups"] * kernel
                + (a["out_channels"] if a["bias"] else 0))
    return count


# Parameter counts of minigrad's layers from their constructor arguments (keep in step with
# minigrad.module; tests compare each against a built layer).
_KNOWN_COUNTS: dict[type, Callable[[dict], int]] = {
    M.Linear: lambda a: (a["in_features"] + bool(a["bias"])) * a["out_features"],
    M.Embedding: lambda a: a["num_embeddings"] * a["embedding_dim"],
    M.LayerNorm: lambda a: 2 * _size(a["normalized_shape"]) if a["affine"] else 0,
    M.GroupNorm: lambda a: 2 * a["num_channels"] if a["affine"] else 0,
    M.BatchNorm1d: lambda a: 2 * a["num_features"] if a["affine"] else 0,
    M.BatchNorm2d: lambda a: 2 * a["num_features"] if a["affine"] else 0,
    M.Conv1d: _conv_count(1, False),
    M.Conv2d: _conv_count(2, False),
    M.ConvTranspose2d: _conv_count(2, True),
    M.MultiHeadAttention: lambda a: 4 * (a["embed_dim"] + bool(a["bias"])) * a["embed_dim"],
}
_PARAMETER_FREE = frozenset({
    M.GELU, M.LeakyReLU, M.ReLU, M.Sigmoid, M.SiLU, M.Softmax, M.Tanh, M.Dropout, M.Identity,
    M.Flatten, M.AdaptiveAvgPool2d, M.AvgPool2d, M.MaxPool2d,
})


def _layer_name(layer) -> str:
    """The class name a ``type:REGEX`` partition matches and the partition table shows."""
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, Module):
        return type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


def _num_parameters(layer) -> int | None:
    if isinstance(layer, LayerSpec):
        return layer.num_parameters()
    if isinstance(layer, Module):
        return sum(p.size for p in layer.parameters())
    return 0


# ------------------------------------------------------------------------------------------------
# The pipeline module
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layers:
    """Every layer of the model as given (specs, modules, callables). Held in a dataclass
    because ``Module``'s attribute scan does not look inside one: layers this stage does not own
    must not count as its parameters."""

    items: tuple


@dataclass(frozen=True)
class _Chunk:
    """The layers one stage runs for one chunk: global indices and the callables to apply."""

    start: int
    stop: int
    functions: tuple[Callable, ...]


class PipelineModule(Module):
    """A sequence of layers partitioned over the stages of a pipeline; this object holds (and
    runs) only the calling stage's part. See the module docstring for the layer kinds, the
    partition methods and the checkpoint layout.

    Arguments: ``layers`` (list, tuple or ``M.Sequential``); ``num_stages`` S or ``topology`` (a
    :class:`~minigrad.distributed.mesh.topology.ProcessTopology` with a ``"pipe"`` axis; by default
    ``PipeDataParallelTopology(S, world_size // S)``); ``loss_fn(outputs, labels)`` applied by the
    engine on the last stage; ``partition_method`` — ``"parameters"``, ``"uniform"``,
    ``"type:REGEX"`` or a list of ``S * chunks + 1`` bounds; ``activation_checkpoint_interval`` k
    (recompute every k layers in backward; 0 = off); ``chunks`` v model chunks per stage (for
    the interleaved schedule); ``stage_id`` (keyword only) builds that stage's part without a
    process group — a seam for tests and tools.
    """

    def __init__(
        self,
        layers,
        num_stages: int | None = None,
        topology: ProcessTopology | None = None,
        loss_fn: Callable | None = None,
        partition_method: str | Sequence[int] = "parameters",
        activation_checkpoint_interval: int = 0,
        chunks: int = 1,
        *,
        stage_id: int | None = None,
    ):
        super().__init__()
        specs = _layer_list(layers)
        self.topology, self.num_stages = _resolve_topology(num_stages, topology, stage_id)
        self.stage_id = _resolve_stage(self.topology, self.num_stages, stage_id)
        self.chunks = _check_int("chunks", chunks, minimum=1)
        self.activation_checkpoint_interval = _check_int(
            "activation_checkpoint_interval", activation_checkpoint_interval, minimum=0)
        if isinstance(loss_fn, Module) and any(True for _ in loss_fn.parameters()):
            raise TypeError(
                "PipelineModule: loss_fn has parameters; put trainable layers into `layers` so "
                "that the pipeline partitions, trains and saves them"
            )
        self.loss_fn = loss_fn
        self.partition_method = partition_method
        self.parts = _partition(specs, self.num_stages * self.chunks, partition_method)
        self._layers = _Layers(tuple(specs))
        self._tie_groups = self._find_tie_groups()
        self._chunks = tuple(self._build_chunk(c) for c in range(self.chunks))
        self._engine_bound = False     # set by PipelineEngine: forward only inside its steps
        self._engine_running = False
        if not is_distributed() or get_rank() == 0:
            logger.info("%s", self.partition_table())

    # -- construction ----------------------------------------------------------------------------
    def _find_tie_groups(self) -> dict[str, tuple[int, ...]]:
        owners: dict[str, set[int]] = {}
        for i, spec in enumerate(self._layers.items):
            if isinstance(spec, TiedLayerSpec):
                owners.setdefault(spec.key, set()).add(self.stage_of_layer(i))
        return {key: tuple(sorted(stages)) for key, stages in owners.items()}

    def _build_chunk(self, chunk: int) -> _Chunk:
        part = chunk * self.num_stages + self.stage_id
        start, stop = self.parts[part], self.parts[part + 1]
        functions = []
        for i in range(start, stop):
            spec = self._layers.items[i]
            if isinstance(spec, TiedLayerSpec):
                name = str(self.tied_layer_index(spec.key))
                module = self.__dict__.get(name)
                if module is None:
                    module = spec.build()
                    setattr(self, name, module)
                functions.append(module if spec.forward_fn is None
                                 else _TiedForward(spec.forward_fn, module))
            elif isinstance(spec, LayerSpec):
                module = spec.build()
                setattr(self, str(i), module)
                functions.append(module)
            else:
                if isinstance(spec, Module):
                    setattr(self, str(i), spec)
                functions.append(spec)
        return _Chunk(start, stop, tuple(functions))

    # -- the partition ---------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """The number of layers of the whole model (all stages)."""
        return len(self._layers.items)

    def stage_of_layer(self, index: int) -> int:
        """The stage that owns global layer ``index``."""
        for part in range(len(self.parts) - 1):
            if self.parts[part] <= index < self.parts[part + 1]:
                return part % self.num_stages
        raise IndexError(f"PipelineModule: layer {index} is outside [0, {self.num_layers})")

    def layer_range(self, chunk: int = 0) -> range:
        """The global indices of the layers this stage runs for ``chunk``."""
        part = self._chunk(chunk)
        return range(part.start, part.stop)

    def pipeline_ranks(self) -> list[int]:
        """The global ranks of this rank's pipeline, indexed by stage: a schedule's transfer to
        stage ``p`` goes to ``pipeline_ranks()[p]``. Pure (no process group is created); outside
        a job of the topology's size (the ``stage_id`` seam) the first pipeline's ranks."""
        if is_distributed() and get_world_size() == self.topology.world_size():
            return self.topology.group_ranks("pipe", rank=get_rank())
        return self.topology.get_axis_comm_lists("pipe")[0]

    @property
    def is_first_stage(self) -> bool:
        """Whether this stage holds the model's first layer (it reads the inputs)."""
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        """Whether this stage holds the model's last layer (it computes the loss)."""
        return self.stage_id == self.num_stages - 1

    def partition_table(self) -> str:
        """The partition as a table: stage, chunk, layer range, layer names, parameters."""
        rows = [("stage", "chunk", "layers", "names", "parameters")]
        for part in range(len(self.parts) - 1):
            start, stop = self.parts[part], self.parts[part + 1]
            counts = [_num_parameters(self._layers.items[i]) for i in range(start, stop)]
            total = "?" if None in counts else f"{sum(counts):,}"
            names = _summarise_names(self._layers.items[start:stop])
            rows.append((str(part % self.num_stages), str(part // self.num_stages),
                         f"{start}-{stop - 1}", names, total))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = [" | ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        method = self.partition_method
        head = (f"PipelineModule: {self.num_layers} layers over {self.num_stages} stages"
                + (f" x {self.chunks} chunks" if self.chunks > 1 else "")
                + f" (partition_method={method!r})")
        return "\n".join([head, *lines])

    # -- tied layers -----------------------------------------------------------------------------
    def tie_groups(self) -> dict[str, tuple[int, ...]]:
        """``key -> stages`` owning a copy of each tied layer (the same on every rank)."""
        return dict(self._tie_groups)

    def tied_layer_index(self, key: str) -> int:
        """The first global position of tied ``key``: its state is saved under this index."""
        for i, spec in enumerate(self._layers.items):
            if isinstance(spec, TiedLayerSpec) and spec.key == key:
                return i
        raise KeyError(f"PipelineModule: no tied layer with key {key!r}")

    def tied_modules(self) -> dict[str, Module]:
        """``key -> this stage's copy`` of every tied layer it owns."""
        return {key: getattr(self, str(self.tied_layer_index(key)))
                for key, stages in self._tie_groups.items() if self.stage_id in stages}

    def tied_weights(self) -> dict[str, list[Parameter]]:
        """``key -> [shared Parameters]`` of this stage's tied copies (``tied_weight_attr``):
        what the engine broadcasts from the lowest owning stage and whose gradients it sums."""
        out = {}
        for key, module in self.tied_modules().items():
            spec = self._layers.items[self.tied_layer_index(key)]
            out[key] = [getattr(module, attr) for attr in spec.tied_weight_attr]
        return out

    def tie_group_ranks(self, key: str) -> list[list[int]]:
        """The global ranks that share tied ``key``'s gradients: one list per pipeline (data,
        model... coordinate), each the ranks of the owning stages in stage order — the process
        groups the engine creates for ``ReduceTiedGrads``."""
        stages = self._tie_groups[key]
        return [[pipe[s] for s in stages] for pipe in self.topology.get_axis_comm_lists("pipe")]

    # -- running ---------------------------------------------------------------------------------
    def _chunk(self, chunk: int) -> _Chunk:
        if not 0 <= chunk < self.chunks:
            raise ValueError(f"PipelineModule: chunk {chunk} is outside [0, {self.chunks})")
        return self._chunks[chunk]

    def forward(self, inputs, chunk: int = 0):
        """Apply this stage's layers of ``chunk`` in order. A layer receives what the previous one
        returned — a Tensor or a tuple of Tensors — as its one argument. With
        ``activation_checkpoint_interval`` k, every run of k consecutive layers is one
        :func:`minigrad.autodiff.checkpoint` call: only its input is kept for backward, and its
        internals are recomputed (with the same dropout masks) when the backward reaches it.

        Once a :class:`~minigrad.distributed.pipeline.PipelineEngine` drives this module, only
        the engine's ``train_batch`` and ``eval_batch`` may run it: a stage alone computes only
        part of the model, without the transfers that feed it.
        """
        if self._engine_bound and not self._engine_running:
            raise PipelineError(
                "PipelineModule: this stage is driven by a PipelineEngine; only "
                "engine.train_batch() and engine.eval_batch() run it (pipeline mode)"
            )
        part = self._chunk(chunk)
        _check_value(inputs, "the input of", part.start, None)
        layers = list(zip(range(part.start, part.stop), part.functions))
        k = self.activation_checkpoint_interval or len(layers)  # 0: one segment, no recompute
        x = inputs
        for i in range(0, len(layers), k):
            segment = _Segment(layers[i:i + k], isinstance(x, tuple))
            args = x if isinstance(x, tuple) else (x,)
            x = checkpoint(segment, *args) if self.activation_checkpoint_interval else \
                segment(*args)
        return x

    # -- checkpoints -----------------------------------------------------------------------------
    def save_state_dict(self, save_dir: str) -> list[str]:
        """Write this stage's layers, one file per global layer index (layers without tensors
        get none; a tied layer is written by the stage holding its first position). Returns the
        paths written. With data parallelism one replica per stage should call this."""
        state = self.state_dict()
        own = {str(i) for c in range(self.chunks) for i in self.layer_range(c)}
        return save_layer_states(
            OrderedDict((k, v) for k, v in state.items() if k.split(".", 1)[0] in own), save_dir)

    def load_state_dir(self, load_dir: str, strict: bool = True) -> "PipelineModule":
        """Load this stage's layers (and tied copies) from a directory written by
        :meth:`save_state_dict` or :func:`save_layer_states`, whatever the stage count was."""
        heads = {name.split(".", 1)[0] for name, _ in self.named_tensors()}
        indices = sorted(int(head) for head in heads if head.isdigit())
        state: OrderedDict = OrderedDict()
        for i in indices:
            path = layer_state_path(load_dir, i)
            if os.path.exists(path):
                state.update(serialization.load(path))
            elif strict:
                raise FileNotFoundError(
                    f"PipelineModule.load_state_dir: stage {self.stage_id} needs layer {i}, but "
                    f"{path} does not exist"
                )
        self.load_state_dict(state, strict=strict)
        return self

    def extra_repr(self) -> str:
        return (f"stage {self.stage_id} of {self.num_stages}, layers "
                + ", ".join(f"{r.start}-{r.stop - 1}" for r in map(self.layer_range,
                                                                     range(self.chunks))))


class _Segment:
    """Consecutive layers as one function of the unpacked input (what ``checkpoint`` calls, and
    calls again during backward); checks each layer's output."""

    def __init__(self, layers: Sequence[tuple[int, Callable]], tuple_input: bool):
        self.layers = layers
        self.tuple_input = tuple_input
        self.__name__ = f"layers {layers[0][0]}-{layers[-1][0]}"

    def __call__(self, *xs):
        x = xs if self.tuple_input else xs[0]
        for index, fn in self.layers:
            x = fn(x)
            _check_value(x, "the output of", index, fn)
        return x


class _TiedForward:
    """``forward_fn(module, x)`` as a one-argument callable (not a Module, so the tied module is
    registered once, under its first position)."""

    def __init__(self, forward_fn: Callable, module: Module):
        self.forward_fn = forward_fn
        self.module = module

    def __call__(self, x):
        return self.forward_fn(self.module, x)


def _check_value(value, what: str, index: int, layer) -> None:
    ok = isinstance(value, Tensor) or (
        isinstance(value, tuple) and value and all(isinstance(v, Tensor) for v in value))
    if not ok:
        kind = type(value).__name__
        if isinstance(value, tuple):
            kind = "tuple of (" + ", ".join(type(v).__name__ for v in value) + ")"
        who = f"layer {index}" + (f" ({_layer_name(layer)})" if layer is not None else "")
        raise TypeError(
            f"PipelineModule: {what} {who} is a {kind}; pipeline layers take and return a "
            f"Tensor or a tuple of Tensors"
        )


def _summarise_names(specs: Sequence) -> str:
    """``"Embedding, Block x3"``: consecutive equal names folded."""
    names: list[list] = []
    for spec in specs:
        name = _layer_name(spec)
        if isinstance(spec, TiedLayerSpec):
            name += f"[{spec.key}]"
        if names and names[-1][0] == name:
            names[-1][1] += 1
        else:
            names.append([name, 1])
    return ", ".join(n if k == 1 else f"{n} x{k}" for n, k in names)


# ------------------------------------------------------------------------------------------------
# Configuration checks (pure: identical on every rank, before any communication)
# ------------------------------------------------------------------------------------------------
def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"PipelineModule: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def _layer_list(layers) -> list:
    if isinstance(layers, M.Sequential):
        layers = list(layers)
    if not isinstance(layers, (list, tuple)):
        raise TypeError(
            f"PipelineModule: layers must be a list, a tuple or an M.Sequential, got "
            f"{type(layers).__name__}"
        )
    if not layers:
        raise ValueError("PipelineModule: layers is empty")
    for i, layer in enumerate(layers):
        if not (isinstance(layer, (LayerSpec, Module)) or callable(layer)):
            raise TypeError(
                f"PipelineModule: layer {i} is a {type(layer).__name__}; expected a LayerSpec, "
                f"a Module or a callable"
            )
    return list(layers)


def _resolve_topology(
    num_stages: int | None, topology: ProcessTopology | None, stage_id: int | None
) -> tuple[ProcessTopology, int]:
    world = get_world_size() if is_distributed() else 1
    if topology is None:
        if num_stages is None:
            raise ValueError("PipelineModule: give num_stages or topology")
        num_stages = _check_int("num_stages", num_stages, minimum=1)
        if stage_id is None and world % num_stages:
            raise ValueError(
                f"PipelineModule: num_stages ({num_stages}) must divide the world size ({world})"
                + ("" if is_distributed() else "; to build one stage in a single process, pass "
                   "stage_id=")
            )
        replicas = world // num_stages if stage_id is None else 1
        return PipeDataParallelTopology(num_stages, max(replicas, 1)), num_stages
    if not isinstance(topology, ProcessTopology) or "pipe" not in topology.get_axis_names():
        raise ValueError(
            f"PipelineModule: topology must be a ProcessTopology with a 'pipe' axis, got "
            f"{topology!r}"
        )
    stages = topology.get_dim("pipe")
    if num_stages is not None and num_stages != stages:
        raise ValueError(
            f"PipelineModule: num_stages ({num_stages}) differs from the topology's pipe "
            f"dimension ({stages})"
        )
    if stage_id is None and topology.world_size() != world:
        raise ValueError(
            f"PipelineModule: the topology {topology!r} needs {topology.world_size()} ranks, but "
            f"the world size is {world}"
        )
    return topology, stages


def _resolve_stage(topology: ProcessTopology, num_stages: int, stage_id: int | None) -> int:
    if stage_id is None:
        return topology.get_coord(get_rank() if is_distributed() else 0).pipe
    stage_id = _check_int("stage_id", stage_id, minimum=0)
    if stage_id >= num_stages:
        raise ValueError(f"PipelineModule: stage_id {stage_id} is outside [0, {num_stages})")
    return stage_id


def _partition(specs: Sequence, num_parts: int, method) -> list[int]:
    """The bounds of ``num_parts`` parts of ``specs`` by ``method`` (see the module docstring)."""
    if len(specs) < num_parts:
        raise ValueError(
            f"PipelineModule: {len(specs)} layers cannot fill {num_parts} pipeline parts "
            f"(stages x chunks); every part needs at least one layer"
        )
    if not isinstance(method, str):
        return check_bounds(method, len(specs), num_parts)
    if method == "uniform":
        return partition_uniform(len(specs), num_parts)
    if method == "parameters":
        counts = [_num_parameters(s) for s in specs]
        unknown = [i for i, c in enumerate(counts) if c is None]
        if unknown:
            i = unknown[0]
            raise ValueError(
                f"PipelineModule: partition_method='parameters' needs the parameter count of "
                f"layer {i} ({specs[i]!r}) without building it (a LayerSpec is built only on the "
                f"stage that owns it): give {specs[i].typename.__name__} a classmethod "
                f"parameter_count(*args, **kwargs), or use partition_method='uniform', "
                f"'type:REGEX' or explicit bounds"
            )
        return partition_balanced(counts, num_parts)
    if method.lower().startswith("type:"):
        pattern = method[len("type:"):]
        regex = re.compile(pattern, re.IGNORECASE)
        weights = [1 if regex.search(_layer_name(s)) else 0 for s in specs]
        if not any(weights):
            names = sorted({_layer_name(s) for s in specs})
            raise ValueError(
                f"PipelineModule: partition_method {method!r}: the regex {pattern!r} matches no "
                f"layer class (the layers are {names})"
            )
        return partition_balanced(weights, num_parts)
    raise ValueError(
        f"PipelineModule: unknown partition_method {method!r}; expected 'parameters', "
        f"'uniform', 'type:REGEX' or a list of bounds"
    )


# ------------------------------------------------------------------------------------------------
# Checkpoint files, one per global layer index
# ------------------------------------------------------------------------------------------------
def layer_state_path(directory: str, index: int) -> str:
    """The file that holds the state of global layer ``index`` in a pipeline checkpoint."""
    return os.path.join(directory, f"layer_{index:02d}-model_states.mgc")


def save_layer_states(state_dict: dict, save_dir: str) -> list[str]:
    """Split a state dict keyed by global layer index (``"5.weight"`` — a pipeline stage's or an
    ``M.Sequential``'s) into one file per layer under ``save_dir``; returns the paths written."""
    by_layer: dict[int, OrderedDict] = {}
    for name, value in state_dict.items():
        head = name.split(".", 1)[0]
        if not head.isdigit():
            raise ValueError(
                f"save_layer_states: {name!r} does not start with a layer index (expected names "
                f"like '5.weight')"
            )
        by_layer.setdefault(int(head), OrderedDict())[name] = value
    os.makedirs(save_dir, exist_ok=True)
    paths = []
    for index in sorted(by_layer):
        paths.append(layer_state_path(save_dir, index))
        serialization.save(by_layer[index], paths[-1])
    return paths


def load_layer_states(load_dir: str) -> "OrderedDict[str, Any]":
    """Every layer file of a pipeline checkpoint merged into one state dict keyed by global
    layer index, ready for a single-process model: ``seq.load_state_dict(load_layer_states(d))``.
    """
    pattern = re.compile(r"layer_(\d+)-model_states\.mgc")
    files = sorted((int(m.group(1)), name) for name in os.listdir(load_dir)
                   if (m := pattern.fullmatch(name)))
    if not files:
        raise FileNotFoundError(f"load_layer_states: no layer_*-model_states.mgc in {load_dir}")
    state: OrderedDict = OrderedDict()
    for _, name in files:
        state.update(serialization.load(os.path.join(load_dir, name)))
    return state
