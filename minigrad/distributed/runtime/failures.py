"""A rank's uncaught exception, made known to its peers in jobs that mpiexec or srun started.

Under minigrad's launchers a parent process watches the ranks and stops the others when one fails.
Under mpiexec nothing does: a rank that dies of an uncaught exception stops inside
``MPI_Finalize`` (which waits for its peers), and its peers wait in their next collective until its
timeout, minutes later, before anyone hears why. So ``init_process_group`` arms this module in
MPI-started jobs of more than one rank:

1. the failing rank's ``sys.excepthook`` prints the traceback as before, writes its flight
   recorder's ring, then posts ``"rank R failed: Error: message"`` in the job's store (the first
   post stays) and counts itself among the failed ranks;
2. every wait of the runtime looks at the post while it waits (:func:`posted`, asked by the
   watchdog at most every 0.2 s of waiting), so each peer raises within a fraction of a second,
   naming the call it was in and the rank that failed, and then fails the same way;
3. a failing rank ends the job with ``MPI_Abort`` once every rank has failed, or after
   :data:`FAILURE_GRACE` seconds (a peer busy computing would otherwise keep the job alive).

A process killed outright never reaches its hook; mpiexec itself notices that one.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from minigrad.distributed.runtime.store import StoreError

# seconds a failing rank gives its peers to report before it ends the job: longer than rank 0's
# wait for the other ranks' flight-recorder dumps (10 s), so its analysis gets printed
FAILURE_GRACE = 15.0
POLL = 0.05  # seconds between a failing rank's looks at how many ranks have failed

_armed: dict | None = None  # the job this process belongs to, while armed


def arm(client, job: str, rank: int, world_size: int, abort: Callable[[], None],
        dump: Callable[[str], object]) -> None:
    """Install the hook for this rank of ``job`` (``client``: its store; ``abort``: ends every
    rank of the job, ``MPI_Abort``; ``dump(reason)``: writes this rank's flight-recorder ring, for
    the analysis rank 0 prints when its own collective fails)."""
    global _armed
    disarm()
    _armed = {"client": client, "key": f"{job}/failed", "rank": rank, "world_size": world_size,
              "abort": abort, "dump": dump, "previous": sys.excepthook}
    sys.excepthook = _report_and_abort


def disarm() -> None:
    """Restore the previous ``sys.excepthook`` (``destroy_process_group``)."""
    global _armed
    if _armed is not None and sys.excepthook is _report_and_abort:
        sys.excepthook = _armed["previous"]
    _armed = None


def posted() -> str | None:
    """The failure another rank of this job posted (``"rank 1 failed: ..."``), else None; None
    too when the module is not armed or the store cannot be reached."""
    armed = _armed
    if armed is None:
        return None
    try:
        return str(armed["client"].get(armed["key"], timeout=0))
    except (StoreError, OSError):  # not posted (StoreTimeout), or no store any more
        return None


def _report_and_abort(exc_type, exc, tb) -> None:
    """The armed ``sys.excepthook``: steps 1 and 3 of the module docstring."""
    armed = _armed
    armed["previous"](exc_type, exc, tb)
    client, key = armed["client"], armed["key"]
    deadline = time.monotonic() + FAILURE_GRACE
    reason = f"{exc_type.__name__}: {exc}"
    try:
        armed["dump"](reason)
    except Exception:  # noqa: BLE001 - the peers must hear of the failure all the same
        pass
    try:
        if not client.check(key):
            client.set(key, f"rank {armed['rank']} failed: {reason}")
        client.add(f"{key}/count", 1)
        while time.monotonic() < deadline:
            if int(client.add(f"{key}/count", 0)) >= armed["world_size"]:
                break
            time.sleep(POLL)
    except (StoreError, OSError):
        pass  # the store went with a rank that already ended the job
    sys.stderr.flush()
    armed["abort"]()
