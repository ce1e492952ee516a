"""Run by test_mpi.py under ``mpiexec -n N``: the collective and data-parallel suites on the
backend MPI launches pick (``mpi`` by default), each rank checking its own results against the same
NumPy / single-process references the launcher-based tests use. Exits non-zero on any failure.

    mpiexec -n 2 python tests/distributed/mpi_job.py cases comm mismatch small check data_parallel
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import test_comm  # noqa: E402
import test_data_parallel  # noqa: E402
import test_faults  # noqa: E402
from collective_cases import check_rank, run_cases  # noqa: E402

import minigrad.distributed as dist  # noqa: E402


def check_mismatch(r: int, n: int) -> None:
    """Mismatched calls raise on every rank with every rank's call, dtypes named ``float32``, and
    leave the communicator usable (the check runs before any data moves)."""
    x = np.ones((3, 4) if r == 0 else (4, 3), np.float32 if r == 0 else np.float64)
    try:
        dist.comm.all_reduce(x)
    except dist.CollectiveMismatchError as exc:
        msg = str(exc)
    else:
        raise AssertionError(f"rank {r}: a mismatched all_reduce did not raise")
    for j, (shape, dtype) in enumerate([("[3, 4]", "float32")] + [("[4, 3]", "float64")] * (n - 1)):
        assert f"rank {j} called all_reduce#" in msg and shape in msg and dtype in msg, msg
    assert "<f" not in msg, msg
    y = dist.comm.all_reduce(np.full(2, r + 1.0))
    np.testing.assert_array_equal(y, np.full(2, n * (n + 1) / 2))


def _contribution(rank: int, shape, dtype) -> np.ndarray:
    """Member ``rank``'s input: values whose sums and products round (floats) or wrap (ints)."""
    rng = np.random.default_rng(100 + rank)
    if dtype == np.bool_:
        values = rng.random(shape) < 0.5
    elif np.dtype(dtype).kind == "f":
        values = rng.standard_normal(shape) * 3
    else:
        values = rng.integers(-100 if np.dtype(dtype).kind == "i" else 0, 100, shape)
    return np.asarray(values, dtype)


def _in_member_order(ufunc, n: int, shape, dtype) -> np.ndarray:
    """The reduction of every member's contribution in member order (float16 in float32)."""
    wide = np.float32 if dtype == np.float16 else dtype
    out = _contribution(0, shape, dtype).astype(wide)
    for j in range(1, n):
        out = np.asarray(ufunc(out, _contribution(j, shape, dtype).astype(wide)), wide)
    return out.astype(dtype)


def check_small_reductions(r: int, n: int) -> None:
    """Reductions small enough to ride in the mpi backend's header round: every dtype and op
    equals NumPy's reduction in member order bit for bit and is bitwise the same on every rank;
    ``reduce`` leaves non-roots' buffers alone; at the size limit and one element past it (MPI's
    own reduction) the results agree; a mismatch with another collective and an unsupported
    dtype raise on every rank and leave the communicator usable."""
    ufuncs = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum}
    dtypes = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_]
    for dtype in dtypes:
        for op, ufunc in ufuncs.items():
            for shape in [(), (5,), (3, 4)]:
                x = _contribution(r, shape, dtype)
                dist.all_reduce(x, op=op)
                want = _in_member_order(ufunc, n, shape, dtype)
                assert x.dtype == want.dtype and x.tobytes() == want.tobytes(), (dtype, op, x, want)
                seen = [None] * n
                dist.all_gather_object(seen, x.tobytes())
                assert len(set(seen)) == 1, (dtype, op, "ranks differ")
    for root in range(n):
        x = _contribution(r, (6,), np.float64)
        dist.reduce(x, dst=root)
        mine = _contribution(r, (6,), np.float64)
        want = _in_member_order(np.add, n, (6,), np.float64) if r == root else mine
        assert x.tobytes() == want.tobytes(), (root, x, want)
    inline_limit = 4096 // 4  # float32 elements that ride in the header round
    for size in (inline_limit, inline_limit + 1):
        x = _contribution(r, (size,), np.float32)
        dist.all_reduce(x)
        np.testing.assert_allclose(x, _in_member_order(np.add, n, (size,), np.float32),
                                   rtol=1e-6, atol=1e-5)
    x = np.ones(3, np.float32)
    try:
        if r == 0:
            dist.all_reduce(x)
        else:
            dist.broadcast(x, src=0)
    except dist.CollectiveMismatchError as exc:
        msg = str(exc)
        assert "rank 0 called all_reduce#" in msg and "rank 1 called broadcast#" in msg, msg
    else:
        raise AssertionError(f"rank {r}: all_reduce against broadcast did not raise")
    try:
        dist.all_reduce(np.ones(3, np.complex64))
    except TypeError as exc:
        assert "complex64" in str(exc), exc
    else:
        raise AssertionError(f"rank {r}: a complex64 all_reduce did not raise")
    y = np.full(2, r + 1.0)
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, np.full(2, n * (n + 1) / 2))


def main(suites: list[str]) -> None:
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    route = dist.WORLD.context().host_route
    expected = os.environ.get("EXPECT_BACKEND", "mpi")
    assert route == expected, f"rank {r}: host arrays go through {route!r}, expected {expected!r}"
    if "cases" in suites:
        check_rank(run_cases(), r, n)
    if "comm" in suites:
        test_comm.check_rank(test_comm._all_collectives(), r, n)
    if "mismatch" in suites:
        check_mismatch(r, n)
    if "small" in suites:
        check_small_reductions(r, n)
    if "check" in suites:
        test_faults.check_strings(test_faults.check_strings_body(), r, n)
    if "data_parallel" in suites:
        ref_params, ref_losses = test_data_parallel._reference(n)
        for bucket_mb in (10.0, 0.0):
            params, losses = test_data_parallel._dp_worker(bucket_mb)
            for p, q in zip(params, ref_params):
                np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    dist.destroy_process_group()
    print(f"rank {r}: {' '.join(suites)} passed on backend {route}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
