"""What a multi-rank job prints: every line prefixed with its rank by both launchers (stdout and
stderr kept apart, never mixed within a line), and ``dist.get_logger()``'s rank filter."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import minigrad.distributed as dist
from minigrad.distributed.runtime import log
from minigrad.testing.distributed import run_workers

ROOT = Path(__file__).resolve().parents[2]
N_LINES = 1000
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
