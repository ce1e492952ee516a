"""Run by test_mpi.py under ``mpiexec -n N``: the collective and data-parallel suites on the
backend MPI launches pick (``mpi`` by default), each rank checking its own results against the same
NumPy / single-process references the launcher-based tests use. Exits non-zero on any failure.

    mpiexec -n 2 python tests/distributed/mpi_job.py cases comm mismatch check data_parallel
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
