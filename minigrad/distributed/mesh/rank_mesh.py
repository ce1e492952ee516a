"""The rank mesh: global ranks laid out on an N-d grid, and the process groups along its axes.

Every hybrid-parallel mode sees the job's ranks as a grid: DeepSpeed's process topology (axes
``pipe, data, model``), Colossal-AI's parallel context (``data, pipe`` and the tensor axes of its
mode), OneFlow's placements (a nested list of ranks). A :class:`RankMesh` is that grid, once: an
integer array of distinct global ranks whose axes have names, answering

* *where is a rank?* :meth:`RankMesh.coord` and :meth:`RankMesh.rank_at` convert between a rank
  and its index in the array;
* *who shares a slice with it?* :meth:`RankMesh.slices` lists the ranks that differ only along
  some axes (every slice of the grid), :meth:`RankMesh.slice_ranks` the one holding a given rank;
* *which process group is that?* :meth:`RankMesh.group_along` returns a rank's slice as a
  :class:`~minigrad.distributed.comm.group.Group`, asking
  :func:`~minigrad.distributed.comm.group.group_for_ranks` for every slice in one fixed order, so
  every user of the same ranks shares one group (and creating them stays collective).

Ranks are read row-major (the last axis fastest), as NumPy reads ``np.arange(world).reshape(shape)``
-- :meth:`RankMesh.grid` builds exactly that mesh.

Example::

    mesh = RankMesh.grid(("pipe", "data"), (2, 2))   # [[0, 1], [2, 3]]
    mesh.coord(3)                                    # (1, 1)
    mesh.slices("pipe")                              # [[0, 2], [1, 3]]
    mesh.slice_ranks("data", 2)                      # [2, 3]
    dp = mesh.group_along("data")                    # collective on first use
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from minigrad.distributed.comm.group import Group, get_rank, group_for_ranks

__all__ = ["RankMesh"]

Axis = str | int


class RankMesh:
    """Distinct global ranks on an N-d grid with named axes (OneFlow's device mesh, DeepSpeed's
    topology grid).

    ``ranks``: an integer array (or nested list) of distinct non-negative ranks; ``axis_names``:
    one distinct name per dimension (default ``"0"``, ``"1"``, ...). An axis can be given by name
    or by its index wherever one is asked for.
    """

    def __init__(self, ranks, axis_names: Sequence[str] | None = None):
        array = np.asarray(ranks)
        if array.ndim == 0 or array.size == 0 or array.dtype.kind not in "iu":
            raise ValueError(
                f"RankMesh: ranks must be a non-empty (nested) list of ints, got {ranks!r}")
        array = array.astype(np.int64)
        flat = [int(r) for r in array.reshape(-1)]
        if len(set(flat)) != len(flat) or min(flat) < 0:
            raise ValueError(
                f"RankMesh: ranks must be distinct and non-negative, got {array.tolist()}")
        names = [str(d) for d in range(array.ndim)] if axis_names is None else list(axis_names)
        if len(names) != array.ndim or len(set(names)) != len(names) or not all(
                isinstance(n, str) for n in names):
            raise ValueError(
                f"RankMesh: need {array.ndim} distinct axis names for a mesh of shape "
                f"{list(array.shape)}, got {names}")
        array.flags.writeable = False
        self.array = array
        self.axis_names = tuple(names)
        self._flat = flat
        self._position = {r: i for i, r in enumerate(flat)}
        self._key = (self.axis_names, self.shape, tuple(flat))
        self._hash = hash(self._key)

    @classmethod
    def grid(cls, axis_names: Sequence[str], shape: Sequence[int]) -> "RankMesh":
        """The mesh of ranks ``0 .. prod(shape)-1`` in row-major order (DeepSpeed's layout:
        ``rank = sum(coord[i] * prod(shape[i+1:]))``)."""
        return cls(np.arange(math.prod(shape)).reshape(tuple(shape)), axis_names)

    # -- shape ------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The size of every axis."""
        return tuple(self.array.shape)

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return self.array.ndim

    @property
    def size(self) -> int:
        """The number of ranks."""
        return len(self._flat)

    @property
    def ranks(self) -> list[int]:
        """The ranks in row-major order."""
        return list(self._flat)

    def __contains__(self, rank: int) -> bool:
        return rank in self._position

    def axis_index(self, axis: Axis) -> int:
        """The position of ``axis`` (a name or an index) among the mesh's axes."""
        if isinstance(axis, str):
            if axis in self.axis_names:
                return self.axis_names.index(axis)
        elif isinstance(axis, (int, np.integer)) and -self.ndim <= axis < self.ndim:
            return int(axis) % self.ndim
        raise ValueError(
            f"RankMesh: no axis {axis!r}; the axes are {list(self.axis_names)} "
            f"(or indices 0..{self.ndim - 1})")

    # -- ranks and coordinates --------------------------------------------------------------------
    def coord(self, rank: int) -> tuple[int, ...]:
        """The index of ``rank`` in the mesh (one coordinate per axis)."""
        position = self._position.get(rank)
        if position is None:
            raise ValueError(f"RankMesh.coord: rank {rank} is not in the mesh {self.ranks}")
        return tuple(int(i) for i in np.unravel_index(position, self.shape))

    def rank_at(self, coord: Sequence[int]) -> int:
        """The rank at a mesh index (one coordinate per axis)."""
        return int(self.array[tuple(coord)])

    # -- slices -----------------------------------------------------------------------------------
    def slices(self, *axes: Axis) -> list[list[int]]:
        """Every slice of the mesh along ``axes``: the lists of ranks that differ only in those
        coordinates. Slices are ordered row-major by the other (fixed) coordinates, and the ranks
        of a slice row-major over the varying axes taken in mesh order, so along one axis the
        ``i``-th rank of a slice has coordinate ``i`` on it."""
        varying = sorted({self.axis_index(a) for a in axes})
        if not varying:
            raise ValueError(f"RankMesh.slices: name one or more of the axes {self.axis_names}")
        width = math.prod(self.shape[i] for i in varying)
        last = list(range(self.ndim - len(varying), self.ndim))
        moved = np.moveaxis(self.array, varying, last)  # fixed axes first, in order
        return [[int(r) for r in row] for row in moved.reshape(-1, width)]

    def slice_ranks(self, axes: Axis | Sequence[Axis], rank: int) -> list[int]:
        """The slice along ``axes`` (one axis, or several) that holds ``rank``, in the order of
        :meth:`slices`; computed without creating any process group."""
        axes = (axes,) if isinstance(axes, (str, int, np.integer)) else tuple(axes)
        varying = {self.axis_index(a) for a in axes}
        if not varying:
            raise ValueError(
                f"RankMesh.slice_ranks: name one or more of the axes {self.axis_names}")
        index = tuple(slice(None) if i in varying else c for i, c in enumerate(self.coord(rank)))
        return [int(r) for r in self.array[index].reshape(-1)]

    # -- process groups ---------------------------------------------------------------------------
    def group_along(self, *axes: Axis, rank: int | None = None, singletons: bool = True) -> Group:
        """``rank``'s process group along ``axes`` (default: this process's rank).

        Collective: the group of *every* slice is asked for, in :meth:`slices` order, from the
        process-wide table of :func:`~minigrad.distributed.comm.group.group_for_ranks`, so every
        rank of the job must make the same calls in the same order; slices that already have a
        group (made by any user of the same ranks) create nothing. ``singletons=False`` skips the
        slices of one rank and returns None for them.
        """
        mine = None
        me = get_rank() if rank is None else rank
        for ranks in self.slices(*axes):
            group = group_for_ranks(ranks) if singletons or len(ranks) > 1 else None
            if me in ranks:
                mine = group
        return mine

    def group(self, singletons: bool = True) -> Group | None:
        """The process group of all the mesh's ranks (row-major order); collective on first use
        (see :meth:`group_along`). None for a one-rank mesh when ``singletons`` is False."""
        if not singletons and self.size == 1:
            return None
        return group_for_ranks(self._flat)

    # -- identity ---------------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, RankMesh) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"RankMesh({self.array.tolist()}, axis_names={list(self.axis_names)})"
