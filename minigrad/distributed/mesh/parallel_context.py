"""The parallel configuration (Colossal-AI's ``parallel = dict(...)``) and the context it builds.

A job of ``W`` ranks is laid out as data × pipeline × tensor, tensor fastest::

    global rank = data_rank · (pipeline · tensor) + pipeline_rank · tensor + tensor_rank

and the tensor-parallel ranks are laid out further by the mode: a ``q × q`` grid (row, col) for
"2d", ``d × q × q`` (dep, row, col) for "2.5d", ``q × q × q`` (weight, input, output) for "3d".
All of it is one :class:`~minigrad.distributed.mesh.topology.ProcessTopology` whose axes are
``data, pipe`` and the mode's tensor axes, so every group is a slice of one grid (``pipe`` as in
DeepSpeed's topologies, so ``ctx.topology`` can be handed to the pipeline code). Its groups come
from the process-wide table of ``group_for_ranks``: two names whose slices hold the same ranks
(an axis of size 1 between them) are one group, the same object a placement or the pipeline
engine gets for those ranks.

:func:`init_parallel` validates the configuration against the world size *before* any
communication (every rank raises the same error, with the numbers), then creates every group of
the configuration on every rank in one fixed order — creating a group is collective, so doing it
lazily from model code could deadlock when ranks build different layers (pipeline stages).
:func:`get_parallel_context` returns the context afterwards.

Example::

    ctx = dist.init_parallel(dict(pipeline=2, tensor=dict(size=4, mode="2d")))  # 16 ranks: data 2
    ctx.group("2d_row")      # the ranks of my grid row (my row index fixed, columns vary)
    ctx.rank("2d_col")       # my index in my grid column = my row index
    ctx.size("data")         # 2
"""

from __future__ import annotations

import math
import os
import runpy
from dataclasses import dataclass

import numpy as np

from minigrad.backend.device import as_device
from minigrad.distributed.comm.group import Group, get_rank, get_world_size, is_distributed
from minigrad.distributed.mesh.topology import ProcessTopology

__all__ = [
    "MODES",
    "ParallelConfig",
    "ParallelContext",
    "get_parallel_context",
    "init_parallel",
]

MODES = (None, "1d", "2d", "2.5d", "3d", "sequence")
_TOP_KEYS = ("data", "pipeline", "tensor")
_TENSOR_KEYS = ("size", "mode", "depth")


def _size(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"init_parallel: {where} must be a positive integer, got {value!r}")
    return int(value)


def _int_root(n: int, k: int) -> int | None:
    """The integer ``r`` with ``r**k == n``, or None."""
    r = round(n ** (1.0 / k))
    for c in (r - 1, r, r + 1):
        if c >= 1 and c**k == n:
            return c
    return None


