"""Process topology: the ranks of a job laid out on a grid of named axes, and the groups along them.

Every hybrid-parallel mode asks the same three questions, and this module answers them once:

* *Where am I?* A job of ``W`` ranks is a grid with named axes, e.g. ``("pipe", "data")`` with
  dims ``(2, 4)``. Ranks are numbered row-major — the last axis varies fastest — so here
  ``rank = pipe * 4 + data`` (DeepSpeed's convention). :meth:`ProcessTopology.get_coord` and
  :meth:`ProcessTopology.get_rank` convert between a rank and its coordinates.
* *Who do I talk to along an axis?* The ranks that share all my coordinates except along ``axis``
  form my group along that axis: my data-parallel group, my pipeline, my tensor-parallel group.
  :meth:`ProcessTopology.get_axis_comm_lists` lists every such slice of the grid (several axes may
  vary at once, e.g. the sequence × data group that averages gradients in sequence parallelism).
* *Which process group is that?* :meth:`ProcessTopology.group` returns this rank's slice as a
  :class:`~minigrad.distributed.comm.group.Group`. Creating process groups is collective (every rank
  asks for every slice's group, in the same order), so the first ``group(axis)`` call must be
  made by every rank; the groups live in the process-wide table of ``group_for_ranks``, shared
  with every other user of the same ranks (placements, the parallel context, tie groups).

The grid itself is a :class:`~minigrad.distributed.mesh.rank_mesh.RankMesh` (``topo.mesh``); this
class gives it DeepSpeed's names and keyword coordinates.

Example (axes ``pipe, data, model``, all of size 2, DeepSpeed's layout)::

    topo = ProcessTopology(["pipe", "data", "model"], [2, 2, 2])
    topo.get_rank(pipe=1, data=0, model=1)        # 5
    topo.get_coord(6)                             # ProcessCoord(pipe=1, data=1, model=0)
    topo.get_axis_comm_lists("pipe")              # [[0, 4], [1, 5], [2, 6], [3, 7]]
    topo.filter_match(pipe=0, data=1)             # [2, 3]
    dp_group = topo.group("data")                 # collective on first use
"""

from __future__ import annotations

from collections import namedtuple
from typing import Sequence

from minigrad.distributed.comm.group import Group, get_rank, get_world_size, is_distributed
from minigrad.distributed.mesh.rank_mesh import RankMesh

__all__ = [
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "ProcessTopology",
]


