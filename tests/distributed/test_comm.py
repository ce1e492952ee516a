"""Array collectives against NumPy references computed from every rank's (seeded) inputs."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.comm import group
from minigrad.distributed.comm.providers.cpu import shm
from minigrad.testing.distributed import run_workers

DTYPES = ["float32", "float16", "float64", "int32", "int64", "int8", "uint8", "bool"]
SHAPES = [(), (1,), (99, 77)]
TOL = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-12}


def make(rank: int, case: int, shape, dtype: str) -> np.ndarray:
    """Rank/case-seeded input: quarter-integers for floats, so sums are exact even in float16."""
    rng = np.random.default_rng(1000 * rank + case)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    lo = 0 if np.dtype(dtype).kind == "u" else -8
    x = rng.integers(lo, 9, size=shape)
    if np.dtype(dtype).kind == "f":
        return np.asarray(x + rng.integers(0, 4, size=shape) / 4).astype(dtype)
    return np.asarray(x).astype(dtype)


def reference(xs: list[np.ndarray], op: str) -> np.ndarray:
    dtype = xs[0].dtype
    if dtype == np.bool_:
        stack = np.stack(xs)
        return {"sum": stack.any(0), "max": stack.any(0), "min": stack.all(0)}[op]
    wide = np.stack([x.astype(np.float64 if dtype.kind == "f" else np.int64) for x in xs])
    red = {"sum": wide.sum(0), "max": wide.max(0), "min": wide.min(0)}[op]
    return red.astype(dtype)  # int8/uint8 wrap modulo 256 like the in-dtype reduction


def assert_same(actual, expected, dtype: str) -> None:
    assert actual.dtype == np.dtype(dtype) and actual.shape == expected.shape
    if dtype in TOL:
        tol = TOL[dtype]
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(actual, expected)


CASES = [(s, d) for d in DTYPES for s in SHAPES]


def _all_collectives(ops=("sum", "max", "min")):
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for c, (shape, dtype) in enumerate(CASES):
        x = make(r, c, shape, dtype)
        for op in ops:
            out["all_reduce", c, op] = comm.all_reduce(x.copy(), op)  # in place: keep x
        out["reduce", c] = comm.reduce(x.copy(), "sum", root=n - 1)
        out["broadcast", c] = comm.broadcast(x if r == n - 1 else None, root=n - 1)
        out["all_gather", c] = comm.all_gather(x)
        out["gather", c] = comm.gather(x, root=0)
        chunks = [make(r, 100 + c * 10 + j, shape, dtype) for j in range(n)]
        out["reduce_scatter", c] = comm.reduce_scatter(chunks, "sum")
        out["all_to_all", c] = comm.all_to_all(chunks)
        out["scatter", c] = comm.scatter(chunks if r == 0 else None, root=0)
    comm.barrier()
    return out


def _check_all(res: list[dict], n: int, ops=("sum", "max", "min")) -> None:
    for r in range(n):
        check_rank(res[r], r, n, ops)


def check_rank(got: dict, r: int, n: int, ops=("sum", "max", "min")) -> None:
    """Check one rank's results of ``_all_collectives`` (also used by the mpiexec job)."""
    for c, (shape, dtype) in enumerate(CASES):
        xs = [make(j, c, shape, dtype) for j in range(n)]
        chunks = [[make(j, 100 + c * 10 + i, shape, dtype) for i in range(n)] for j in range(n)]
        for op in ops:
            assert_same(got["all_reduce", c, op], reference(xs, op), dtype)
        if r == n - 1:
            assert_same(got["reduce", c], reference(xs, "sum"), dtype)
        else:
            assert got["reduce", c] is None
        np.testing.assert_array_equal(got["broadcast", c], xs[n - 1])
        assert got["broadcast", c].dtype == np.dtype(dtype)
        for j in range(n):
            np.testing.assert_array_equal(got["all_gather", c][j], xs[j])
            assert got["all_to_all", c][j].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got["all_to_all", c][j], chunks[j][r])
        if r == 0:
            for j in range(n):
                np.testing.assert_array_equal(got["gather", c][j], xs[j])
        else:
            assert got["gather", c] is None
        np.testing.assert_array_equal(got["scatter", c], chunks[0][r])
        assert_same(got["reduce_scatter", c], reference([ch[r] for ch in chunks], "sum"), dtype)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_dtype_shape(n):
    res = run_workers(_all_collectives, n, timeout=60)
    _check_all(res, n)


