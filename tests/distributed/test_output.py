"""What a multi-rank job prints: every line prefixed with its rank by both launchers (stdout and
stderr kept apart, never mixed within a line), and ``dist.get_logger()``'s rank filter."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import minigrad.distributed as dist
from minigrad.distributed.runtime import log, output
from minigrad.distributed.runtime.output import OutputForwarder
from minigrad.testing.distributed import run_workers

ROOT = Path(__file__).resolve().parents[2]
N_LINES = 1000
HANG = 120  # seconds: only bounds a hang, never part of what a test expects
PAD = "x" * 150  # long lines: a torn write would show up as a line without its prefix

PRINTER = textwrap.dedent(
    f"""
    import sys
    import minigrad.distributed as dist
    dist.init_process_group()
    r = dist.get_rank()
    for i in range({N_LINES}):
        print(f"out {{r}} {{i}} {PAD}")
        if i % 4 == 0:
            print(f"err {{r}} {{i}}", file=sys.stderr)
    sys.stdout.write("no newline at the end")
    """
)


def _check_stream(text: str, kind: str, n_ranks: int, expect: int) -> None:
    seen = {r: [] for r in range(n_ranks)}
    pad = f" {PAD}" if kind == "out" else ""
    pattern = re.compile(rf"\[rank (\d)\] {kind} (\d) (\d+){pad}")
    for line in text.splitlines():
        if "no newline at the end" in line:
            assert re.fullmatch(r"\[rank \d\] no newline at the end", line), line
            continue
        m = pattern.fullmatch(line)
        assert m is not None, f"mixed or unprefixed {kind} line: {line[:120]!r}"
        assert m.group(1) == m.group(2)
        seen[int(m.group(1))].append(int(m.group(3)))
    for r in range(n_ranks):
        assert seen[r] == list(range(0, N_LINES, 1 if kind == "out" else 4))[:expect]


def test_launch_cli_prefixes_every_line_and_keeps_streams_apart(tmp_path):
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")  # 2 CPU ranks anywhere
    cmd = [sys.executable, "-m", "minigrad.distributed.launch", "--nproc_per_node", "2",
           str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _check_stream(proc.stdout, "out", 2, N_LINES)
    _check_stream(proc.stderr, "err", 2, N_LINES // 4)
    assert proc.stdout.count("no newline at the end") == 2


def _fork_printer():
    r = dist.get_rank()
    for i in range(N_LINES):
        print(f"out {r} {i} {PAD}")
        if i % 4 == 0:
            print(f"err {r} {i}", file=sys.stderr)
    return r


def test_fork_launcher_prefixes_every_line(capfd):
    assert run_workers(_fork_printer, 2) == [0, 1]
    out, err = capfd.readouterr()
    _check_stream(out, "out", 2, N_LINES)
    _check_stream(err, "err", 2, N_LINES // 4)


def _log_from_every_rank():
    logger = dist.get_logger()
    logger.info("step %d done", 7)
    logger.warning("disk almost full")
    dist.get_logger("pipeline").info("stage ready")
    return logger.name


def test_logger_info_from_rank_zero_warnings_from_all(capfd):
    assert run_workers(_log_from_every_rank, 2) == ["minigrad.distributed"] * 2
    err = capfd.readouterr().err.splitlines()
    assert err.count("[rank 0] INFO minigrad.distributed: step 7 done") == 1
    assert err.count("[rank 0] INFO minigrad.distributed.pipeline: stage ready") == 1
    assert not [ln for ln in err if ln.startswith("[rank 1] INFO")]
    for r in range(2):  # one prefix: the launcher's (the logger leaves its own out)
        assert err.count(f"[rank {r}] WARNING minigrad.distributed: disk almost full") == 1


def test_logger_prefixes_itself_outside_the_launchers(monkeypatch):
    monkeypatch.delenv("MINIGRAD_DIST_PREFIXED", raising=False)
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    logger = dist.get_logger()
    try:
        log.set_rank(3)
        logger.info("hidden on rank 3")
        logger.error("shown on rank 3")
        log.set_rank(0)
        logger.info("shown on rank 0")
        logger.debug("debug is off by default")
    finally:
        log.set_rank(0)
    assert buf.getvalue().splitlines() == [
        "[rank 3] ERROR minigrad.distributed: shown on rank 3",
        "[rank 0] INFO minigrad.distributed: shown on rank 0",
    ]
    assert logger.level == logging.INFO and not logger.propagate


# --- the forwarder itself: no line lost, whatever the timing -------------------------------------


class _Recorder:
    """A stand-in for sys.stdout/sys.stderr that remembers what was written and lets a test wait
    (on a condition, not a sleep) until a given text arrived."""

    def __init__(self, cond: threading.Condition):
        self._cond = cond
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        with self._cond:
            self._parts.append(text)
            self._cond.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        with self._cond:
            return "".join(self._parts)


def _start_rank(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _hand_over(forwarder: OutputForwarder, rank: int, proc: subprocess.Popen) -> None:
    forwarder.add(rank, os.dup(proc.stdout.fileno()), "stdout")
    forwarder.add(rank, os.dup(proc.stderr.fileno()), "stderr")
    proc.stdout.close()
    proc.stderr.close()


def _lines_of(code_rank: int, n: int) -> str:
    return textwrap.dedent(
        f"""
        import sys
        for i in range({n}):
            sys.stdout.write("out {code_rank} %d {PAD}\\n" % i)
            if i % 3 == 0:
                sys.stderr.write("err {code_rank} %d\\n" % i)
        sys.stdout.write("last out {code_rank}")
        sys.stderr.write("last err {code_rank}")
        """
    )


def _check_rank_lines(text: str, kind: str, n_ranks: int, n: int) -> None:
    pad = f" {PAD}" if kind == "out" else ""
    pattern = re.compile(rf"\[rank (\d+)\] {kind} (\d+) (\d+){pad}")
    seen: dict[int, list[int]] = {r: [] for r in range(n_ranks)}
    last = []
    for line in text.splitlines():
        if line.startswith("[rank ") and f"] last {kind} " in line:
            m = re.fullmatch(rf"\[rank (\d+)\] last {kind} (\d+)", line)
            assert m is not None and m.group(1) == m.group(2), line[:120]
            last.append(int(m.group(1)))
            continue
        m = pattern.fullmatch(line)
        assert m is not None, f"mixed or unprefixed {kind} line: {line[:120]!r}"
        assert m.group(1) == m.group(2), line[:120]
        seen[int(m.group(1))].append(int(m.group(3)))
    step = 1 if kind == "out" else 3
    for r in range(n_ranks):
        assert seen[r] == list(range(0, n, step)), f"rank {r}: {kind} lines lost or reordered"
    assert sorted(last) == list(range(n_ranks))


def _record(monkeypatch):
    """Replace sys.stdout/sys.stderr (inside the test: pytest re-installs its own capture
    between a fixture's setup and the test's call) with recorders sharing one condition."""
    cond = threading.Condition()
    out, err = _Recorder(cond), _Recorder(cond)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return cond, out, err


def test_forwarder_keeps_forwarding_after_a_rank_ended_before_the_next_started(monkeypatch):
    cond, out, err = _record(monkeypatch)
    forwarder = OutputForwarder()
    try:
        first = _start_rank(_lines_of(0, 50))
        _hand_over(forwarder, 0, first)
        first.wait(timeout=HANG)
        # both pipes of rank 0 reached their end: the unterminated last lines are only written
        # then, so wait for them (the event itself, bounded only against a hang)
        with cond:
            assert cond.wait_for(
                lambda: "[rank 0] last out 0" in out.text() and "[rank 0] last err 0" in err.text(),
                timeout=HANG,
            )
        later = [_start_rank(_lines_of(r, 50)) for r in (1, 2)]
        for r, proc in zip((1, 2), later):
            _hand_over(forwarder, r, proc)
        for proc in later:
            proc.wait(timeout=HANG)
    finally:
        forwarder.close()
    _check_rank_lines(out.text(), "out", 3, 50)
    _check_rank_lines(err.text(), "err", 3, 50)


def test_forwarder_delivers_thousands_of_lines_from_ranks_that_exit_at_once(monkeypatch):
    _, out, err = _record(monkeypatch)
    forwarder = OutputForwarder()
    n_ranks, n = 4, 5000
    procs = [_start_rank(_lines_of(r, n)) for r in range(n_ranks)]
    try:
        for r, proc in enumerate(procs):
            _hand_over(forwarder, r, proc)
        for proc in procs:
            proc.wait(timeout=HANG)
    finally:
        forwarder.close()  # called right after the ranks were reaped, as the launchers do
    _check_rank_lines(out.text(), "out", n_ranks, n)
    _check_rank_lines(err.text(), "err", n_ranks, n)


def test_forwarder_abandons_only_a_pipe_an_orphaned_grandchild_holds(monkeypatch):
    _, out, err = _record(monkeypatch)
    monkeypatch.setattr(output, "ORPHAN_GRACE", 0.5)  # how long a silent open pipe is waited for
    forwarder = OutputForwarder()
    code = textwrap.dedent(
        """
        import subprocess, sys
        # inherits stdout/stderr and outlives us (the test kills it)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("grandchild", child.pid)
        print("rank done")
        """
    )
    rank = _start_rank(code)
    grandchild = None
    try:
        _hand_over(forwarder, 5, rank)
        rank.wait(timeout=HANG)
        forwarder.close()  # returns although the grandchild still holds both pipes
        lines = out.text().splitlines()
        grandchild = int(next(ln for ln in lines if "grandchild" in ln).split()[-1])
        assert lines[-1] == "[rank 5] rank done"  # the rank's own output all arrived
        warnings = [ln for ln in err.text().splitlines() if "still held open" in ln]
        assert len(warnings) == 2 and all("rank 5's" in w for w in warnings), err.text()
    finally:
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
