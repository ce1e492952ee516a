"""How many threads a process computes with: ``mg.set_num_threads(n)`` and ``mg.get_num_threads()``.

minigrad's CPU work runs in two places: the matrix products, in the BLAS library NumPy loaded
(OpenBLAS, MKL, ...) with its own thread pool, and the fused kernels of
``minigrad.backend.kernels``, which run on the calling thread. So the thread count that matters is
BLAS's, and it is set here through ``threadpoolctl``, which talks to every native thread pool loaded
in the process (BLAS and OpenMP) at the moment of the call. Environment variables such as
``OMP_NUM_THREADS`` only work before the library loads, which is why they are not the interface.

Defaults: a single process uses every core it may run on (its CPU affinity mask); each rank of a
``dist.launcher`` job calls ``set_num_threads(cores // ranks)``, so ranks never oversubscribe the
machine.

Waiting policy: after each product OpenBLAS's workers spin for 2**28 cycles (about 0.1 s) before
they sleep. Next to another process that wants the cores, those spinning threads take them: two
2-thread MLP jobs on a 2-core machine ran a step in 108 ms instead of 4 (measured with
``benchmarks/bench_threads.py``). :func:`configure_blas_waiting`, run when minigrad is imported,
shortens the spin to 2**``BLAS_SPIN_EXPONENT`` cycles (about 0.4 ms): long enough to bridge the
gaps between the products of one training step (idle, within a few percent of OpenBLAS's
default), short enough that the two jobs above took 10-16 ms. That is still slower than one
thread each (5.7 ms): on a machine shared with other work, ``mg.set_num_threads`` is the real
remedy, and ``dist.launcher`` does it for its own ranks. OpenBLAS reads the setting when it
loads, so it only applies when minigrad is imported before NumPy, and never overrides a value
the user set.

Example::

    mg.set_num_threads(1)      # e.g. while another job shares the machine
    mg.get_num_threads()       # -> 1
"""

from __future__ import annotations

import os
import sys

import threadpoolctl

BLAS_SPIN_ENV = "OPENBLAS_THREAD_TIMEOUT"
BLAS_SPIN_EXPONENT = 20  # spin 2**20 cycles (~0.4 ms) after a product, then sleep

__all__ = ["available_cores", "configure_blas_waiting", "get_num_threads", "set_num_threads"]

_requested: int | None = None


def available_cores() -> int:
    """The number of cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configure_blas_waiting() -> bool:
    """Make OpenBLAS's idle threads sleep soon after a product instead of spinning for 0.1 s (see
    the module docstring). Returns whether the setting can still take effect: False when NumPy is
    already loaded or the user chose a value."""
    if "numpy" in sys.modules or BLAS_SPIN_ENV in os.environ:
        return False
    os.environ[BLAS_SPIN_ENV] = str(BLAS_SPIN_EXPONENT)
    return True


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for BLAS (and any OpenMP pool) in this process, from now on.

    Example::

        mg.set_num_threads(2)
    """
    global _requested
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads: expected a positive int, got {n!r}")
    threadpoolctl.threadpool_limits(limits=n)
    _requested = n


def get_num_threads() -> int:
    """The number of threads BLAS uses in this process: what :func:`set_num_threads` set, else
    the library's default (every available core unless ``OMP_NUM_THREADS`` and the like said
    otherwise). Once set, the set count is the answer: minigrad computes with NumPy's BLAS, which
    has it, while a BLAS loaded later keeps its own default (numba imports SciPy on the first
    kernel call, and SciPy brings an OpenBLAS of its own that minigrad never calls)."""
    if _requested is not None:
        return _requested
    pools = threadpoolctl.threadpool_info()
    blas = [p["num_threads"] for p in pools if p["user_api"] == "blas"]
    return max(blas) if blas else available_cores()