def test_four_ranks_sum_only():
    res = run_workers(_all_collectives, 4, ("sum",), timeout=60)
    _check_all(res, 4, ops=("sum",))


def test_results_are_bitwise_identical_across_ranks():
    def body():
        x = np.random.default_rng(dist.get_rank()).standard_normal(5000).astype(np.float32)
        return comm.all_reduce(x)

    res = run_workers(body, 3)
    assert all(np.array_equal(res[0], y) for y in res[1:])


def _tcp_body():
    out = _all_collectives(("sum",))
    return out, group._state.world.transport_kind


def test_tcp_transport_forced(monkeypatch):
    monkeypatch.setenv("MINIGRAD_DIST_TRANSPORT", "tcp")
    res = run_workers(_tcp_body, 3, timeout=60)
    assert [k for _, k in res] == ["tcp"] * 3
    _check_all([o for o, _ in res], 3, ops=("sum",))


@pytest.mark.parametrize("l2, chunk", [("1024K", 512 << 10), ("2048K", 1 << 20),
                                       ("32M", 1 << 20), ("256K", 128 << 10), ("200K", 128 << 10),
                                       ("1536K", 512 << 10), (None, 512 << 10)])
def test_shared_memory_rounds_are_half_the_l2_cache(tmp_path, monkeypatch, l2, chunk):
    # a round's own chunk, the peers' and the result then stay in cache (16 MiB all-reduce, 2
    # ranks, 1 MiB of L2: 3.0 ms in 1 MiB rounds, 1.6 ms in 512 KiB ones)
    for index, (level, size) in enumerate([("1", "48K"), ("1", "32K"), ("2", l2), ("3", "32M")]):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        if size is not None:
            (entry / "size").write_text(f"{size}\n")
    monkeypatch.setattr(shm, "L2_SIZE_FILES", str(tmp_path / "index*") + "/")
    monkeypatch.delenv("MINIGRAD_DIST_SHM_CHUNK", raising=False)
    assert shm.l2_cache_bytes() == (None if l2 is None else
                                    int(l2[:-1]) << (10 if l2.endswith("K") else 20))
    assert shm.chunk_bytes() == chunk
    monkeypatch.setenv("MINIGRAD_DIST_SHM_CHUNK", "8192")
    assert shm.chunk_bytes() == 8192


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 3])
def test_large_arrays_stream_in_rounds(monkeypatch, transport, n):
    # 4 KiB shared-memory chunks force many rounds; n=3 uses reduce-scatter + all-gather.
    monkeypatch.setenv("MINIGRAD_DIST_SHM_CHUNK", "4096")
    monkeypatch.setenv("MINIGRAD_DIST_TRANSPORT", transport)

    def body():
        r = dist.get_rank()
        x = make(r, 7, (301, 211), "float32")
        parts = [make(r, 50 + j, (1000 + 37 * j,), "int64") for j in range(n)]
        return comm.all_reduce(x.copy()), comm.all_to_all(parts), comm.all_gather(x[: 100 + r])

    res = run_workers(body, n, timeout=60)
    xs = [make(r, 7, (301, 211), "float32") for r in range(n)]
    for r in range(n):
        ar, a2a, ag = res[r]
        assert_same(ar, reference(xs, "sum"), "float32")
        for j in range(n):
            np.testing.assert_array_equal(a2a[j], make(j, 50 + r, (1000 + 37 * r,), "int64"))
            np.testing.assert_array_equal(ag[j], xs[j][: 100 + j])


def test_subgroups():
    def body():
        r = dist.get_rank()
        g = dist.new_group([2, 0])  # root is rank 2; rank 1 is outside
        h = dist.new_group([1, 2])
        info = (g.rank, g.size, g.root, g.ranks)
        x = np.full(3, r + 1.0)
        out = {"info": info}
        if r in (0, 2):
            out["ar"] = comm.all_reduce(x.copy(), group=g)  # in place: keep x
            out["bc"] = comm.broadcast(x if r == 2 else None, root=2, group=g)
            out["ag"] = comm.all_gather(x * 10, group=g)
            dist.group_barrier(g)
        else:
            with pytest.raises(ValueError, match="not a member"):
                comm.all_reduce(x, group=g)
        if r in (1, 2):
            out["h"] = comm.all_reduce(x.copy(), "max", group=h)
        out["world"] = comm.all_reduce(x.copy())
        return out

    res = run_workers(body, 3)
    assert res[0]["info"] == (1, 2, 2, [2, 0]) and res[2]["info"] == (0, 2, 2, [2, 0])
    assert res[1]["info"][0] == -1
    for r in (0, 2):
        np.testing.assert_array_equal(res[r]["ar"], np.full(3, 4.0))
        np.testing.assert_array_equal(res[r]["bc"], np.full(3, 3.0))
        np.testing.assert_array_equal(res[r]["ag"][0], np.full(3, 30.0))
        np.testing.assert_array_equal(res[r]["ag"][1], np.full(3, 10.0))
    for r in (1, 2):
        np.testing.assert_array_equal(res[r]["h"], np.full(3, 3.0))
    for r in range(3):
        np.testing.assert_array_equal(res[r]["world"], np.full(3, 6.0))


