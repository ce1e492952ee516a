"""``mg.get_logger``, ``logger.set_log_file``, ``logger.set_log_level``: MegEngine's log helpers.

MegEngine programs (its model zoo in dozens of files) write ``logger = mge.get_logger(__name__)``
and later ``mge.logger.set_log_file("log.txt")``. Every logger made by :func:`get_logger` is a
standard :mod:`logging` logger that prints ``time name LEVEL: message`` to stderr and does not
propagate to the root logger (a program that also configures the root logger would otherwise print
each record twice). This module remembers those loggers so that :func:`set_log_level` and
:func:`set_log_file` apply to all of them, the ones made before and the ones made after.

The default level is INFO, or the ``MINIGRAD_LOGGING_LEVEL`` environment variable (a name such as
``DEBUG`` or a number).

Example::

    logger = mg.get_logger(__name__)
    mg.logger.set_log_file("train.log")      # also written to the file from now on
    mg.logger.set_log_level("WARNING")       # quieter, for every logger made here
    logger.warning("epoch %d done", 3)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO

__all__ = ["enable_debug_log", "get_logger", "set_log_file", "set_log_level"]

FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
DATE_FORMAT = "%d %H:%M:%S"
ROOT_NAME = "minigrad"  # get_logger() without a name


def _level(level: int | str) -> int:
    """A logging level from a number or a name (any case); a bad name names the choices."""
    if isinstance(level, int):
        return level
    if isinstance(level, str) and level.strip().isdigit():
        return int(level)
    value = logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ValueError(
            f"set_log_level: level must be a number or one of DEBUG, INFO, WARNING, ERROR, "
            f"CRITICAL, got {level!r}"
        )
    return value


_default_level = _level(os.environ.get("MINIGRAD_LOGGING_LEVEL", "INFO"))
_loggers: list[logging.Logger] = []  # every logger get_logger configured, in creation order
_file_handlers: list[logging.Handler] = []  # set_log_file's handlers: on every logger


class StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (so a test, a notebook or a launcher that swaps it
    sees output). The distributed runtime's logger uses it too."""

    @property
    def stream(self):
        """``sys.stderr`` as it is now."""
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property always wins
        pass


def _formatted(handler: logging.Handler) -> logging.Handler:
    handler.setFormatter(logging.Formatter(FORMAT, datefmt=DATE_FORMAT))
    return handler


def get_logger(name: str | None = None) -> logging.Logger:
    """The logger called ``name`` (default ``"minigrad"``), printing to stderr at the current
    default level and to every file given to :func:`set_log_file`. Asking again for the same name
    returns the same logger, configured once."""
    logger = logging.getLogger(ROOT_NAME if name is None else name)
    if logger in _loggers:
        return logger
    logger.propagate = False
    logger.setLevel(_default_level)
    logger.handlers[:] = [_formatted(StderrHandler()), *_file_handlers]
    _loggers.append(logger)
    return logger


def set_log_level(level: int | str, update_existing: bool = True) -> None:
    """Make ``level`` the level of loggers made from now on and, with ``update_existing`` (the
    default), of every logger :func:`get_logger` already made."""
    global _default_level
    _default_level = _level(level)
    if update_existing:
        for logger in _loggers:
            logger.setLevel(_default_level)


def enable_debug_log() -> None:
    """Log everything, DEBUG included, on every logger (``set_log_level("DEBUG")``)."""
    set_log_level(logging.DEBUG)


def set_log_file(fout: str | os.PathLike | IO[str], mode: str = "a") -> None:
    """Also write every record of every logger (made before or after) to ``fout``: a path, opened
    with ``mode`` (``"a"`` appends, ``"w"`` starts afresh), or an open text file."""
    if isinstance(fout, (str, os.PathLike)):
        handler: logging.Handler = logging.FileHandler(os.fspath(fout), mode=mode)
    elif hasattr(fout, "write"):
        handler = logging.StreamHandler(fout)
    else:
        raise TypeError(f"set_log_file: fout must be a path or a text file, got "
                        f"{type(fout).__name__}")
    _file_handlers.append(_formatted(handler))
    for logger in _loggers:
        logger.addHandler(handler)
