"""``placement``: the devices a global tensor lives on, as a mesh of ranks.

``mg.placement("cpu", [0, 1])`` is a 1-D mesh of two ranks; ``mg.placement("cpu", [[0, 1], [2,
3]])`` a 2 x 2 mesh, whose dimension 0 runs down the columns (ranks 0 and 2 differ only in it) and
dimension 1 along the rows. A global tensor has one SBP per mesh dimension.

The rank array is a :class:`~minigrad.distributed.mesh.rank_mesh.RankMesh` (``P.mesh``), which
answers the coordinate questions. The process groups a placement needs (one per slice of the mesh
along each dimension) are created when the placement is: creating a group is collective, so every
rank must create the same placements in the same order, like every global op. The groups come from
the process-wide table of ``group_for_ranks``, so equal placements (and any other user of the same
ranks in the same order: a process topology, the parallel context) share them. When the
program was started by ``python -m minigrad.distributed.launch`` and the process group does not
exist yet, the first placement creates it (OneFlow programs never call ``init_process_group``).

A placement is also the object through which ``Tensor.to_global``, ``Module.to_global`` and the
creation functions' ``placement=`` argument reach this package (``to_global`` and ``make_global``).

Example::

    P = mg.placement("cpu", [[0, 1], [2, 3]])
    P.mesh_shape        # (2, 2)
    P.slice_ranks(0, 3) # [1, 3]: rank 3's column (mesh dimension 0)
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from minigrad.backend import is_cuda_available
from minigrad.distributed.comm import group as dist_group
from minigrad.distributed.global_tensor import tensor as global_tensor
from minigrad.distributed.mesh.rank_mesh import RankMesh

__all__ = ["Placement", "placement"]

_TYPES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


_NO_GPU_NOTED = [False]  # the "cuda placement on a machine without GPUs" warning, once


def _note_cuda_without_gpus() -> None:
    """A ``"cuda"`` placement on a machine without CUDA runs on the CPU (the tensors live on each
    rank's own device, as the launcher's ranks do): say so once per process."""
    if not _NO_GPU_NOTED[0] and not is_cuda_available():
        _NO_GPU_NOTED[0] = True
        warnings.warn('placement("cuda", ...): this machine has no usable CUDA device, so the '
                      "global tensors of cuda placements live on the CPU", UserWarning,
                      stacklevel=3)


def _ensure_process_group() -> None:
    """Start the process group of a launched program that has not started it itself."""
    if not dist_group.is_distributed() and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist_group.init_process_group()


class Placement:
    """A device type and a mesh of global ranks (OneFlow's ``flow.placement``).

    ``type`` is "cpu" or "cuda" (alias "gpu"); ``ranks`` a list of ranks or a nested list (an
    N-d device mesh). Two placements are equal when their type and rank arrays are equal.

    Example::

        mg.placement("cpu", ranks=[0, 1])   # placement(type="cpu", ranks=[0, 1])
    """

    def __init__(self, type: str, ranks):  # noqa: A002  (OneFlow's argument name)
        if type not in _TYPES:
            raise ValueError(f"placement: type must be 'cpu' or 'cuda' (or 'gpu'), got {type!r}")
        mesh = np.asarray(ranks)
        if mesh.size == 0 or mesh.dtype.kind not in "iu" or mesh.ndim == 0:
            raise ValueError(
                f"placement: ranks must be a non-empty list (or nested list) of ints, got {ranks!r}"
            )
        flat = [int(r) for r in mesh.reshape(-1)]
        _ensure_process_group()
        world = dist_group.get_world_size()
        if len(set(flat)) != len(flat) or not all(0 <= r < world for r in flat):
            raise ValueError(
                f"placement: ranks must be distinct and in [0, {world}) (the job has {world} "
                f"rank(s)), got {mesh.tolist()}"
            )
        self.type = _TYPES[type]
        if self.type == "cuda":
            _note_cuda_without_gpus()
        self.mesh = RankMesh(mesh)
        self._create_groups()

    # -- the mesh -------------------------------------------------------------------------------
    @property
    def ranks(self) -> list:
        """The rank mesh as a (nested) list."""
        return self.mesh.array.tolist()

    @property
    def mesh_shape(self) -> tuple:
        """The shape of the rank mesh (OneFlow's ``hierarchy``)."""
        return self.mesh.shape

    @property
    def ndim(self) -> int:
        """The number of mesh dimensions (= entries of an SBP tuple on this placement)."""
        return self.mesh.ndim

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self.mesh.size

    @property
    def rank_list(self) -> list:
        """The ranks in row-major mesh order (the first is the placement's *first rank*)."""
        return self.mesh.ranks

    def __contains__(self, rank: int) -> bool:
        return rank in self.mesh

    def coord(self, rank: int) -> tuple:
        """The mesh coordinate of ``rank`` (which must be in the placement)."""
        return self.mesh.coord(rank)

    def rank_at(self, coord) -> int:
        """The rank at a mesh coordinate."""
        return self.mesh.rank_at(coord)

    def slice_ranks(self, dim: int, rank: int) -> list:
        """The ranks that share every mesh coordinate of ``rank`` except along ``dim``, in order
        along ``dim``: ``rank``'s group for SBP conversions on that mesh dimension."""
        return self.mesh.slice_ranks(dim, rank)

    def slice_group(self, dim: int, rank: int):
        """The process group of ``slice_ranks(dim, rank)`` (None for a single rank)."""
        ranks = self.slice_ranks(dim, rank)
        return None if len(ranks) == 1 else dist_group.group_for_ranks(ranks)

    def group(self):
        """The process group of all the placement's ranks (None for a single rank)."""
        return self.mesh.group(singletons=False)

    def _create_groups(self) -> None:
        """Create the groups of the whole placement and of every mesh slice, in one fixed order
        on every rank (creating a group is collective; groups that exist are reused)."""
        if not dist_group.is_distributed():
            return
        self.mesh.group(singletons=False)
        for dim in range(self.ndim):
            self.mesh.group_along(dim, singletons=False)

    # -- identity -------------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        return isinstance(other, Placement) and self.type == other.type and self.mesh == other.mesh

    def __hash__(self) -> int:
        return hash((self.type, self.mesh))

    def __repr__(self) -> str:
        return f'placement(type="{self.type}", ranks={self.ranks})'

    # -- the protocol of Tensor.to_global, Module.to_global and placement= ----------------------
    def to_global(self, tensor, sbp, *, grad_sbp=None, check_meta: bool = True,
                  copy: bool = False):
        """``tensor.to_global(self, sbp, ...)`` for a local tensor (see ``Tensor.to_global``)."""
        return global_tensor.local_to_global(tensor, self, sbp, grad_sbp=grad_sbp,
                                             check_meta=check_meta, copy=copy)

    def make_global(self, tensor, sbp, *, logical: bool):
        """Turn ``tensor`` itself into a global tensor on this placement (not differentiable):
        ``logical=True`` when it holds the whole logical value on every rank (creation
        functions: each rank keeps its piece), ``logical=False`` when it is this rank's piece
        (``Module.to_global``; a global tensor is redistributed)."""
        return global_tensor.make_global(tensor, self, sbp, logical=logical)


placement = Placement  # OneFlow's spelling: ``flow.placement(type, ranks)``
