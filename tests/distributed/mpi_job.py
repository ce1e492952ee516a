"""Run by test_mpi.py under ``mpiexec -n N``: the collective and data-parallel suites on the
backend MPI launches pick (``mpi`` by default), each rank checking its own results against the same
NumPy / single-process references the launcher-based tests use. Exits non-zero on any failure.

    mpiexec -n 2 python tests/distributed/mpi_job.py cases comm data_parallel
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import test_comm  # noqa: E402
import test_data_parallel  # noqa: E402
from collective_cases import check_rank, run_cases  # noqa: E402

import minigrad.distributed as dist  # noqa: E402


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
