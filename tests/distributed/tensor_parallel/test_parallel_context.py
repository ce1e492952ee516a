"""dist.init_parallel: configuration, validation before any communication, groups, rank layout."""

import itertools
import sys
import time

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.mesh.parallel_context import ParallelConfig
from minigrad.testing.distributed import run_workers


def test_every_key_is_optional_and_data_is_derived():
    cfg = ParallelConfig.from_dict({})
    assert (cfg.pipeline, cfg.tensor, cfg.mode, cfg.depth) == (1, 1, None, 1)
    assert cfg.data_size(6) == 6
    cfg = ParallelConfig.from_dict(dict(pipeline=dict(size=2), tensor=dict(size=4, mode="2d")))
    assert (cfg.pipeline, cfg.tensor, cfg.mode, cfg.side) == (2, 4, "2d", 2)
    assert cfg.data_size(16) == 2
    # Colossal-AI's examples state the data size too: accepted when it agrees
    assert ParallelConfig.from_dict(dict(data=2, pipeline=2, tensor=dict(size=4, mode="2d"))
                                    ).data_size(16) == 2
    assert ParallelConfig.from_dict(dict(data=dict(size=3))).data_size(3) == 3
    assert ParallelConfig.from_dict(dict(pipeline=3)).pipeline == 3
    cfg = ParallelConfig.from_dict(dict(tensor=dict(size=18, mode="2.5d", depth=2)))
    assert (cfg.side, cfg.depth) == (3, 2)
    assert ParallelConfig.from_dict(dict(tensor=dict(size=27, mode="3d"))).side == 3


@pytest.mark.parametrize("parallel, world, words", [
    (dict(tensor=dict(size=4, mode="4d")), 4,
     ["unknown tensor parallel mode '4d'", "None", "'1d'", "'2d'", "'2.5d'", "'3d'", "'sequence'"]),
    (dict(pipeline=2, tensor=dict(size=4, mode="1d")), 12,
     ["world size 12", "pipeline size 2", "tensor size 4", "= 8"]),
    (dict(tensor=dict(size=8, mode="2d")), 8, ["'2d'", "square", "got 8", "4 and 9"]),
    (dict(tensor=dict(size=12, mode="2.5d", depth=2)), 12,
     ["'2.5d'", "q² × depth", "size 12", "depth 2", "12 / 2 = 6"]),
    (dict(tensor=dict(size=8, mode="2.5d", depth=3)), 24, ["size 8", "depth 3"]),
    (dict(tensor=dict(size=9, mode="3d")), 9, ["'3d'", "cubic", "got 9", "8 and 27"]),
    (dict(tensor=dict(size=4)), 4, ["tensor size 4 needs a mode"]),
    (dict(tensor=dict(size=4, mode="2d", depth=2)), 4, ["depth=2", "only used by mode '2.5d'"]),
    (dict(tensor=dict(size=0, mode="1d")), 4, ["tensor size must be a positive integer", "0"]),
    (dict(data=2), 4, ["data size 2 does not match", "derived", "world size 4", "= 4"]),
    (dict(data=dict(size=2, mode="x")), 4, ["unknown keys ['mode'] in data"]),
    (dict(data=0), 4, ["data size must be a positive integer"]),
    (dict(tensor=dict(size=2, mode="1d", seed=3)), 2, ["unknown keys ['seed'] in tensor"]),
])
def test_bad_configs_name_the_numbers(parallel, world, words):
    with pytest.raises(ValueError) as err:
        ParallelConfig.from_dict(parallel).data_size(world)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def _validate_without_partner():
    """Rank 0 asks for a bad layout while rank 1 never joins in: rank 0 must fail at once."""
    if dist.get_rank() == 1:
        return None
    t0 = time.monotonic()
    try:
        dist.init_parallel(dict(tensor=dict(size=3, mode="2d")))
    except ValueError as exc:
        return str(exc), time.monotonic() - t0
    return "no error", 0.0


def _validate_on_every_rank():
    try:
        dist.init_parallel(dict(pipeline=2, tensor=dict(size=2, mode="1d")))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_validation_runs_on_every_rank_before_any_communication():
    message, seconds = run_workers(_validate_without_partner, 2, collective_timeout=120)[0]
    # far below the collective timeout: rank 0 did not wait for its partner
    assert "mode '2d' needs a square tensor size" in message and seconds < 60
    messages = run_workers(_validate_on_every_rank, 2)
    assert messages[0] == messages[1]
    assert "world size 2 is not divisible by pipeline size 2 × tensor size 2 = 4" in messages[0]