def _value(j: int) -> np.ndarray:
    """Rank j's input of the ``*_along`` tests: (7, 5, 4), different on every rank."""
    return np.arange(140.0).reshape(7, 5, 4) * (j + 1) + j


def _along_body():
    r = dist.get_rank()
    x = _value(r)
    out = {
        "split": comm.split_along(x, 1, [2, 0, 3]),
        "all_gather": comm.all_gather_along(x[:, : r + 1], 1, with_sizes=True),
        "reduce_scatter": comm.reduce_scatter_along(x, 0, sizes=[3, 0, 4]),
        "reduce_scatter_even": comm.reduce_scatter_along(x[:6], 0, op="max"),
        "all_to_all": comm.all_to_all_along(x[:, : r + 1], 0, 1, sizes=[3, 0, 4]),
        "all_to_all_even": comm.all_to_all_along(x[:6], 0, 2),
    }
    for call in (lambda: comm.reduce_scatter_along(x, 0), lambda: comm.split_along(x, 0, [3, 3]),
                 lambda: comm.all_to_all_along(x, 1, 0)):
        try:
            call()
        except ValueError as exc:
            out.setdefault("errors", []).append(str(exc))
    return out


def test_collectives_along_an_axis_equal_numpy():
    """split/all-gather/reduce-scatter/all-to-all along an axis, with uneven (and empty) pieces,
    against NumPy cuts and concatenations of every rank's input."""
    n = 3
    xs = [_value(j) for j in range(n)]
    rows = [(0, 3), (3, 3), (3, 7)]  # pieces [3, 0, 4] along axis 0
    for r, out in enumerate(run_workers(_along_body, n, timeout=60)):
        split = out["split"]
        for got, want in zip(split, [xs[r][:, :2], xs[r][:, 2:2], xs[r][:, 2:]]):
            np.testing.assert_array_equal(got, want)
            assert got.flags.c_contiguous
        gathered, sizes = out["all_gather"]
        np.testing.assert_array_equal(
            gathered, np.concatenate([x[:, : j + 1] for j, x in enumerate(xs)], 1))
        assert sizes == [1, 2, 3]
        a, b = rows[r]
        np.testing.assert_array_equal(out["reduce_scatter"], sum(xs)[a:b])
        np.testing.assert_array_equal(out["reduce_scatter_even"],
                                      np.max(xs, axis=0)[2 * r : 2 * r + 2])
        np.testing.assert_array_equal(
            out["all_to_all"], np.concatenate([x[a:b, : j + 1] for j, x in enumerate(xs)], 1))
        np.testing.assert_array_equal(
            out["all_to_all_even"], np.concatenate([x[2 * r : 2 * r + 2] for x in xs], 2))
        assert out["errors"] == [
            "reduce_scatter_along: axis 0 of size 7 is not divisible by the group size 3",
            "split_along: piece sizes [3, 3] do not add up to axis 0 of size 7",
            "all_to_all_along: axis 1 of size 5 is not divisible by the group size 3",
        ]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_send_recv(monkeypatch, transport):
    monkeypatch.setenv("MINIGRAD_DIST_TRANSPORT", transport)
    monkeypatch.setenv("MINIGRAD_DIST_SHM_CHUNK", "8192")

    def body():
        r, n = dist.get_rank(), dist.get_world_size()
        # a ring where everyone sends first: works because send returns once buffered
        comm.send(make(r, 1, (7, 5), "float64"), (r + 1) % n)
        got = [comm.recv((r - 1) % n)]
        # bigger than the ring: streams through it while the receiver drains
        if r == 0:
            comm.send(make(0, 2, (50000,), "int32"), 1)
            comm.send(np.array(True), 1)
        elif r == 1:
            got += [comm.recv(0), comm.recv(0)]
        return got

    res = run_workers(body, 3)
    for r in range(3):
        np.testing.assert_array_equal(res[r][0], make((r - 1) % 3, 1, (7, 5), "float64"))
    np.testing.assert_array_equal(res[1][1], make(0, 2, (50000,), "int32"))
    assert res[1][2].shape == () and res[1][2].dtype == np.bool_ and bool(res[1][2])


