"""Waiting on an event in a test, never on the clock: :func:`wait_until` polls a condition (a file
written, a process gone) until it holds, with a generous deadline that only bounds a hang, so a
test gives the same answer on an idle machine and on one whose cores are all busy."""

from __future__ import annotations

import time
from typing import Callable

HANG = 120.0  # seconds: long enough never to be reached by a live but slow machine
POLL = 0.01  # seconds between two looks at the condition


def wait_until(condition: Callable[[], object], what: str, timeout: float = HANG):
    """Return ``condition()``'s first true value, checking it every ``POLL`` seconds; raise
    ``TimeoutError`` naming ``what`` when it is still false after ``timeout`` seconds (a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"wait_until: still waiting for {what} after {timeout:g} s")
        time.sleep(POLL)
