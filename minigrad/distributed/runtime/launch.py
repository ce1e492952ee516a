"""``python -m minigrad.distributed.launch``: start a training script on every local rank.

Example (one machine, two ranks, logs in ./logs/rank0.log and rank1.log)::

    python -m minigrad.distributed.launch --nproc_per_node 2 --logdir logs train.py --lr 0.1

Two machines: run it on both with ``--nnodes 2 --node_rank {0,1} --master_addr HOST0
--master_port 29500`` and the same ``MINIGRAD_DIST_SECRET``. Node 0 runs the rendezvous store.
Each rank gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the
store secret, so ``dist.init_process_group()`` needs no arguments. Without ``--logdir`` every line a
rank prints appears here prefixed with ``[rank N]`` (stdout and stderr kept apart, lines never
mixed). When a rank fails, the others are terminated and the launcher exits non-zero naming the
rank (and the end of its log). With ``--max_restarts N`` (torchrun's flag) the whole group is
then started again, with a new rendezvous, up to N times; each rank sees the start number in
``MINIGRAD_RESTART_COUNT`` and resumes from ``dist.checkpoint.latest(...)``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from minigrad.distributed.comm import recorder
from minigrad.distributed.comm.providers.cpu import remove_job_segments
from minigrad.distributed.runtime import store as _store
from minigrad.distributed.runtime.env import rank_environment
from minigrad.distributed.runtime.launcher import (
    DEFAULT_NPROC,
    become_rank_process,
    describe_exit,
    kill_tree,
    start_job_store,
    visible_gpu_count,
)
from minigrad.distributed.runtime.output import OutputForwarder
from minigrad.distributed.runtime.settings import NPROC_ENV, RESTART_COUNT_ENV

POLL_INTERVAL = 0.05  # seconds between checks of the ranks' exit status
TAIL_LINES = 30  # lines of a failed rank's log quoted in the error


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m minigrad.distributed.launch",
        description="Run a minigrad training script on several ranks.",
    )
    p.add_argument("--nproc_per_node", type=int, default=None, help="ranks on this machine")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node_rank", type=int, default=0)
    p.add_argument("--master_addr", default="127.0.0.1")
    p.add_argument("--master_port", type=int, default=0, help="store port (0: any free port)")
    p.add_argument("--logdir", default=None, help="write rank{i}.log files here")
    p.add_argument("--max_restarts", type=int, default=0,
                   help="when a rank fails, stop the others and start the group again, up to "
                        "this many times (torchrun's flag; the script resumes from its latest "
                        "checkpoint, MINIGRAD_RESTART_COUNT says which start this is)")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def _tail(path: str | None, n: int = TAIL_LINES) -> str:
    if path is None:
        return ""
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()[-n:]
    except OSError:
        return ""
    return "\n--- last lines of " + path + " ---\n" + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the job; return the exit status (0 when every rank succeeded). With
    ``--max_restarts N`` a failed group is stopped and started again (a new rendezvous) up to N
    times."""
    a = _parse(argv)
    if a.max_restarts < 0:
        print(f"launch: --max_restarts must be >= 0, got {a.max_restarts}", file=sys.stderr)
        return 2
    for restart in range(a.max_restarts + 1):
        code = _run_group(a, restart)
        if code != 1 or restart == a.max_restarts:
            return code
        print(f"launch: restarting the group (restart {restart + 1} of {a.max_restarts})",
              file=sys.stderr)
    return 1


def _run_group(a: argparse.Namespace, restart: int) -> int:
    """Start every local rank once (start number ``restart``) and wait: 0 when all succeeded,
    1 when a rank failed (the others are stopped), 2 on a usage error, 130 when interrupted."""
    gpus = visible_gpu_count("xpu")
    nproc = a.nproc_per_node or (gpus or int(os.environ.get(NPROC_ENV, DEFAULT_NPROC)))
    if gpus and nproc > gpus:
        print(f"launch: {nproc} ranks per node but {gpus} visible GPU(s), and each rank needs a "
              "GPU of its own: running the ranks on the CPU", file=sys.stderr)
        gpus = 0
    world = nproc * a.nnodes
    if a.nnodes > 1 and (not a.master_port or not os.environ.get(_store.SECRET_ENV)):
        print(
            "launch: multi-node jobs need --master_port and the same MINIGRAD_DIST_SECRET "
            "on every node",
            file=sys.stderr,
        )
        return 2
    server, port, secret, job = start_job_store(a.node_rank == 0, a.master_port)
    user_threads = any(v in os.environ for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    threads = str(max(1, (os.cpu_count() or 1) // nproc))
    if a.logdir:
        os.makedirs(a.logdir, exist_ok=True)
    procs, logs, files = [], [], []
    output = None if a.logdir else OutputForwarder()
    parent = os.getpid()

    def _on_signal(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, _on_signal)
    try:
        for local in range(nproc):
            rank = a.node_rank * nproc + local
            env = dict(os.environ)
            device = f"gpu{local}" if gpus else "cpu0"
            env.update(rank_environment(rank, local, world, nproc, a.master_addr, port, secret,
                                        job, device))
            env[RESTART_COUNT_ENV] = str(restart)
            env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the terminal as they are printed
            if not user_threads:
                for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                    env[var] = threads
            log = os.path.join(a.logdir, f"rank{rank}.log") if a.logdir else None
            out = open(log, "w") if log else None
            files.append(out)
            logs.append(log)
            p = subprocess.Popen(
                [sys.executable, a.script, *a.script_args],
                env=env,
                stdout=out or subprocess.PIPE,
                stderr=subprocess.STDOUT if out else subprocess.PIPE,
                preexec_fn=lambda: become_rank_process(parent),
            )
            procs.append(p)
            if output is not None:
                output.add(rank, os.dup(p.stdout.fileno()), "stdout")
                output.add(rank, os.dup(p.stderr.fileno()), "stderr")
                p.stdout.close()
                p.stderr.close()
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                rank = a.node_rank * nproc + i
                print(
                    f"launch: rank {rank} (pid {procs[i].pid}) failed: {describe_exit(codes[i])}; "
                    f"terminating the other ranks{_tail(logs[i])}",
                    file=sys.stderr,
                )
                kill_tree([p.pid for p in procs], grace=2.0)
                recorder.report_after_failure(job)  # what each rank did last, if they dumped
                return 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_INTERVAL)
    except KeyboardInterrupt:
        print("launch: interrupted, terminating all ranks", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
        kill_tree([p.pid for p in procs], grace=2.0)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for f in files:
            if f is not None:
                f.close()
        if output is not None:
            output.close()
        if server is not None:
            server.close()
        remove_job_segments(job)


if __name__ == "__main__":
    sys.exit(main())
