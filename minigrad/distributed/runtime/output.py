"""Rank-prefixed output of launched ranks: ``[rank 1] loss 0.25``.

Each rank's stdout and stderr go to pipes read by one thread of the launcher, which writes every
complete line to its own stdout or stderr (kept apart) with the rank in front, one write per line
under a lock: lines of different ranks never mix within a line, however fast the ranks print. A
last line without a newline is flushed when the rank's pipe reaches its end.

No line a rank wrote is lost, whatever the timing: the thread lives until the launcher called
:meth:`OutputForwarder.close` (after it reaped every rank) *and* every pipe reached its end, so a
rank that finishes before the next one is even started does not end the forwarding. The only
output ever abandoned is that of a pipe still held open by a process outliving its rank (an
orphaned grandchild): once the ranks are gone, a pipe that stays silent for ``ORPHAN_GRACE``
seconds without reaching its end (or keeps being written for ``ORPHAN_LIMIT`` seconds) is
closed with a warning naming the rank.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
import time

READ_BYTES = 1 << 16
ORPHAN_GRACE = 10.0  # seconds a pipe may stay silent and open after close() before it is abandoned
ORPHAN_LIMIT = 120.0  # seconds after close() a still-written pipe (a grandchild's) is abandoned


class OutputForwarder:
    """Reads the ranks' pipes and writes their lines, prefixed, to this process's streams."""

    def __init__(self):
        self._sel = selectors.DefaultSelector()
        self._partial: dict[int, bytes] = {}
        self._lock = threading.Lock()  # one write at a time on this process's streams
        self._state = threading.Lock()  # guards _pending and _closing (the caller's side)
        self._pending: list[tuple[int, int, str]] = []  # (rank, fd, stream) not yet registered
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    def add(self, rank: int, fd: int, stream: str) -> None:
        """Forward the pipe ``fd`` (this process owns it) as ``stream`` ("stdout"/"stderr")."""
        with self._state:
            if self._closing:
                raise RuntimeError("OutputForwarder.add: the forwarder is already closed")
            self._pending.append((rank, fd, stream))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mg-output", daemon=True)
            self._thread.start()
        self._wake()

    def _wake(self) -> None:
        os.write(self._wake_w, b"x")

    def _write(self, stream: str, data: bytes) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        text = data.decode("utf-8", errors="replace")
        with self._lock:
            out.write(text)
            out.flush()

    def _take_pending(self) -> bool:
        """Register the pipes handed over by add(); True once close() was called."""
        with self._state:
            pending, self._pending = self._pending, []
            closing = self._closing
        for rank, fd, stream in pending:
            self._partial[fd] = b""
            self._sel.register(fd, selectors.EVENT_READ, (rank, stream))
        return closing

    def _loop(self) -> None:
        closed_at = None  # monotonic time close() was seen
        while True:
            closing = self._take_pending()
            if closing and closed_at is None:
                closed_at = time.monotonic()
            pipes = len(self._sel.get_map()) - 1
            if closing and pipes == 0:
                return
            # before close() wait for events without limit; after it, bound the wait so a pipe
            # an orphaned grandchild keeps open cannot hold the launcher forever
            events = self._sel.select(ORPHAN_GRACE if closing else None)
            for key, _ in events:
                if key.data is None:
                    os.read(self._wake_r, 4096)
                else:
                    self._read(key.fd, *key.data)
            if closed_at is not None:
                if not events or time.monotonic() - closed_at > ORPHAN_LIMIT:
                    self._abandon_open_pipes()

    def _read(self, fd: int, rank: int, stream: str) -> None:
        try:
            chunk = os.read(fd, READ_BYTES)
        except OSError:
            chunk = b""
        prefix = f"[rank {rank}] ".encode()
        buf = self._partial[fd] + chunk
        if not chunk:  # every writer closed its end: flush what is left
            self._sel.unregister(fd)
            os.close(fd)
            del self._partial[fd]
            if buf:
                self._write(stream, prefix + buf + b"\n")
            return
        *lines, rest = buf.split(b"\n")
        self._partial[fd] = rest
        if lines:
            self._write(stream, b"".join(prefix + line + b"\n" for line in lines))

    def _abandon_open_pipes(self) -> None:
        """Close the pipes still open although their ranks were reaped, saying so per rank."""
        for key in list(self._sel.get_map().values()):
            if key.data is None:
                continue
            rank, stream = key.data
            rest = self._partial.pop(key.fd)
            self._sel.unregister(key.fd)
            os.close(key.fd)
            if rest:
                self._write(stream, f"[rank {rank}] ".encode() + rest + b"\n")
            self._write(
                "stderr",
                f"launcher: rank {rank}'s {stream} is still held open by another process (an "
                f"orphaned child of the rank?) after the rank exited; abandoning its further "
                f"output\n".encode(),
            )

    def close(self) -> None:
        """Call after every rank process was reaped: forward everything still in the pipes (no
        fixed deadline: a pipe ends when its rank's last writer is gone), then stop. Only a pipe
        an orphaned grandchild still holds open is abandoned, with a warning naming the rank."""
        with self._state:
            self._closing = True
        if self._thread is not None:
            self._wake()
            self._thread.join()
        with self._state:
            leftover = self._pending
            self._pending = []
        for _, fd, _ in leftover:
            os.close(fd)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
