"""Lockstep checks: ranks that run different global ops get an error naming the op, not a hang.

Global tensors only work when every rank of a placement runs the same global ops in the same
order (a rank-dependent branch breaks that). Each rank keeps, per placement, a running *digest* of
the global ops it ran there: a hash chained over every op's fingerprint (op name, sequence number,
logical shapes, SBPs), plus readable lines for the last ops. Comparing digests costs nothing until
ranks talk anyway, so the check rides on communication that happens regardless:

* every collective of a redistribution carries this rank's digest (and last ops) as its ``check``
  string, which the backend folds into the fingerprint its members compare before moving data
  (:func:`checked`): no extra message. Any difference raises :class:`LockstepError` on every rank
  of the group, naming each rank's ops; a rank that never arrives makes the others raise the same
  error, naming the op they wait in, when the collective times out;
* a point-to-point transfer (a change of placement) first sends the transfer's fingerprint, which
  the receiver compares with its own.

``set_lockstep_check(False)`` (or ``MINIGRAD_GLOBAL_CHECK=0``) turns the comparison off.

Example of the error, on every rank::

    LockstepError: global ops diverged on placement(type="cpu", ranks=[0, 1]): rank 0 is at
    global op #3 to_global(... ) after 'add ...', rank 1 is at #2 ...
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import numpy as np

from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.providers.base import CollectiveError, CollectiveMismatchError

__all__ = ["LockstepError", "is_lockstep_check_enabled", "record", "set_lockstep_check",
           "checked", "send_fingerprint", "check_fingerprint"]

_TEXT = 488  # characters of the last ops a check string carries (its end is kept)
_KEEP = 3  # the ops a rank reports when the digests differ
_ENABLED = os.environ.get("MINIGRAD_GLOBAL_CHECK", "1") != "0"


class LockstepError(RuntimeError):
    """Ranks of a placement ran different global ops (or one never arrived)."""


class _History:
    """This rank's global ops on one placement: count, chained digest and the last ops' lines."""

    __slots__ = ("seq", "digest", "recent")

    def __init__(self):
        self.seq, self.digest, self.recent = 0, b"\0" * 16, []

    @property
    def last(self) -> str:
        return self.recent[-1] if self.recent else "(no global op yet)"


_HISTORY: dict = {}
_CHANNELS: dict = {}  # (src rank, dst rank) -> transfers so far


def set_lockstep_check(enabled: bool) -> None:
    """Turn the cross-rank comparison of global-op fingerprints on (default) or off."""
    global _ENABLED
    _ENABLED = bool(enabled)


def is_lockstep_check_enabled() -> bool:
    """Whether fingerprints are compared (see :func:`set_lockstep_check`)."""
    return _ENABLED


def _history(placement) -> _History:
    h = _HISTORY.get(placement)
    if h is None:
        h = _HISTORY[placement] = _History()
    return h


def record(placement, what: str) -> str:
    """Count a global op this rank runs on ``placement`` and chain its fingerprint ``what`` into
    the digest; returns the op's line (``#seq what``) for error messages."""
    h = _history(placement)
    h.seq += 1
    line = f"#{h.seq} {what}"
    h.recent = (h.recent + [line])[-_KEEP:]
    h.digest = hashlib.blake2b(h.digest + line.encode(), digest_size=16).digest()
    return line


def _check_string(h: _History) -> str:
    """The ``check`` string of this rank's next collective on a placement: the digest (what is
    compared) and the last ops (what an error shows)."""
    return f"{h.digest.hex()} {(' then '.join(h.recent) or h.last)[-_TEXT:]}"


def _ops_of(check) -> str:
    """The readable part of a member's ``check`` string."""
    if not isinstance(check, str):
        return "a collective without a lockstep check"
    return check.partition(" ")[2]


@contextlib.contextmanager
def checked(placement, ranks: list, doing: str):
    """Around one collective of a redistribution among ``ranks`` (a slice of ``placement``):
    yields the ``check`` string to pass to it (None when the check is off), and turns the
    collective's errors into :class:`LockstepError` on all of those ranks: different digests
    ("global ops diverged", naming each rank's ops) or a rank that did not arrive."""
    if not _ENABLED:
        yield None
        return
    h = _history(placement)
    try:
        yield _check_string(h)
    except CollectiveMismatchError as exc:
        checks = [call.get("check") for call in exc.calls]
        if len(set(checks)) <= 1:
            raise  # the same global ops, yet different calls: not a divergence of global ops
        listing = "; ".join(f"rank {r} ran {_ops_of(c)}" for r, c in zip(exc.ranks, checks))
        raise LockstepError(
            f"global ops diverged on {placement} at {doing}: {listing}. Every rank of a "
            "placement must run the same global ops in the same order (is there a "
            "rank-dependent branch?)"
        ) from None
    except CollectiveError as exc:
        raise LockstepError(
            f"global op {h.last} on {placement}: rank {ranks} did not all arrive at {doing} "
            f"({type(exc).__name__}: {exc}). Every rank of a placement must run the same global "
            "ops in the same order (is there a rank-dependent branch?)"
        ) from None


def _transfer_line(src: int, dst: int, what: str) -> str:
    n = _CHANNELS.get((src, dst), 0) + 1
    _CHANNELS[(src, dst)] = n
    return f"transfer #{n} from rank {src} to rank {dst}: {what}"


def send_fingerprint(src: int, dst: int, what: str) -> None:
    """The sender's side of a checked point-to-point transfer (call before sending the data)."""
    line = _transfer_line(src, dst, what)
    if _ENABLED:
        comm.send(np.frombuffer(line.encode(), dtype=np.uint8).copy(), dst)


def check_fingerprint(src: int, dst: int, what: str) -> None:
    """The receiver's side: the sender's fingerprint must equal this rank's."""
    line = _transfer_line(src, dst, what)
    if not _ENABLED:
        return
    try:
        theirs = np.asarray(comm.recv(src)).tobytes().decode(errors="replace")
    except CollectiveError as exc:
        raise LockstepError(
            f"{line}: rank {src} never sent it ({type(exc).__name__}: {exc}). Every rank must run "
            "the same global ops in the same order (is there a rank-dependent branch?)"
        ) from None
    if theirs != line:
        raise LockstepError(
            f"global ops diverged: rank {dst} expects {line!r} but rank {src} sent {theirs!r}. "
            "Every rank must run the same global ops in the same order (is there a "
            "rank-dependent branch?)"
        )
