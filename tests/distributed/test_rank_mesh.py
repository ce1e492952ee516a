"""RankMesh: coordinates and slices against a NumPy reference, the groups along its axes, and one
process-wide group table shared by the topology, placements and the parallel context."""

import itertools

import numpy as np
import pytest

import minigrad as mg
import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.comm.group import group_for_ranks
from minigrad.distributed.mesh.rank_mesh import RankMesh
from minigrad.distributed.mesh.topology import ProcessTopology
from minigrad.testing.distributed import run_workers

SHAPES = [(6,), (2, 3), (2, 1, 3), (3, 2, 2)]


def _reference_slices(ref: np.ndarray, varying: set) -> list[list[int]]:
    """Every slice of ``ref`` along the ``varying`` dimensions, by brute force over all indices:
    slices ordered by the fixed coordinates, ranks by the varying ones (both lexicographic)."""
    by_fixed: dict = {}
    for index in itertools.product(*(range(n) for n in ref.shape)):
        fixed = tuple(c for d, c in enumerate(index) if d not in varying)
        moving = tuple(c for d, c in enumerate(index) if d in varying)
        by_fixed.setdefault(fixed, []).append((moving, int(ref[index])))
    return [[r for _, r in sorted(by_fixed[f])] for f in sorted(by_fixed)]


def _all_axis_sets(ndim: int):
    for k in range(1, ndim + 1):
        yield from itertools.combinations(range(ndim), k)


@pytest.mark.parametrize("shape", SHAPES)
def test_grid_coords_are_numpys_row_major_layout(shape):
    ref = np.arange(int(np.prod(shape))).reshape(shape)
    names = [f"ax{d}" for d in range(len(shape))]
    mesh = RankMesh.grid(names, shape)
    assert mesh.shape == shape and mesh.size == ref.size and mesh.ranks == list(range(ref.size))
    for rank in range(ref.size):
        expected = tuple(int(i) for i in np.argwhere(ref == rank)[0])
        assert mesh.coord(rank) == expected
        assert mesh.rank_at(expected) == rank


@pytest.mark.parametrize("shape", SHAPES)
def test_slices_of_a_shuffled_mesh_match_the_reference(shape):
    ref = np.random.default_rng(sum(shape)).permutation(int(np.prod(shape)) + 3)[
        : int(np.prod(shape))].reshape(shape)
    mesh = RankMesh(ref.tolist())
    for rank in ref.reshape(-1):
        coord = tuple(int(i) for i in np.argwhere(ref == rank)[0])
        assert mesh.coord(int(rank)) == coord and mesh.rank_at(coord) == rank
    for axes in _all_axis_sets(len(shape)):
        expected = _reference_slices(ref, set(axes))
        assert mesh.slices(*axes) == expected
        assert mesh.slices(*reversed(axes)) == expected  # the axes' order in the call is moot
        for ranks in expected:
            for rank in ranks:
                assert mesh.slice_ranks(axes, rank) == ranks


def test_axes_by_name_or_index():
    mesh = RankMesh([[3, 1, 4], [0, 5, 2]], axis_names=["row", "col"])
    assert mesh.slices("row") == mesh.slices(0) == mesh.slices(-2) == [[3, 0], [1, 5], [4, 2]]
    assert mesh.slices("col") == [[3, 1, 4], [0, 5, 2]]
    assert mesh.slice_ranks("col", 5) == [0, 5, 2]
    assert mesh.slice_ranks(["row", "col"], 5) == [3, 1, 4, 0, 5, 2]
    assert 4 in mesh and 6 not in mesh
    assert mesh == RankMesh(np.array([[3, 1, 4], [0, 5, 2]]), ("row", "col"))
    assert mesh != RankMesh([[3, 1, 4], [0, 5, 2]])  # other axis names
    assert len({mesh, RankMesh([[3, 1, 4], [0, 5, 2]], ("row", "col"))}) == 1


