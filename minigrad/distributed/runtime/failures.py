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

A rank whose program ends (``sys.exit``, or the end of its script) while the process group is up
raises nothing: it stops inside ``MPI_Finalize`` too, and a rank that serves the job's store stops
serving it there (the interpreter is gone). So an exit hook posts that the rank ended and counts
it among the stopped ranks: a peer still waiting for it in a collective raises at once, saying so
(:func:`reason`, asked by the watchdog for the ranks that have not arrived), and a failing peer
need not give it the grace period. The rank serving the store keeps serving it in its hook until
every rank has ended or failed (``MPI_Finalize`` would wait for them all the same), so the others
can always post. Every look at the store while waiting is bounded by the wait's own timeout: a
store that stops answering makes a collective time out as usual, never hang.

A process killed outright never reaches its hook; mpiexec itself notices that one.
"""

from __future__ import annotations

import atexit
import sys
import time
from typing import Callable

from minigrad.distributed.runtime.store import StoreError, StoreTimeout

# seconds a failing rank gives its peers to report before it ends the job: longer than rank 0's
# wait for the other ranks' flight-recorder dumps (10 s), so its analysis gets printed
FAILURE_GRACE = 15.0
POLL = 0.05  # seconds between a failing rank's looks at how many ranks have failed
EXIT_ANSWER = 5.0  # seconds an ending rank waits for the store to take its post

_armed: dict | None = None  # the job this process belongs to, while armed


def arm(client, job: str, rank: int, world_size: int, abort: Callable[[], None],
        dump: Callable[[str], object], serves_store: bool = False) -> None:
    """Install the hooks for this rank of ``job`` (``client``: its store; ``abort``: ends every
    rank of the job, ``MPI_Abort``; ``dump(reason)``: writes this rank's flight-recorder ring, for
    the analysis rank 0 prints when its own collective fails; ``serves_store``: the store runs in
    this process)."""
    global _armed
    disarm()
    _armed = {"client": client, "key": f"{job}/failed", "rank": rank, "world_size": world_size,
              "abort": abort, "dump": dump, "previous": sys.excepthook, "job": job,
              "serves_store": serves_store, "store_lost": False, "failed": False}
    sys.excepthook = _report_and_abort
    if not _exit_hook[0]:  # Python's exit hooks run before mpi4py finalizes MPI
        atexit.register(_report_exit)
        _exit_hook[0] = True


def disarm() -> None:
    """Restore the previous ``sys.excepthook`` (``destroy_process_group``)."""
    global _armed
    if _armed is not None and sys.excepthook is _report_and_abort:
        sys.excepthook = _armed["previous"]
    _armed = None


def is_armed() -> bool:
    """Whether this process is a rank of an armed (MPI-started, multi-rank) job."""
    return _armed is not None


def _look(key: str, within: float | None):
    """The value at ``key`` of the armed job's store, or None: not set, not armed, or the store
    lost (it did not answer ``within`` seconds once: it is not asked again)."""
    armed = _armed
    if armed is None or armed["store_lost"]:
        return None
    try:
        return armed["client"].get(key, timeout=0, within=within)
    except StoreTimeout:  # not set
        return None
    except (StoreError, OSError):  # no answer, or no store any more
        armed["store_lost"] = True
        return None


def posted(within: float | None = None) -> str | None:
    """The failure another rank of this job posted (``"rank 1 failed: ..."``), else None; None
    too when the module is not armed or the store does not answer within ``within`` seconds."""
    armed = _armed
    value = None if armed is None else _look(armed["key"], within)
    return None if value is None else str(value)


def exited(ranks, within: float | None = None) -> list[int]:
    """Those of ``ranks`` (global) whose program has ended while the process group was up
    (posted by their exit hook); [] when not armed or the store does not answer."""
    armed = _armed
    if armed is None:
        return []
    return [r for r in ranks if _look(f"{armed['job']}/exited/{r}", within) is not None]


def reason(ranks, within: float | None = None) -> str | None:
    """Why a wait for ``ranks`` (global) will not end: the failure a rank posted, else which of
    ``ranks`` have ended their program; None when neither (or not armed)."""
    failure = posted(within)
    if failure is not None:
        return failure
    gone = exited(ranks, within)
    if gone:
        return (f"rank(s) {gone} ended their program (sys.exit, or the end of the script) "
                "without joining it")
    return None


def _report_exit() -> None:
    """The exit hook: while armed (the process group up, no uncaught exception reported), post
    that this rank's program ended and count it among the stopped ranks; the rank serving the
    store then serves it until every rank has stopped."""
    armed = _armed
    if armed is None or armed["failed"]:
        return
    client, count = armed["client"], f"{armed['key']}/count"
    try:
        client.set(f"{armed['job']}/exited/{armed['rank']}", 1, within=EXIT_ANSWER)
        client.add(count, 1, within=EXIT_ANSWER)
        while armed["serves_store"] and client.add(count, 0) < armed["world_size"]:
            time.sleep(POLL)
    except (StoreError, OSError):
        pass  # the store is gone (its rank failed, or the group was destroyed there)


_exit_hook = [False]  # whether _report_exit is registered (once per process)


def _report_and_abort(exc_type, exc, tb) -> None:
    """The armed ``sys.excepthook``: steps 1 and 3 of the module docstring."""
    armed = _armed
    armed["failed"] = True
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
