"""How many threads a process computes with: ``mg.set_num_threads(n)`` and ``mg.get_num_threads()``.

minigrad's CPU work runs in two places: the matrix products, in the BLAS library NumPy loaded
(OpenBLAS, MKL, ...) with its own thread pool, and the fused kernels of
``minigrad.backend.kernels``, which run large inputs on numba's OpenMP pool. One count governs
both: it is set here, for BLAS through ``threadpoolctl`` (which talks to every native thread pool
loaded in the process at the moment of the call), and read by the kernels at each launch
(:func:`kernel_threads`). Environment variables such as ``OMP_NUM_THREADS`` only work before a
library loads, which is why they are not the interface.

Defaults: a single process uses every core it may run on (its CPU affinity mask); each rank of a
``dist.launcher`` job calls ``set_num_threads(cores // ranks)``, so ranks never oversubscribe the
machine.

Waiting policy: after each product OpenBLAS's workers spin for about 0.1 s (2**28 cycles) before
they sleep. On an idle machine that saves a wake-up per product; next to another busy process the
spinning threads take the core that process (or this one's main thread) needs, and a two-thread
step became 2-5x slower than a one-thread step. :func:`configure_blas_waiting`, run when minigrad
is imported, shortens the spin to 2**``BLAS_SPIN_EXPONENT`` cycles, which costs a few percent when
idle and removes most of that slowdown (``benchmarks/bench_threads.py`` measures both). OpenBLAS
reads the setting when it loads, so it only applies when minigrad is imported before NumPy, and
never overrides a value the user set. The kernels' own threads wait passively for the same reason,
and they only run in parallel when BLAS's threads wait briefly (:func:`blas_waits_briefly`): two
pools that both spin fight over the cores.

Example::

    mg.set_num_threads(1)      # e.g. while another job shares the machine
    mg.get_num_threads()       # -> 1
"""

from __future__ import annotations

import os
import sys

import threadpoolctl

BLAS_SPIN_ENV = "OPENBLAS_THREAD_TIMEOUT"
BLAS_SPIN_EXPONENT = 4  # OpenBLAS's minimum: spin 2**4 cycles, then sleep until the next product
_OPENBLAS_DEFAULT_SPIN = 28
_BRIEF_SPIN = 18  # 2**18 cycles, ~0.1 ms: short enough for the kernels' threads to get the cores

__all__ = [
    "available_cores",
    "blas_waits_briefly",
    "configure_blas_waiting",
    "get_num_threads",
    "kernel_threads",
    "set_num_threads",
]

_requested: int | None = None
_default_threads: int | None = None
_spin_at_load: int | None = None  # OPENBLAS_THREAD_TIMEOUT as OpenBLAS saw it when it loaded
_brief_wait: bool | None = None


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
    global _spin_at_load
    numpy_loaded = "numpy" in sys.modules
    if not numpy_loaded and BLAS_SPIN_ENV not in os.environ:
        os.environ[BLAS_SPIN_ENV] = str(BLAS_SPIN_EXPONENT)
        _spin_at_load = BLAS_SPIN_EXPONENT
        return True
    try:  # NumPy loaded first: a value in the environment now was most likely there at start
        _spin_at_load = int(os.environ.get(BLAS_SPIN_ENV, _OPENBLAS_DEFAULT_SPIN))
    except ValueError:
        _spin_at_load = _OPENBLAS_DEFAULT_SPIN
    return False


def blas_waits_briefly() -> bool:
    """Whether the BLAS library's idle threads go to sleep soon after a product: OpenBLAS with
    pthreads and a short spin (see :func:`configure_blas_waiting`). Only then may minigrad's own
    kernels run on several threads: BLAS threads still spinning would take the cores they need
    (a LeNet step became several times slower). Decided once, on the first call."""
    global _brief_wait
    if _brief_wait is None:
        blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        openblas = bool(blas) and all(
            p["internal_api"] == "openblas" and p.get("threading_layer") == "pthreads"
            for p in blas
        )
        spin = _OPENBLAS_DEFAULT_SPIN if _spin_at_load is None else _spin_at_load
        _brief_wait = openblas and spin <= _BRIEF_SPIN
    return _brief_wait


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


def kernel_threads() -> int:
    """The thread count for minigrad's own parallel kernels: the last :func:`set_num_threads`, or
    BLAS's count when it was never called (asked once: this is called on every kernel launch)."""
    global _default_threads
    if _requested is not None:
        return _requested
    if _default_threads is None:
        _default_threads = get_num_threads()
    return _default_threads


def get_num_threads() -> int:
    """The number of threads BLAS uses in this process (what :func:`set_num_threads` set, or the
    library's default: every available core unless ``OMP_NUM_THREADS`` and the like said
    otherwise)."""
    pools = threadpoolctl.threadpool_info()
    blas = [p["num_threads"] for p in pools if p["user_api"] == "blas"]
    if blas:
        return max(blas)
    return _requested if _requested is not None else available_cores()