def test_bad_meshes_and_axes_name_the_problem():
    with pytest.raises(ValueError, match="distinct and non-negative"):
        RankMesh([0, 1, 1])
    with pytest.raises(ValueError, match="non-empty"):
        RankMesh([])
    with pytest.raises(ValueError, match="need 2 distinct axis names"):
        RankMesh([[0, 1]], axis_names=["x"])
    mesh = RankMesh.grid(["pipe", "data"], [2, 2])
    with pytest.raises(ValueError, match=r"no axis 'model'; the axes are \['pipe', 'data'\]"):
        mesh.slices("model")
    with pytest.raises(ValueError, match="no axis 2"):
        mesh.slices(2)
    with pytest.raises(ValueError, match=r"rank 7 is not in the mesh \[0, 1, 2, 3\]"):
        mesh.coord(7)


def _groups_along_axes():
    me = dist.get_rank()
    mesh = RankMesh.grid(["a", "b"], [2, 2])
    out = {}
    for axes in [("a",), ("b",), ("a", "b")]:
        group = mesh.group_along(*axes)
        out[axes] = (group.ranks, float(comm.all_reduce(np.array([me + 1.0]), group=group)[0]))
    return out


def test_groups_along_axes_reduce_within_their_slice():
    results = run_workers(_groups_along_axes, 4)
    ref = np.arange(4).reshape(2, 2)
    for rank, out in enumerate(results):
        for axes, (ranks, total) in out.items():
            expected = next(s for s in _reference_slices(ref, {"ab".index(a) for a in axes})
                            if rank in s)
            assert ranks == expected
            assert total == sum(r + 1 for r in expected)


def _one_group_per_rank_list():
    """Every user of the same ranks (in the same order) gets the same Group object."""
    me = dist.get_rank()
    topo = ProcessTopology(["pipe", "data"], [2, 2])              # rank = 2 pipe + data
    pl = mg.placement("cpu", [[0, 1], [2, 3]])
    ctx = dist.init_parallel(dict(pipeline=2))                    # rank = 2 data + pipe
    rows, cols = topo.group("data"), topo.group("pipe")           # [0, 1] | [2, 3], [0, 2] | ...
    same = {
        "rows": [rows, ctx.group("pipeline"), pl.slice_group(1, me),
                 RankMesh([[0, 1], [2, 3]]).group_along(1), group_for_ranks(rows.ranks)],
        "cols": [cols, ctx.group("data"), pl.slice_group(0, me), topo.mesh.group_along("pipe"),
                 group_for_ranks(cols.ranks)],
        "all": [pl.group(), topo.group("pipe", "data"), group_for_ranks([0, 1, 2, 3])],
    }
    identical = {k: all(g is groups[0] for g in groups) for k, groups in same.items()}
    reversed_all = group_for_ranks([3, 2, 1, 0])                   # another order: another group
    root_value = comm.broadcast(np.array([float(me)]), group=reversed_all)[0]
    ctx25 = dist.init_parallel(dict(tensor=dict(size=4, mode="2.5d", depth=1)))
    col, col_x_dep = ctx25.group("2.5d_col"), ctx25.group("2.5d_col_x_dep")
    return dict(
        identical=identical, rows=rows.ranks, cols=cols.ranks,
        distinct_order=reversed_all is not same["all"][0], root=reversed_all.root,
        root_value=float(root_value),
        depth1=(col is col_x_dep, ctx25.group_name(col), ctx25.group_name(ctx25.group("2.5d_row"))),
    )


def test_the_same_ranks_give_the_same_group_to_every_user():
    results = run_workers(_one_group_per_rank_list, 4)
    for rank, out in enumerate(results):
        assert out["identical"] == {"rows": True, "cols": True, "all": True}
        assert out["rows"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert out["cols"] == [rank % 2, rank % 2 + 2]
        assert out["distinct_order"] and out["root"] == 3 and out["root_value"] == 3.0
        # depth 1: the column group is also the column × depth group; named by fewer axes
        assert out["depth1"] == (True, "2.5d_col", "2.5d_row")


def _groups_of_a_new_session():
    topo = ProcessTopology(["x"], [2])
    before = topo.group("x")
    dist.destroy_process_group()
    dist.init_process_group()
    after = topo.group("x")  # the old session's group is closed: a new one, in the new table
    total = comm.all_reduce(np.array([dist.get_rank() + 1.0]), group=after)[0]
    return after is not before, after is group_for_ranks([0, 1]), float(total)


def test_a_new_session_starts_an_empty_group_table():
    for fresh, shared, total in run_workers(_groups_of_a_new_session, 2):
        assert fresh and shared and total == 3.0
