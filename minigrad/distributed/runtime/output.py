"""Rank-prefixed output of launched ranks: ``[rank 1] loss 0.25``.

Each rank's stdout and stderr go to pipes read by one thread of the launcher, which writes every
complete line to its own stdout or stderr (kept apart) with the rank in front, one write per line
under a lock: lines of different ranks never mix within a line, however fast the ranks print. A
last line without a newline is flushed when the rank exits.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading

READ_BYTES = 1 << 16
DRAIN_WAIT = 2.0  # seconds close() waits for the ranks' last output


class OutputForwarder:
    """Reads the ranks' pipes and writes their lines, prefixed, to this process's streams."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._open = 0
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._stopping = False

    def add(self, rank: int, fd: int, stream: str) -> None:
        """Forward the pipe ``fd`` (this process owns it) as ``stream`` ("stdout"/"stderr")."""
        self._partial[fd] = b""
        self._open += 1
        self._sel.register(fd, selectors.EVENT_READ, (f"[rank {rank}] ".encode(), stream))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mg-output", daemon=True)
            self._thread.start()

    def _write(self, stream: str, data: bytes) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        text = data.decode("utf-8", errors="replace")
        with self._lock:
            out.write(text)
            out.flush()

    def _loop(self) -> None:
        while self._open and not self._stopping:
            for key, _ in self._sel.select():
                if key.data is None:  # woken by close()
                    os.read(self._wake_r, 64)
                else:
                    self._read(key.fd, *key.data)

    def _read(self, fd: int, prefix: bytes, stream: str) -> None:
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:
            chunk = b""
        buf = self._partial[fd] + chunk
        if not chunk:  # the rank closed its end: flush what is left
            self._sel.unregister(fd)
            os.close(fd)
            self._open -= 1
            if buf:
                self._write(stream, prefix + buf + b"\n")
            return
        *lines, rest = buf.split(b"\n")
        self._partial[fd] = rest
        if lines:
            self._write(stream, b"".join(prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        """Wait (briefly) until every rank's pipe reached its end, then stop (a pipe still held
        open, e.g. by an orphaned grandchild, is abandoned)."""
        if self._thread is not None:
            self._thread.join(DRAIN_WAIT)
            self._stopping = True
            os.write(self._wake_w, b"x")
            self._thread.join(DRAIN_WAIT)
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                os.close(key.fd)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
