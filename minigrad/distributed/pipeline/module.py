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

Layer specs and their parameter counts live in :mod:`.specs`, the partition arithmetic in
:mod:`.partition`, the checkpoint files in :mod:`.checkpoint`.

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

import contextlib
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import minigrad.module as M
from minigrad import serialization
from minigrad.autodiff import checkpoint
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.comm.group import get_rank, get_world_size, is_distributed
from minigrad.distributed.mesh.topology import PipeDataParallelTopology, ProcessTopology
from minigrad.distributed.pipeline.checkpoint import (
    layer_state_path,
    load_layer_states,
    save_layer_states,
)
from minigrad.distributed.pipeline.errors import PipelineError
from minigrad.distributed.pipeline.partition import partition_layers
from minigrad.distributed.pipeline.specs import (
    LayerSpec,
    TiedLayerSpec,
    layer_name,
    layer_parameter_count,
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
        self.parts = partition_layers(specs, self.num_stages * self.chunks, partition_method)
        self._layers = _Layers(tuple(specs))
        self._tie_groups = self._find_tie_groups()
        self._chunks = tuple(self._build_chunk(c) for c in range(self.chunks))
        self._engine_bound = False     # see bind_engine: forward only inside engine_step
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
            counts = [layer_parameter_count(self._layers.items[i], build=False)
                      for i in range(start, stop)]
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
    def bind_engine(self) -> None:
        """Mark this stage as driven by a :class:`~minigrad.distributed.pipeline.PipelineEngine`
        (its constructor calls this): from now on the stage runs only inside
        :meth:`engine_step`, i.e. inside the engine's ``train_batch`` and ``eval_batch``."""
        self._engine_bound = True

    @contextlib.contextmanager
    def engine_step(self) -> Iterator[None]:
        """The scope of one engine step (``train_batch``/``eval_batch``): the only place where a
        stage bound to an engine may run its layers."""
        self._engine_running = True
        try:
            yield
        finally:
            self._engine_running = False

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
        who = f"layer {index}" + (f" ({layer_name(layer)})" if layer is not None else "")
        raise TypeError(
            f"PipelineModule: {what} {who} is a {kind}; pipeline layers take and return a "
            f"Tensor or a tuple of Tensors"
        )


def _summarise_names(specs: Sequence) -> str:
    """``"Embedding, Block x3"``: consecutive equal names folded."""
    names: list[list] = []
    for spec in specs:
        name = layer_name(spec)
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
