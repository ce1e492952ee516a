"""Defaults and environment variables of the distributed runtime, in one place.

Every knob a user can turn without changing code is read here, so its name, default and reason
are written down once (the README's "Distributed runtime" section lists the same table):

=================================  ==========  ==================================================
variable                           default     meaning
=================================  ==========  ==================================================
``MINIGRAD_DIST_TIMEOUT``          300         seconds a collective, receive or store request may
                                               wait before it raises on every waiting rank
``MINIGRAD_DIST_WARN_AFTER``       30          seconds after which a waiting rank logs (once)
                                               what it waits on and which ranks have not arrived
``MINIGRAD_DIST_BACKEND``          auto        backend when the code does not name one
                                               (``cpu``, ``mpi``, ``nccl`` or ``auto``)
``MINIGRAD_DIST_TRANSPORT``        auto        cpu backend transport: ``shm``, ``tcp`` or ``auto``
``MINIGRAD_DIST_SHM_CHUNK``        L2 / 2      bytes per shared-memory round (and p2p ring size);
                                               default half the per-core L2, 128 KiB to 1 MiB
``MINIGRAD_DIST_SHM_HEAP``         /dev/shm    bytes of shared buffers per rank and group (the
                                               size of /dev/shm, at most 64 GiB; virtual until
                                               used); 0: gradient buckets in private memory
``MINIGRAD_DIST_SECRET``           (empty)     store secret (launchers draw a random one); set
                                               the same on every machine of a job
``MINIGRAD_NPROC``                 2           ranks per machine on CPU-only hosts
=================================  ==========  ==================================================

Why 300 s and 30 s: a healthy collective finishes in milliseconds, but a rank may legitimately be
late by tens of seconds (rank 0 writing a checkpoint, a slow data-loader start), so the error
waits long enough not to kill healthy jobs, while the warning comes early enough to show which
rank is stuck long before that. Both can be set per process group (``timeout=``).
"""

from __future__ import annotations

import datetime
import os

DEFAULT_TIMEOUT = 300.0
DEFAULT_WARN_AFTER = 30.0

TIMEOUT_ENV = "MINIGRAD_DIST_TIMEOUT"
WARN_AFTER_ENV = "MINIGRAD_DIST_WARN_AFTER"
BACKEND_ENV = "MINIGRAD_DIST_BACKEND"
TRANSPORT_ENV = "MINIGRAD_DIST_TRANSPORT"
SHM_CHUNK_ENV = "MINIGRAD_DIST_SHM_CHUNK"
SHM_HEAP_ENV = "MINIGRAD_DIST_SHM_HEAP"
SECRET_ENV = "MINIGRAD_DIST_SECRET"
NPROC_ENV = "MINIGRAD_NPROC"
# Set by the launchers for their children (not meant to be set by hand):
JOB_ENV = "MINIGRAD_DIST_JOB"  # job id: names shared-memory files so leftovers can be removed
STORE_ENV = "MINIGRAD_DIST_STORE"  # "external": a launcher runs the store, rank 0 must not
LAUNCHED_ENV = "MINIGRAD_DIST_LAUNCHED"  # "1": this process is a rank of the launch CLI
PREFIXED_ENV = "MINIGRAD_DIST_PREFIXED"  # "1": the launcher prefixes output lines with the rank
#: How many times the launcher has restarted the group (0 on the first start): torchrun's
#: TORCHELASTIC_RESTART_COUNT, set by ``--max_restarts`` and ``@dist.launcher(max_restarts=)``.
RESTART_COUNT_ENV = "MINIGRAD_RESTART_COUNT"


def seconds(value, what: str = "timeout") -> float:
    """``value`` (seconds, or a ``datetime.timedelta`` like PyTorch) as a positive float."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    value = float(value)
    if not value > 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {value}")
    return value


def env_bytes(name: str) -> int | None:
    """The environment variable ``name`` as a number of bytes (an integer >= 0), None when unset;
    anything else raises a ValueError naming the variable."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"{name}={value!r}: expected a number of bytes (an integer >= 0)")
    return count


def default_timeout() -> float:
    """Seconds a collective, receive or store request may wait: ``MINIGRAD_DIST_TIMEOUT`` or 300."""
    return seconds(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT), TIMEOUT_ENV)


def default_warn_after() -> float:
    """Seconds before a waiting rank logs what it waits on: ``MINIGRAD_DIST_WARN_AFTER`` or 30."""
    return seconds(os.environ.get(WARN_AFTER_ENV, DEFAULT_WARN_AFTER), WARN_AFTER_ENV)


def default_backend() -> str:
    """The backend used when the code passes ``"auto"``: ``MINIGRAD_DIST_BACKEND`` or ``"auto"``."""
    return os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
