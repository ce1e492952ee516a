"""DeepSpeed's ``PipelineParallelGrid``: this rank's place in a pipe x data (x model) topology,
and the process groups of each kind of parallelism, under DeepSpeed's method names.

It is the ``mpu`` object DeepSpeed code passes around: ``get_data_parallel_group()`` for gradient
reduction, ``get_pipe_parallel_rank()`` (the stage), ``stage_to_global(stage)`` (the rank holding
another stage of this rank's pipeline), ``get_slice_parallel_*`` (Megatron-style tensor slicing,
the ``model`` axis). Every rank of the job must construct it at the same point of the program:
creating the groups is collective.

Without a topology, the world size is split into pipe x data from its prime factors, alternately
(12 ranks: pipe 2 * 3 = 6, data 2), as DeepSpeed does.

Example::

    grid = PipelineParallelGrid(PipeDataParallelTopology(num_pp=2, num_dp=2))
    grid.get_stage_id(), grid.get_data_parallel_world_size()     # e.g. (1, 2) on rank 2
"""

from __future__ import annotations

from minigrad.distributed.comm.group import Group, get_rank, get_world_size, new_group
from minigrad.distributed.mesh.topology import PipeDataParallelTopology, ProcessTopology

__all__ = ["PipelineParallelGrid"]


def _prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


class PipelineParallelGrid:
    """This rank's coordinates and process groups in ``topology`` (see the module docstring)."""

    def __init__(self, topology: ProcessTopology | None = None, process_group=None) -> None:
        self.global_rank, self.world_size = get_rank(), get_world_size()
        if topology is None:
            pipe = data = 1
            for i, prime in enumerate(_prime_factors(self.world_size)):
                if i % 2 == 0:
                    pipe *= prime
                else:
                    data *= prime
            topology = PipeDataParallelTopology(num_pp=pipe, num_dp=data)
        if topology.world_size() != self.world_size:
            raise ValueError(
                f"PipelineParallelGrid: the topology {topology} has {topology.world_size()} "
                f"ranks, the job {self.world_size}"
            )
        self._topo = topology
        self.data_parallel_size = topology.get_dim("data")
        self.pipe_parallel_size = topology.get_dim("pipe")
        self.model_parallel_size = topology.get_dim("model")
        self.slice_parallel_size = self.model_parallel_size
        coord = topology.get_coord(self.global_rank)
        self.stage_id = getattr(coord, "pipe", 0)
        self.data_parallel_id = getattr(coord, "data", 0)
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
        axes = topology.get_axis_names()
        # the groups, made in the same order on every rank (collective)
        self.dp_proc_group = self._group("data")
        self.dp_group = self.dp_proc_group.ranks
        self.pp_proc_group = self._group("pipe")
        self.pp_group = self.pp_proc_group.ranks
        model_axes = [a for a in ("pipe", "model") if a in axes]  # all but data: one model copy
        self.ds_model_proc_group = self._group(*model_axes)
        self.ds_model_rank = self.ds_model_proc_group.rank
        self.ds_model_world_size = self.ds_model_proc_group.size
        if "model" in axes:
            self.slice_proc_group = topology.group("model")
        else:
            self.slice_proc_group = None
            for r in range(self.world_size):  # every rank its own slice, created by all
                group = new_group([r])
                if r == self.global_rank:
                    self.slice_proc_group = group
        self.slice_group = self.slice_proc_group.ranks
        self.p2p_groups = self._p2p_lists()

    def _group(self, *axes: str) -> Group:
        if any(a not in self._topo.get_axis_names() for a in axes):  # an axis of size 1
            group = None
            for r in range(self.world_size):
                made = new_group([r])
                if r == self.global_rank:
                    group = made
            return group
        return self._topo.group(*axes)

    def _p2p_lists(self) -> list[list[int]]:
        """``[rank, next stage's rank]`` for every rank (the last stage wraps to the first)."""
        pairs = []
        for rank in range(self.world_size):
            ranks = self._topo.group_ranks("pipe", rank=rank)
            pairs.append([rank, ranks[(ranks.index(rank) + 1) % len(ranks)]])
        return pairs

    def topology(self) -> ProcessTopology:
        """The topology the grid was made from."""
        return self._topo

    def stage_to_global(self, stage_id: int, **coords: int) -> int:
        """The global rank of ``stage_id`` in this rank's pipeline (other coordinates as given,
        else this rank's)."""
        mine = self._topo.get_coord(self.global_rank)._asdict()
        mine.update(pipe=stage_id, **coords)
        return self._topo.get_rank(**mine)

    def get_stage_id(self) -> int:
        """This rank's pipeline stage."""
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        """This rank's data-parallel replica index."""
        return self.data_parallel_id

    def get_global_rank(self) -> int:
        """This rank in the job."""
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        """This rank's stage (its rank in the pipeline group)."""
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        """The number of stages."""
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self) -> Group:
        """The ranks of this rank's pipeline, by stage."""
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        """This rank's replica index (its rank in the data-parallel group)."""
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        """The number of data-parallel replicas."""
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Group:
        """The ranks holding the same part of the model: gradients are averaged over it."""
        return self.dp_proc_group

    def get_model_parallel_rank(self) -> int:
        """This rank's index among the ranks of one model copy (all its stages and slices)."""
        return self.ds_model_rank

    def get_model_parallel_world_size(self) -> int:
        """How many ranks hold one copy of the model (stages x slices)."""
        return self.ds_model_world_size

    def get_model_parallel_group(self) -> Group:
        """The ranks of one model copy (DeepSpeed's overflow checks reduce over it)."""
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self) -> int:
        """This rank's tensor-slice index (0 without a ``model`` axis)."""
        coord = self._topo.get_coord(self.global_rank)
        return getattr(coord, "model", 0)

    def get_slice_parallel_world_size(self) -> int:
        """The number of tensor slices (the ``model`` axis' size)."""
        return self.slice_parallel_size

    def get_slice_parallel_group(self) -> Group:
        """The ranks sharing this rank's tensor-sliced layers."""
        return self.slice_proc_group