@dataclass(frozen=True)
class ParallelConfig:
    """A parallel configuration, checked when made: pipeline size, tensor size, mode and (2.5D)
    depth. Everything that does not need the world size is validated here.

    Build it with :meth:`from_dict` from Colossal-AI's form ``dict(pipeline=2, tensor=dict(size=8,
    mode="2.5d", depth=2))``; every key is optional (sizes default to 1, mode to None). The
    data-parallel size is derived from the world size; ``data`` (Colossal-AI's examples give it)
    is checked against it when given.
    """

    pipeline: int = 1
    tensor: int = 1
    mode: str | None = None
    depth: int = 1
    data: int | None = None

    def __post_init__(self):
        for field, where in (("pipeline", "pipeline size"), ("tensor", "tensor size"),
                             ("depth", "tensor depth")):
            object.__setattr__(self, field, _size(where, getattr(self, field)))
        if self.data is not None:
            object.__setattr__(self, "data", _size("data size", self.data))
        self._check_mode()

    @classmethod
    def from_dict(cls, parallel: dict | None) -> "ParallelConfig":
        """Parse Colossal-AI's dict (``pipeline`` may be a size or ``dict(size=)``)."""
        if parallel is None:
            return cls()
        if isinstance(parallel, ParallelConfig):
            return parallel
        if not isinstance(parallel, dict):
            raise TypeError(
                f"init_parallel: parallel must be a dict like dict(pipeline=2, tensor=dict(size=4, "
                f"mode='2d')), got {type(parallel).__name__}"
            )
        unknown = [k for k in parallel if k not in _TOP_KEYS]
        if unknown:
            raise ValueError(
                f"init_parallel: unknown keys {unknown} in parallel; allowed: {list(_TOP_KEYS)} "
                "(the data-parallel size is derived: world / (pipeline × tensor))"
            )
        pipe, data = parallel.get("pipeline", 1), parallel.get("data")
        for name, value in (("pipeline", pipe), ("data", data)):
            if isinstance(value, dict):
                extra = [k for k in value if k != "size"]
                if extra:
                    raise ValueError(
                        f"init_parallel: unknown keys {extra} in {name}; allowed: ['size']"
                    )
        pipe = pipe.get("size", 1) if isinstance(pipe, dict) else pipe
        data = data.get("size") if isinstance(data, dict) else data
        tensor = parallel.get("tensor", 1)
        if not isinstance(tensor, dict):
            tensor = {"size": tensor}
        extra = [k for k in tensor if k not in _TENSOR_KEYS]
        if extra:
            raise ValueError(
                f"init_parallel: unknown keys {extra} in tensor; allowed: {list(_TENSOR_KEYS)}"
            )
        return cls(pipeline=pipe, tensor=tensor.get("size", 1), mode=tensor.get("mode"),
                   depth=tensor.get("depth", 1), data=data)

    def _check_mode(self) -> None:
        mode, size, depth = self.mode, self.tensor, self.depth
        if mode not in MODES:
            raise ValueError(
                f"init_parallel: unknown tensor parallel mode {mode!r}; allowed: "
                + ", ".join(repr(m) for m in MODES)
            )
        if mode is None and size > 1:
            raise ValueError(
                f"init_parallel: tensor size {size} needs a mode; allowed: "
                + ", ".join(repr(m) for m in MODES[1:])
            )
        if depth != 1 and mode != "2.5d":
            raise ValueError(
                f"init_parallel: depth={depth} is only used by mode '2.5d', got mode {mode!r}"
            )
        if mode == "2d" and _int_root(size, 2) is None:
            lo = math.isqrt(size)
            raise ValueError(
                f"init_parallel: mode '2d' needs a square tensor size q × q, got {size} "
                f"(nearest squares {lo * lo} and {(lo + 1) ** 2})"
            )
        if mode == "2.5d":
            per_layer = size / depth
            if size % depth or _int_root(size // depth, 2) is None:
                raise ValueError(
                    f"init_parallel: mode '2.5d' needs tensor size = q² × depth, got size {size} "
                    f"with depth {depth} ({size} / {depth} = {per_layer:g} is not a square)"
                )
        if mode == "3d" and _int_root(size, 3) is None:
            lo = int(size ** (1 / 3))
            raise ValueError(
                f"init_parallel: mode '3d' needs a cubic tensor size q × q × q, got {size} "
                f"(nearest cubes {lo**3} and {(lo + 1) ** 3})"
            )

    @property
    def side(self) -> int:
        """The grid side q of the 2D/2.5D/3D modes (1 otherwise)."""
        if self.mode == "2d":
            return _int_root(self.tensor, 2)
        if self.mode == "2.5d":
            return _int_root(self.tensor // self.depth, 2)
        if self.mode == "3d":
            return _int_root(self.tensor, 3)
        return 1

    def tensor_axes(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The topology axes of the tensor-parallel ranks (slowest first) and their sizes."""
        q = self.side
        if self.mode == "2d":
            return ("row", "col"), (q, q)
        if self.mode == "2.5d":
            return ("dep", "row", "col"), (self.depth, q, q)
        if self.mode == "3d":
            return ("weight", "input", "output"), (q, q, q)
        if self.mode == "sequence":
            return ("sequence",), (self.tensor,)
        return ("tensor",), (self.tensor,)

    def group_axes(self) -> dict[str, tuple[str, ...]]:
        """Every named group of this configuration and the topology axes it varies.

        A row group holds the ranks of one grid row (row index fixed, column varies), so
        ``"2d_row"`` varies the ``col`` axis, as in Colossal-AI.
        """
        tensor_axes = self.tensor_axes()[0]
        groups = {"data": ("data",), "pipeline": ("pipe",), "tensor": tensor_axes}
        groups.update({
            "1d": {"1d": ("tensor",)},
            "2d": {"2d_row": ("col",), "2d_col": ("row",)},
            "2.5d": {"2.5d_row": ("col",), "2.5d_col": ("row",), "2.5d_dep": ("dep",),
                     "2.5d_col_x_dep": ("dep", "row")},
            "3d": {"3d_input": ("input",), "3d_weight": ("weight",), "3d_output": ("output",),
                   "3d_input_x_weight": ("weight", "input"),
                   "3d_output_x_weight": ("weight", "output")},
            "sequence": {"sequence": ("sequence",), "sequence_dp": ("data", "sequence")},
        }.get(self.mode, {}))
        return groups

    def data_size(self, world_size: int) -> int:
        """The derived data-parallel size; raises when the world does not split evenly or when a
        given ``data`` size disagrees with it."""
        model = self.pipeline * self.tensor
        if world_size % model:
            raise ValueError(
                f"init_parallel: world size {world_size} is not divisible by pipeline size "
                f"{self.pipeline} × tensor size {self.tensor} = {model}"
            )
        derived = world_size // model
        if self.data is not None and self.data != derived:
            raise ValueError(
                f"init_parallel: data size {self.data} does not match the derived data-parallel "
                f"size: world size {world_size} / (pipeline size {self.pipeline} × tensor size "
                f"{self.tensor}) = {derived}"
            )
        return derived


class ParallelContext:
    """Which group is my data / pipeline / tensor / 2d_row ... group: one topology answers all.

    Attributes: ``config`` (:class:`ParallelConfig`), ``mode``, ``data_size``, ``topology`` (the
    :class:`ProcessTopology` with axes ``data, pipe, *tensor axes``), ``coord`` (this rank's
    coordinates on it) and ``activation_layout`` (maintained by
    :mod:`minigrad.distributed.tensor_parallel`: the activation layout the next parallel layer
    built will receive).

    Random streams for dropout: :meth:`rng` ``("replicated")`` draws the same numbers on every
    rank of a tensor-parallel group (for activations every rank holds whole), ``("tensor")``
    different numbers on each (for activations split across them).
    """

    def __init__(self, config: ParallelConfig, seed: int = 1024):
        world, me = get_world_size(), get_rank()
        self.config = config
        self.mode = config.mode
        self.data_size = config.data_size(world)
        tensor_axes, tensor_dims = config.tensor_axes()
        self.topology = ProcessTopology(
            ["data", "pipe", *tensor_axes], [self.data_size, config.pipeline, *tensor_dims]
        )
        self.coord = self.topology.get_coord(me)
        self.seed = int(seed)
        self.activation_layout = None
        self._group_axes = config.group_axes()
        self._groups: dict[str, Group] = {}
        self._names: dict[int, str] = {}
        named_axes: dict[int, int] = {}
        for name, axes in self._group_axes.items():  # the same order on every rank
            group = self.topology.group(*axes)
            self._groups[name] = group
            # a group's name: the one of fewest axes ("2.5d_col" over "2.5d_col_x_dep" when the
            # depth is 1), among those the later (mode-specific) one: "1d" over "tensor"
            if len(axes) <= named_axes.get(id(group), len(axes)):
                self._names[id(group)], named_axes[id(group)] = name, len(axes)
        self._rngs: dict = {}

    # -- groups ------------------------------------------------------------------------------
    @property
    def group_names(self) -> tuple[str, ...]:
        """The names :meth:`group` accepts in this configuration."""
        return tuple(self._groups)

    def group(self, name: str) -> Group:
        """This rank's group called ``name`` (``"data"``, ``"pipeline"``, ``"tensor"``, ``"1d"``,
        ``"2d_row"``, ``"2d_col"``, ``"2.5d_dep"``, ``"3d_input"``, ``"sequence"``, ...)."""
        try:
            return self._groups[name]
        except KeyError:
            raise ValueError(
                f"ParallelContext.group: no group {name!r} with tensor mode {self.mode!r}; "
                f"available: {list(self._groups)}"
            ) from None

    def group_of_axes(self, *axes: str) -> Group:
        """The named group that varies exactly ``axes`` of the topology (any order)."""
        want = set(axes)
        for name, group_axes in self._group_axes.items():
            if set(group_axes) == want:
                return self._groups[name]
        raise ValueError(
            f"ParallelContext.group_of_axes: no group varies exactly {sorted(want)}; groups: "
            f"{self._group_axes}"
        )

    def group_name(self, group: Group) -> str | None:
        """The name of ``group`` if it is one of this context's groups (else None)."""
        return self._names.get(id(group))

    def rank(self, name: str) -> int:
        """This rank's index in its group ``name``."""
        return self.group(name).rank

    def size(self, name: str) -> int:
        """The number of ranks in the group ``name``."""
        return self.group(name).size

    def axis_rank(self, axis: str) -> int:
        """This rank's coordinate on a topology axis (``"row"``, ``"dep"``, ``"input"`` ...)."""
        return getattr(self.coord, axis)

    # -- random streams ----------------------------------------------------------------------
    def rng(self, stream: str, device=None):
        """The generator of ``stream`` ("replicated" or "tensor") on ``device`` (NumPy on the CPU,
        CuPy on a GPU). Seeded from ``seed``, this rank's data and pipeline coordinates and, for
        "tensor", its tensor-parallel rank."""
        if stream not in ("replicated", "tensor"):
            raise ValueError(
                f"ParallelContext.rng: stream must be 'replicated' or 'tensor', got {stream!r}"
            )
        dev = as_device(device)
        key = (stream, dev.kind)
        gen = self._rngs.get(key)
        if gen is None:
            c = self.coord
            entropy = [self.seed, c.data, c.pipe]
            if stream == "tensor":
                entropy.append(1 + self.group("tensor").rank)
            seq = np.random.SeedSequence(entropy)
            if dev.kind == "cpu":
                gen = np.random.default_rng(seq)
            else:
                gen = dev.xp.random.default_rng(int(seq.generate_state(1)[0]))
            self._rngs[key] = gen
        return gen

    def __repr__(self) -> str:
        c = self.config
        mode = "" if c.mode is None else f", mode={c.mode!r}"
        if c.mode in ("2d", "2.5d", "3d"):
            mode += f", q={c.side}" + (f", depth={c.depth}" if c.mode == "2.5d" else "")
        coords = " ".join(f"{a}={v}" for a, v in zip(self.topology.axes, self.coord))
        return (
            f"ParallelContext(world={self.topology.world_size()}, data={self.data_size}, "
            f"pipeline={c.pipeline}, tensor={c.tensor}{mode}; rank {get_rank()}: {coords})"
        )


_CURRENT: list[ParallelContext] = []


def _load_config_file(path) -> dict:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"init_parallel: config file {path!r} does not exist")
    namespace = runpy.run_path(path, run_name="minigrad_parallel_config")
    if "parallel" not in namespace:
        raise ValueError(
            f"init_parallel: config file {path!r} defines no variable `parallel` "
            "(expected e.g. parallel = dict(tensor=dict(size=4, mode='2d')))"
        )
    return namespace["parallel"]


def init_parallel(parallel: dict | ParallelConfig | None = None, *, config=None,
                  seed: int = 1024) -> ParallelContext:
    """Validate a parallel configuration and create its process groups; return the context.

    ``parallel`` is Colossal-AI's dict (``dict(pipeline=2, tensor=dict(size=4, mode="2d"))``);
    ``config`` is instead the path of a Python file that assigns ``parallel = ...`` (run as a
    file, never imported from ``sys.path``). Every key is optional; the data-parallel size is
    world / (pipeline × tensor). Collective: every rank must call it (after
    ``init_process_group``, e.g. inside ``@dist.launcher``); calling it again builds a new context.
    ``seed`` seeds the dropout streams of :meth:`ParallelContext.rng`.

    Example::

        ctx = dist.init_parallel(dict(tensor=dict(size=4, mode="1d")))
    """
    if parallel is not None and config is not None:
        raise ValueError("init_parallel: pass either a parallel dict or config=<file>, not both")
    if config is not None:
        parallel = _load_config_file(config)
    cfg = ParallelConfig.from_dict(parallel)
    world = get_world_size()
    cfg.data_size(world)  # validate against the world before any communication
    if not is_distributed():
        raise RuntimeError(
            "init_parallel needs the process group: call it inside @dist.launcher or after "
            "dist.init_process_group()"
        )
    ctx = ParallelContext(cfg, seed=seed)
    _CURRENT[:] = [ctx]
    return ctx


def get_parallel_context(required: bool = True) -> ParallelContext | None:
    """The context made by the last :func:`init_parallel` (None, or an error when ``required``,
    if there is none)."""
    if _CURRENT:
        return _CURRENT[0]
    if required:
        raise RuntimeError("no parallel context: call dist.init_parallel(...) first")
    return None
