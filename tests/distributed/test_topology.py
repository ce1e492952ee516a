"""ProcessTopology: rank <-> coordinate maps, slices along axes, and the groups built from them."""

import itertools

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.mesh.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)
from minigrad.testing.distributed import run_workers


def test_row_major_last_axis_fastest():
    topo = ProcessTopology(["x", "y"], [2, 3])
    assert topo.get_rank(x=0, y=1) == 1
    assert topo.get_rank(x=1, y=0) == 3
    assert [tuple(topo.get_coord(r)) for r in range(6)] == list(
        itertools.product(range(2), range(3))
    )


def test_deepspeed_pipe_data_model_layout():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_names() == ["pipe", "data", "model"]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.filter_match(pipe=0, data=1) == [2, 3]
    assert topo.get_axis_list("pipe", 1) == [4, 5, 6, 7]
    assert topo.get_coord(6) == topo.ProcessCoord(pipe=1, data=1, model=0)
    assert topo.get_rank_repr(5) == "model_01"


def test_pipe_data_rank_is_stage_times_replicas_plus_replica():
    topo = PipeDataParallelTopology(num_pp=3, num_dp=2)
    for stage, replica in itertools.product(range(3), range(2)):
        assert topo.get_rank(pipe=stage, data=replica) == stage * 2 + replica
    assert topo.get_axis_comm_lists("data") == [[0, 1], [2, 3], [4, 5]]
    assert topo.get_dim("model") == 1


@pytest.mark.parametrize("dims", [[2, 3, 2], [1, 4, 2], [3, 1, 1]])
def test_slices_partition_the_grid_and_vary_only_their_axes(dims):
    topo = ProcessTopology(["a", "b", "c"], dims)
    for axes in [("a",), ("b",), ("c",), ("a", "c"), ("b", "a"), ("a", "b", "c")]:
        lists = topo.get_axis_comm_lists(*axes)
        assert sorted(r for ranks in lists for r in ranks) == list(range(topo.world_size()))
        for ranks in lists:
            coords = [topo.get_coord(r) for r in ranks]
            for axis in set(topo.axes) - set(axes):
                assert len({getattr(c, axis) for c in coords}) == 1
            assert len(ranks) == int(np.prod([topo.get_dim(a) for a in axes]))
            assert topo.group_ranks(*axes, rank=ranks[-1]) == ranks


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="2 axes"):
        ProcessTopology(["a", "b"], [2])
    with pytest.raises(ValueError, match="distinct"):
        ProcessTopology(["a", "a"], [2, 2])
    with pytest.raises(ValueError, match="positive integers"):
        ProcessTopology(["a"], [0])
    topo = ProcessTopology(["pipe", "data"], [2, 2])
    with pytest.raises(ValueError, match=r"expected coordinates for axes \['pipe', 'data'\]"):
        topo.get_rank(pipe=0)
    with pytest.raises(ValueError, match=r"data=2 is outside \[0, 2\)"):
        topo.get_rank(pipe=0, data=2)
    with pytest.raises(ValueError, match=r"rank 4 is outside \[0, 4\)"):
        topo.get_coord(4)
    with pytest.raises(ValueError, match="unknown axes"):
        topo.filter_match(model=0)
    assert topo.get_axis_comm_lists("model") == []  # DeepSpeed: an unknown axis has no lists
    with pytest.raises(ValueError, match="expected one or more of the axes"):
        topo.group_ranks("model", rank=0)
    with pytest.raises(ValueError, match="expected one or more of the axes"):
        topo.get_axis_comm_lists()
    with pytest.raises(RuntimeError, match="needs 4 ranks"):
        topo.group("data")


def _reduce_along_groups():
    topo = ProcessTopology(["pipe", "data", "model"], [2, 1, 2])
    rank = dist.get_rank()
    x = np.array([float(rank)])
    out = {}
    for axes in [("pipe",), ("model",), ("pipe", "model")]:
        g = topo.group(*axes)
        out[axes] = (g.ranks, comm.all_reduce(x.copy(), group=g)[0])
    assert topo.group("model") is topo.group("model")  # cached, no new collective
    return out


def test_groups_reduce_only_within_their_slice():
    results = run_workers(_reduce_along_groups, 4)
    topo = ProcessTopology(["pipe", "data", "model"], [2, 1, 2])
    for rank, out in enumerate(results):
        for axes, (ranks, total) in out.items():
            assert ranks == topo.group_ranks(*axes, rank=rank)
            assert total == sum(ranks)


def _wrong_world():
    ProcessTopology(["pipe", "data"], [3, 1]).group("pipe")


def test_group_on_a_job_of_the_wrong_size_raises_on_every_rank():
    with pytest.raises(dist.LaunchError, match="needs 3 ranks, but the job has 2"):
        run_workers(_wrong_world, 2)


def _grid_facts(topology_args):
    from minigrad.distributed.pipeline import PipelineParallelGrid

    topo = None if topology_args is None else ProcessTopology(*topology_args)
    grid = PipelineParallelGrid(topo)
    x = np.array([float(dist.get_rank())])
    return {
        "stage": grid.get_stage_id(), "dp_id": grid.get_data_parallel_id(),
        "first": grid.is_first_stage, "last": grid.is_last_stage,
        "sizes": (grid.get_pipe_parallel_world_size(), grid.get_data_parallel_world_size(),
                  grid.get_slice_parallel_world_size(), grid.get_model_parallel_world_size()),
        "dp_ranks": grid.get_data_parallel_group().ranks,
        "pp_ranks": grid.get_pipe_parallel_group().ranks,
        "model_ranks": grid.get_model_parallel_group().ranks,
        "slice": (grid.get_slice_parallel_rank(), grid.get_slice_parallel_group().ranks),
        "next": grid.stage_to_global((grid.get_stage_id() + 1) % grid.pipe_parallel_size),
        "p2p": grid.p2p_groups,
        "dp_sum": comm.all_reduce(x.copy(), group=grid.get_data_parallel_group())[0],
    }


def test_pipeline_parallel_grid_pipe_data():
    """DeepSpeed's PipelineParallelGrid on pipe=2 x data=2: rank = stage * 2 + replica."""
    out = run_workers(_grid_facts, 4, (["pipe", "data"], [2, 2]))
    for rank, f in enumerate(out):
        stage, replica = divmod(rank, 2)
        assert (f["stage"], f["dp_id"]) == (stage, replica)
        assert (f["first"], f["last"]) == (stage == 0, stage == 1)
        assert f["sizes"] == (2, 2, 1, 2)
        assert f["dp_ranks"] == [2 * stage, 2 * stage + 1]
        assert f["pp_ranks"] == [replica, 2 + replica] == f["model_ranks"]
        assert f["slice"] == (0, [rank])
        assert f["next"] == (rank + 2) % 4
        assert f["p2p"] == [[0, 2], [1, 3], [2, 0], [3, 1]]
        assert f["dp_sum"] == 4 * stage + 1


def test_pipeline_parallel_grid_default_topology_and_model_axis():
    # no topology: 4 ranks = primes 2, 2 -> pipe 2, data 2
    assert [f["stage"] for f in run_workers(_grid_facts, 4, None)] == [0, 0, 1, 1]
    out = run_workers(_grid_facts, 4, (["pipe", "data", "model"], [2, 1, 2]))
    for rank, f in enumerate(out):
        assert f["sizes"] == (2, 1, 2, 4)
        assert f["slice"] == (rank % 2, [rank - rank % 2, rank - rank % 2 + 1])
        assert f["model_ranks"] == [0, 1, 2, 3] and f["dp_ranks"] == [rank]
