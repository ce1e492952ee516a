"""Test harness: run a function on N ranks through the real launcher, always cleaning up.

Example::

    def body(x):
        return comm.all_reduce(x * (dist.get_rank() + 1))

    run_workers(body, 2, np.ones(3))   # -> [array([3., 3., 3.]), array([3., 3., 3.])]
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad.distributed.runtime.launcher import launcher


def run_workers(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = 60,
    backend: str = "cpu",
    collective_timeout: float | None = None,
    **kwargs: Any,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` forked ranks; return results in rank order.

    ``timeout`` bounds the whole run (every process is killed after it); ``collective_timeout``
    (default: ``MINIGRAD_DIST_TIMEOUT`` or ``timeout``) bounds each collective. A failing rank
    raises :class:`minigrad.distributed.LaunchError` with its traceback.
    """
    job = launcher(
        fn,
        n_gpus=world_size,
        device_type="cpu",
        backend=backend,
        timeout=collective_timeout,
        job_timeout=timeout,
    )
    return job(*args, **kwargs)
