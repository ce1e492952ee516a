"""How a rank waits for its peers: a back-off loop and the watchdog that bounds it.

:class:`Waiter` polls a condition the cheapest way that still behaves when ranks share cores:
spin first (a peer that has its own core usually arrives within microseconds, and any syscall would
cost more than that), then yield the core (an oversubscribed peer may need it to make progress),
then sleep in short and finally longer steps (a peer that is seconds late must not cost a core).
When the job has more ranks on this host than there are CPUs, there is no spinning at all: the
peer a rank waits for is then often waiting for that very core (:func:`polls`). Sleeping on a
futex instead was measured slower for data-parallel steps on a 2-core VM. Waits on MPI requests
yield early and never sleep: MPI moves data only while a rank is inside an MPI call, and a rank
that spins without yielding can starve a peer sharing its core (measured: a 16 MiB all-reduce
polled without yielding took 16 ms, yielding every 16 polls 5.4 ms, like MPI_Wait).

:class:`Watchdog` bounds every wait of the runtime: after the group's ``warn_after`` seconds it logs
once, on this rank, what it waits on (op, sequence number, group) and which ranks have not
arrived; at the group's ``timeout`` it raises :class:`CollectiveTimeoutError` with the same facts.
Every waiting rank runs its own watchdog, so every one of them reports and raises. In a job that
mpiexec started, it also raises as soon as another rank posts that it failed.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from minigrad.backend.threads import available_cores
from minigrad.distributed.comm import recorder
from minigrad.distributed.comm.providers.base import CollectiveError, CollectiveTimeoutError
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime.log import get_logger

SPIN_POLLS = 3000  # about 100 us of busy polling: the usual wait when each rank has a core
OVERSUBSCRIBED_POLLS = 1  # more ranks than CPUs on the host: yield at once (see polls)
YIELD_POLLS = 5000  # then sched_yield: lets a peer that shares this core run
SHORT_SLEEP_POLLS = 20000  # then 0.2 ms naps (a few ms late: still quick to notice)
SHORT_SLEEP = 0.0002
LONG_SLEEP = 0.001  # beyond that the peer is far behind: 1 ms naps cost almost nothing
CHECK_INTERVAL = 0.2  # seconds between slow checks (dead peers, watchdog)
CHECK_EVERY = 64  # polls between clock reads once sleeping


_oversubscribed = False  # more ranks of this job on this host than CPUs (set_ranks_on_host)


def set_ranks_on_host(count: int) -> None:
    """Tell the waits how many ranks of the job run on this host (``init_process_group``)."""
    global _oversubscribed
    _oversubscribed = count > available_cores()


def polls(usual: int) -> int:
    """How many times a wait polls before it yields its core: ``usual``, or
    :data:`OVERSUBSCRIBED_POLLS` when more ranks share this host than there are CPUs for them,
    since the peer a rank waits for may need that very core (measured on 2 cores, 4 ranks, a
    4 KiB all-reduce on shared memory: 486 us a call spinning first, 25 us yielding at once;
    raw MPI 30 us)."""
    return OVERSUBSCRIBED_POLLS if _oversubscribed else usual


class Watchdog:
    """Bounds one wait: warns once after ``warn_after`` seconds, raises at ``timeout``.

    ``what`` describes the wait (``"all_reduce#3(...) in group [0, 1]"``); ``missing()`` returns
    the ranks that have not arrived (asked only when a message is written).
    """

    def __init__(
        self,
        what: str | Callable[[], str],
        timeout: float,
        warn_after: float,
        rank: int,
        missing: Callable[[], list[int]],
    ):
        self.start = time.monotonic()
        self._what, self.timeout, self.warn_after = what, timeout, warn_after
        self.rank, self._missing = rank, missing
        self.warned = False

    def what(self) -> str:
        """The description of the wait."""
        return self._what() if callable(self._what) else self._what

    def missing(self) -> str:
        """The ranks that have not arrived, as text (never raises: it is for a message)."""
        try:
            return str(sorted(self._missing()))
        except Exception as exc:  # the report must not hide the wait it reports on
            return f"unknown ({type(exc).__name__}: {exc})"

    def _missing_ranks(self) -> list[int]:
        """The ranks that have not arrived; [] when that cannot be told."""
        try:
            return sorted(self._missing())
        except Exception:  # noqa: BLE001 - only a sharper message is lost
            return []

    def elapsed(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - self.start

    def poll(self) -> None:
        """Call regularly while waiting: logs the warning once, raises at the timeout, and raises
        at once when another rank of an MPI-started job posted its failure, or when a rank it
        waits for has ended its program (see :mod:`~minigrad.distributed.runtime.failures`)."""
        if failures.is_armed():
            within = max(self.timeout - self.elapsed(), 1.0)  # a silent store: time out as usual
            failure = failures.reason(self._missing_ranks(), within)
            if failure is not None:
                raise CollectiveError(f"{self.what()}: {failure}; rank {self.rank} stops waiting")
        elapsed = self.elapsed()
        if elapsed >= self.timeout:
            raise CollectiveTimeoutError(
                f"{self.what()} timed out after {self.timeout:g} s on rank {self.rank} waiting for "
                f"rank(s) {self.missing()} (did they skip this collective, hang, or crash?)"
            )
        if not self.warned and elapsed >= self.warn_after:
            self.warned = True
            dumped = recorder.on_watchdog_warning(self.what())
            get_logger().warning(
                "%s: rank %d has waited %.1f s; rank(s) %s have not arrived (timeout after %g s)"
                "; flight recorder: %s", self.what(), self.rank, elapsed, self.missing(),
                self.timeout, dumped,
            )


class Waiter:
    """Back-off for a polling loop: ``while not ready(): waiter.pause()``.

    Every :data:`CHECK_INTERVAL` seconds ``check()`` runs (e.g. "did a peer die?"; it raises to
    abort) and then the watchdog polls.
    """

    def __init__(self, watchdog: Watchdog, check: Callable[[], None] | None = None,
                 spin_polls: int = SPIN_POLLS, yield_polls: float = YIELD_POLLS):
        self.watchdog, self.check = watchdog, check
        self.spin_polls, self.yield_polls = polls(spin_polls), yield_polls
        self.n = 0
        self.next_check = time.monotonic() + CHECK_INTERVAL

    def pause(self) -> None:
        """Back off once (spin, yield or sleep, by how long this wait has lasted)."""
        self.n += 1
        if self.n < self.spin_polls:
            return
        if self.n < self.yield_polls:
            os.sched_yield()
        else:
            time.sleep(SHORT_SLEEP if self.n < SHORT_SLEEP_POLLS else LONG_SLEEP)
        if self.n % CHECK_EVERY == 0:
            now = time.monotonic()
            if now >= self.next_check:
                self.next_check = now + CHECK_INTERVAL
                if self.check is not None:
                    self.check()
                self.watchdog.poll()
