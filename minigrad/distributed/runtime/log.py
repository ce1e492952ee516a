"""``dist.get_logger()``: one logger for a multi-rank job that does not drown the terminal.

Every rank runs the same code, so a plain ``logging.info`` prints the same line N times. The
distributed logger lets INFO (and DEBUG, when enabled) through on rank 0 only, and WARNING and above
on every rank, each line starting with ``[rank N]`` (PyTorch's and DeepSpeed's convention). Under
``@dist.launcher`` and ``python -m minigrad.distributed.launch`` the launcher already prefixes every
output line with the rank, so the logger then leaves the prefix out instead of printing it twice.

Example::

    log = dist.get_logger()
    log.info("epoch %d: loss %.3f", epoch, loss)    # printed once, by rank 0
    log.warning("rank-local problem")               # printed by whichever rank hits it
"""

from __future__ import annotations

import logging
import os

from minigrad.distributed.runtime.settings import PREFIXED_ENV
from minigrad.logger import StderrHandler

LOGGER_NAME = "minigrad.distributed"

_rank = 0


def set_rank(rank: int) -> None:
    """Record this process's global rank for log lines (called by ``init_process_group``)."""
    global _rank
    _rank = int(rank)


class _RankFilter(logging.Filter):
    """INFO and below on rank 0 only; WARNING and above on every rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _rank == 0


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if os.environ.get(PREFIXED_ENV) == "1":
            return line
        return f"[rank {_rank}] {line}"


class _RankHandler(StderrHandler):
    """The distributed logger's handler: writes to the *current* ``sys.stderr`` (launchers and
    test harnesses replace it), through the rank filter and the rank prefix."""

    def __init__(self):
        super().__init__()
        self.addFilter(_RankFilter())
        self.setFormatter(_RankFormatter("%(levelname)s %(name)s: %(message)s"))


def get_logger(name: str | None = None) -> logging.Logger:
    """The rank-aware logger (``minigrad.distributed`` or a child of it named ``name``).

    It does not propagate to the root logger (that would print every record twice); add handlers to
    it, or set its level, like any ``logging.Logger``.
    """
    base = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _RankHandler) for h in base.handlers):
        base.addHandler(_RankHandler())
        base.setLevel(logging.INFO)
        base.propagate = False
    if name is None or name == LOGGER_NAME:
        return base
    if not name.startswith(LOGGER_NAME + "."):
        name = f"{LOGGER_NAME}.{name}"
    return logging.getLogger(name)