class ProcessTopology:
    """Ranks on a row-major grid of named axes (last axis fastest), with the groups of its slices.

    ``axes`` are distinct names, ``dims`` their sizes (positive integers); the job must have
    ``prod(dims)`` ranks when groups are created. ``mesh`` is the grid as a :class:`RankMesh`.
    """

    def __init__(self, axes: Sequence[str], dims: Sequence[int]):
        axes, dims = list(axes), list(dims)
        if len(axes) != len(dims):
            raise ValueError(
                f"ProcessTopology: got {len(axes)} axes {axes} but {len(dims)} dims {dims}"
            )
        if not axes or len(set(axes)) != len(axes) or not all(isinstance(a, str) for a in axes):
            raise ValueError(f"ProcessTopology: axes must be distinct names, got {axes}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
            raise ValueError(f"ProcessTopology: dims must be positive integers, got {dims}")
        self.axes = axes
        self.dims = dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)
        self.mesh = RankMesh.grid(axes, dims)

    # -- coordinates -------------------------------------------------------------------------
    def world_size(self) -> int:
        """The number of ranks on the grid (the product of the dims)."""
        return self.mesh.size

    def get_axis_names(self) -> list[str]:
        """The axis names, slowest first."""
        return list(self.axes)

    def get_dim(self, axis: str) -> int:
        """The size of ``axis`` (1 for an axis the topology does not have, as DeepSpeed does)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 1

    def get_rank(self, **coords: int) -> int:
        """The rank at the given coordinates; every axis must be given, each within its dim."""
        if set(coords) != set(self.axes):
            raise ValueError(
                f"ProcessTopology.get_rank: expected coordinates for axes {self.axes}, "
                f"got {sorted(coords)}"
            )
        for axis, dim in zip(self.axes, self.dims):
            c = coords[axis]
            if not 0 <= c < dim:
                raise ValueError(
                    f"ProcessTopology.get_rank: {axis}={c} is outside [0, {dim})"
                )
        return self.mesh.rank_at([coords[axis] for axis in self.axes])

    def get_coord(self, rank: int):
        """The coordinates (a named tuple ``ProcessCoord``) of ``rank``."""
        self._check_rank("get_coord", rank)
        return self.ProcessCoord(*self.mesh.coord(rank))

    def get_rank_repr(
        self, rank: int, omit_axes: Sequence[str] = ("data", "pipe"), inner_sep: str = "_",
        outer_sep: str = "-",
    ) -> str:
        """A file-name-friendly label of ``rank``'s coordinates, e.g. ``"model_01"``; axes in
        ``omit_axes`` are left out (checkpoint names that do not depend on the data/pipe sizes)."""
        coord = self.get_coord(rank)
        return outer_sep.join(
            f"{axis}{inner_sep}{getattr(coord, axis):02d}"
            for axis in self.axes if axis not in omit_axes
        )

    def filter_match(self, **coords: int) -> list[int]:
        """All ranks whose coordinates equal the given ones (unnamed axes are free), ascending."""
        unknown = set(coords) - set(self.axes)
        if unknown:
            raise ValueError(
                f"ProcessTopology.filter_match: unknown axes {sorted(unknown)}, have {self.axes}"
            )
        return [
            r for r in self.mesh.ranks
            if all(getattr(self.get_coord(r), a) == c for a, c in coords.items())
        ]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """The ranks whose coordinate along ``axis`` is ``idx``."""
        return self.filter_match(**{axis: idx})

    def get_axis_comm_lists(self, *axes: str) -> list[list[int]]:
        """Every slice of the grid along ``axes``: the groups of ranks that differ only in those
        coordinates. Slices are ordered by the fixed coordinates (row-major), and the ranks within
        a slice row-major over the varying axes — so group rank ``i`` along a single axis has
        coordinate ``i`` on it. An axis the topology does not have gives ``[]``, as in DeepSpeed
        (``get_axis_comm_lists("model")`` of a pipe x data topology)."""
        if axes and any(a not in self.axes for a in axes):
            return []
        self._check_axes("get_axis_comm_lists", axes)
        return self.mesh.slices(*axes)

    # -- process groups ----------------------------------------------------------------------
    def group(self, *axes: str) -> Group:
        """This rank's process group along ``axes`` (its slice of the grid).

        Collective on the first call for a given set of axes: every rank of the job must make the
        same first calls in the same order, because each slice's group is created by all ranks.
        Later calls (and every other user of the same ranks) get the same group from the
        process-wide table (``group_for_ranks``) and create nothing.
        """
        self._check_axes("group", axes)
        world = get_world_size()
        if not is_distributed() or world != self.world_size():
            raise RuntimeError(
                f"ProcessTopology.group: the topology {self._shape()} needs {self.world_size()} "
                f"ranks, but the job has {world}"
                + ("" if is_distributed() else " (init_process_group has not run)")
            )
        return self.mesh.group_along(*axes)

    def group_ranks(self, *axes: str, rank: int | None = None) -> list[int]:
        """The global ranks of ``rank``'s slice along ``axes`` (default: this process's rank),
        without creating any process group."""
        self._check_axes("group_ranks", axes)
        me = get_rank() if rank is None else rank
        self._check_rank("group_ranks", me)
        return self.mesh.slice_ranks(axes, me)

    # -- helpers -----------------------------------------------------------------------------
    def _shape(self) -> str:
        return "x".join(f"{a}={d}" for a, d in zip(self.axes, self.dims))

    def _check_rank(self, op: str, rank: int) -> None:
        if not 0 <= rank < self.world_size():
            raise ValueError(
                f"ProcessTopology.{op}: rank {rank} is outside [0, {self.world_size()}) for "
                f"{self._shape()}"
            )

    def _check_axes(self, op: str, axes: Sequence[str]) -> None:
        unknown = [a for a in axes if a not in self.axes]
        if not axes or unknown:
            raise ValueError(
                f"ProcessTopology.{op}: expected one or more of the axes {self.axes}, got "
                f"{list(axes)}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._shape()}, world_size={self.world_size()})"


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline × data parallelism: axes ``("pipe", "data")``, so ``rank = stage * num_dp +
    replica`` and the ranks of one data-parallel group are consecutive."""

    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(["pipe", "data"], [num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline × data × model (tensor) parallelism: axes ``("pipe", "data", "model")``, model
    fastest, so the ranks of one tensor-parallel group are consecutive."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(["pipe", "data", "model"], [num_pp, num_dp, num_mp])