def test_all_reduce_async_overlaps_and_keeps_order():
    def body():
        r = dist.get_rank()
        works = [comm.all_reduce(np.full(1000, r + k, np.float32), async_op=True) for k in range(5)]
        mid = comm.all_reduce(np.array([r], np.int64))  # issued after: must not overtake
        return [w.wait() for w in works], mid

    res = run_workers(body, 2)
    for works, mid in res:
        for k, w in enumerate(works):
            np.testing.assert_array_equal(w, np.full(1000, 1 + 2 * k, np.float32))
        np.testing.assert_array_equal(mid, [1])


def test_world_size_one_and_uninitialised_defaults():
    assert dist.get_rank() == 0 and dist.get_world_size() == 1 and not dist.is_distributed()
    with pytest.raises(RuntimeError, match="before init_process_group"):
        comm.all_reduce(np.ones(2))

    def body():
        x = np.arange(4.0)
        return comm.all_reduce(x), comm.broadcast(x), comm.all_gather(x), dist.get_world_size()

    (ar, bc, ag, ws), = run_workers(body, 1)
    np.testing.assert_array_equal(ar, np.arange(4.0))
    np.testing.assert_array_equal(bc, np.arange(4.0))
    assert len(ag) == 1 and ws == 1


def test_bad_arguments_raise_clear_errors():
    def body():
        errs = []
        for call in (
            lambda: comm.all_reduce(np.ones(2), op="prod"),
            lambda: comm.all_reduce(np.ones(2, np.complex64)),
            lambda: comm.broadcast(np.ones(2), root=5),
            lambda: comm.send(np.ones(2), dist.get_rank()),
        ):
            try:
                call()
            except (ValueError, TypeError) as exc:
                errs.append(str(exc))
        comm.barrier()  # the group still works: argument errors are raised before any exchange
        return errs

    errs = run_workers(body, 2)[0]
    assert len(errs) == 4
    assert "prod" in errs[0] and "complex64" in errs[1] and "root rank 5" in errs[2]
    assert "peer rank" in errs[3]


def cupy_arrays_body():
    """CuPy arrays through all_reduce, broadcast, an async all_reduce, and an all-gather and an
    all-to-all along an axis, whose results stay CuPy arrays (run by
    ``gpu_jobs.cupy_collectives``: on the fake CuPy in CI, on CUDA in a fresh interpreter)."""
    import cupy as cp  # noqa: PLC0415  (the real or the fake one)

    r = dist.get_rank()
    x = cp.asarray(make(r, 3, (99, 77), "float32"))
    along = [comm.all_gather_along(x, 1), comm.all_to_all_along(x[:98], 0, 1)]
    assert all(isinstance(y, cp.ndarray) for y in along)
    return [cp.asnumpy(y) for y in (comm.all_reduce(x.copy()), comm.broadcast(x.copy(), root=0),
                                    comm.all_reduce(x.copy(), "max", async_op=True).wait(),
                                    *along)]


def check_cupy_arrays(n: int, backend: str, timeout: float = 60) -> None:
    """``cupy_arrays_body`` on ``n`` ranks: world size 1 exercises NCCL itself, 2 ranks on one GPU
    go through host staging (cpu backend); ``timeout`` bounds the job."""
    res = run_workers(cupy_arrays_body, n, backend=backend, timeout=timeout)
    xs = [make(r, 3, (99, 77), "float32") for r in range(n)]
    rows = 98 // n
    for r, (ar, bc, mx, ag, a2a) in enumerate(res):
        assert_same(ar, reference(xs, "sum"), "float32")
        np.testing.assert_array_equal(bc, xs[0])
        assert_same(mx, reference(xs, "max"), "float32")
        np.testing.assert_array_equal(ag, np.concatenate(xs, 1))
        np.testing.assert_array_equal(
            a2a, np.concatenate([x[r * rows : (r + 1) * rows] for x in xs], 1))