def _groups_job(parallel):
    ctx = dist.init_parallel(parallel)
    out = {}
    for name in ctx.group_names:
        group = ctx.group(name)
        total = comm.all_reduce(np.array([dist.get_rank()], np.int64), "sum", group)
        out[name] = (group.ranks, ctx.rank(name), ctx.size(name), int(total[0]))
    return out, repr(ctx), dist.get_parallel_context() is ctx


def _expect(world, pp, axes, dims, group_axes):
    """Independent reference: ranks laid out data-major, then pipeline, then the tensor axes
    (``dims``, slowest first); a group varies ``group_axes`` (names from ``axes``)."""
    tp = int(np.prod(dims))
    names = ["data", "pipe", *axes]
    sizes = [world // (pp * tp), pp, *dims]
    strides = [int(np.prod(sizes[i + 1:])) for i in range(len(sizes))]
    coords = {r: {n: r // s % d for n, s, d in zip(names, strides, sizes)} for r in range(world)}
    groups = {}
    for name, varying in group_axes.items():
        for r in range(world):
            members = [q for q in range(world)
                       if all(coords[q][a] == coords[r][a] for a in names if a not in varying)]
            members.sort(key=lambda q: [coords[q][a] for a in names if a in varying])
            groups.setdefault(name, {})[r] = members
    return groups


LAYOUTS = [
    (dict(pipeline=2, tensor=dict(size=2, mode="1d")), ("tensor",), (2,),
     {"data": ["data"], "pipeline": ["pipe"], "tensor": ["tensor"], "1d": ["tensor"]}),
    (dict(tensor=dict(size=4, mode="2d")), ("row", "col"), (2, 2),
     {"data": ["data"], "tensor": ["row", "col"], "2d_row": ["col"], "2d_col": ["row"]}),
    (dict(tensor=dict(size=8, mode="2.5d", depth=2)), ("dep", "row", "col"), (2, 2, 2),
     {"2.5d_row": ["col"], "2.5d_col": ["row"], "2.5d_dep": ["dep"],
      "2.5d_col_x_dep": ["dep", "row"], "tensor": ["dep", "row", "col"]}),
    (dict(tensor=dict(size=8, mode="3d")), ("weight", "input", "output"), (2, 2, 2),
     {"3d_input": ["input"], "3d_weight": ["weight"], "3d_output": ["output"],
      "3d_input_x_weight": ["weight", "input"], "3d_output_x_weight": ["weight", "output"]}),
    (dict(tensor=dict(size=4, mode="sequence")), ("sequence",), (4,),
     {"data": ["data"], "sequence": ["sequence"], "sequence_dp": ["data", "sequence"]}),
]


@pytest.mark.parametrize("parallel, axes, dims, group_axes", LAYOUTS)
def test_groups_follow_the_rank_layout_tensor_fastest(parallel, axes, dims, group_axes):
    world = 8
    pp = parallel.get("pipeline", 1)
    expected = _expect(world, pp, axes, dims, group_axes)
    results = run_workers(_groups_job, world, parallel)
    for rank, (groups, text, current) in enumerate(results):
        assert current
        for name, members in expected.items():
            ranks, index, size, total = groups[name]
            mine = members[rank]
            assert ranks == mine, (name, rank, ranks, mine)
            assert (index, size, total) == (mine.index(rank), len(mine), sum(mine))
        assert f"world={world}" in text and f"rank {rank}:" in text and " pipe=" in text


def test_global_rank_is_data_times_pipe_tensor_plus_pipe_times_tensor_plus_tensor():
    groups = _expect(24, 3, ("tensor",), (2,), {"tensor": ["tensor"], "pipeline": ["pipe"]})
    for d, p, t in itertools.product(range(4), range(3), range(2)):
        rank = d * (3 * 2) + p * 2 + t
        assert groups["tensor"][rank].index(rank) == t
        assert groups["pipeline"][rank].index(rank) == p


def _from_file(path):
    ctx = dist.init_parallel(config=path)
    return ctx.config.mode, ctx.size("2d_row"), ctx.data_size, "tp_config" in sys.modules


def test_config_file_is_run_as_a_file(tmp_path):
    path = tmp_path / "tp_config.py"
    path.write_text("q = 2\nparallel = dict(tensor=dict(size=q * q, mode='2d'))\n")
    assert run_workers(_from_file, 4, str(path))[0] == ("2d", 2, 1, False)
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no variable `parallel`"):
        dist.init_parallel(config=str(empty))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dist.init_parallel(config=str(tmp_path / "missing.py"))


def test_no_context_before_init_parallel():
    assert dist.get_parallel_context(required=False) is None
    with pytest.raises(RuntimeError, match="call dist.init_parallel"):
        dist.get_parallel_context()
