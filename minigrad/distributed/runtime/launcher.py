"""``@dist.launcher``: run a function on one forked process per device and collect the results.

Fork (not spawn) because MegEngine's docs call the decorated function at module level without a
``__main__`` guard. The parent runs the rendezvous store, forks the ranks, reads their results
*while* waiting (large return values cannot deadlock the pipes), forwards their output with a
``[rank N]`` prefix on every line, and on the first failure terminates the others and raises
:class:`LaunchError` naming the rank with its traceback (or the signal that killed it). A rank that
exits with status 0 without returning (``sys.exit(0)``) gives None. Children die with the parent
(``PR_SET_PDEATHSIG``) and each leads its own process group, which the parent kills on cleanup, so
no process outlives the job. Started by mpiexec, srun or the launch CLI, the decorated function
instead joins that job and runs once in this process.

Example::

    @dist.launcher(n_gpus=2)          # on CPU: 2 processes by default (MINIGRAD_NPROC overrides)
    def main(scale):
        return dist.get_rank() * scale

    main(10)   # -> [0, 10]
"""

from __future__ import annotations

import ctypes
import functools
import io
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Callable

from minigrad.backend.device import cuda_initialized, forbid_cuda, probe_gpus
from minigrad.backend.threads import set_num_threads
from minigrad.distributed.comm import group as _group
from minigrad.distributed.comm import recorder
from minigrad.distributed.comm.providers.cpu import remove_job_segments
from minigrad.distributed.runtime import env as _env
from minigrad.distributed.runtime import store as _store
from minigrad.distributed.runtime.log import get_logger
from minigrad.distributed.runtime.output import OutputForwarder
from minigrad.distributed.runtime.settings import (
    LAUNCHED_ENV,
    NPROC_ENV,
    RESTART_COUNT_ENV,
    TIMEOUT_ENV,
    default_timeout,
)

DEFAULT_NPROC = 2  # ranks per machine on CPU-only hosts (MINIGRAD_NPROC overrides)
#: Why a rank forked after its parent initialised CUDA cannot use a GPU (CUDA would only say
#: "initialization error").
CUDA_IN_PARENT = (
    "CUDA was already initialised in the parent process of dist.launcher, and forked ranks "
    "cannot use the GPU then. Create no GPU tensors and call no CuPy function before launching "
    "(compute references on cpu0 or in a rank), or set the default device to cpu0."
)
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


FAILURE_GRACE = 2.0  # seconds the other ranks get to end (and dump) after one failed

class LaunchError(RuntimeError):
    """A rank of a launched job failed; ``.rank`` names it, the message carries its traceback."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


# ------------------------------------------------------------------------------ helpers


def visible_gpu_count(device_type: str = "xpu") -> int:
    """GPUs the ranks of a launch can use, counted *without* initialising CUDA (so forking stays
    safe; see :func:`minigrad.backend.device.probe_gpus`). When counting failed (CuPy broken, the
    driver's device list unreadable, a CUDA error) the reason is never read as "0 GPUs" in
    silence: ``device_type="gpu"`` raises it, ``"xpu"`` warns and falls back to the CPU."""
    probe = probe_gpus()
    if probe.failed:
        if device_type == "gpu":
            raise RuntimeError(f"dist.launcher(device_type='gpu'): {probe.reason}")
        warnings.warn(f"dist.launcher: running on the CPU: {probe.reason}", stacklevel=3)
    return probe.count


PR_SET_PDEATHSIG = 1


def become_rank_process(parent_pid: int) -> None:
    """Set up a freshly started rank: lead its own process group (so the launcher can kill the
    rank with everything it started) and die with the launcher (``PR_SET_PDEATHSIG``)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def start_job_store(runs_store: bool, port: int) -> tuple[_store.Server | None, int, str, str]:
    """What a launcher sets up before starting ranks: ``(server, port, secret, job id)``; the
    machine that ``runs_store`` starts the store server (``port=0``: any free port)."""
    secret = os.environ.get(_store.SECRET_ENV) or _store.generate_secret()
    job = _store.generate_secret()[:10]
    server = _store.Server(port, secret) if runs_store else None
    return server, (server.port if server is not None else port), secret, job


def kill_tree(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM each child's process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (without reaping it: its owner still wants the exit status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def describe_exit(code: int | None) -> str:
    """'exit code 3' or 'killed by SIGKILL' for a process exit code (negative = signal)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ------------------------------------------------------------------------------- child


def _redirect_output(out_fd: int, err_fd: int) -> None:
    """Point this process's stdout/stderr at the launcher's pipes, line-buffered."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)


def _child_main(spec: dict, func: Callable, args: tuple, kwargs: dict, conn) -> None:
    become_rank_process(spec["parent_pid"])
    for fd in spec["close_fds"]:
        os.close(fd)  # the other ranks' pipe ends belong to the parent
    _redirect_output(*spec["output_fds"])
    if spec["cuda_in_parent"]:
        forbid_cuda(CUDA_IN_PARENT)  # a clear error at the rank's first GPU request
    if spec["server_fd"] is not None:
        try:
            os.close(spec["server_fd"])  # the store's listening socket belongs to the parent
        except OSError:
            pass
    os.environ.update(spec["env"])
    threads = spec["threads"]
    if threads is not None:
        for var in _THREAD_VARS:
            os.environ[var] = str(threads)
        set_num_threads(threads)
    try:
        _group.init_process_group(
            spec["master_ip"],
            spec["port"],
            spec["world_size"],
            spec["rank"],
            device=spec["device"],
            backend=spec["backend"],
            timeout=spec["timeout"],
            secret=spec["secret"],
        )
        try:
            result = func(*args, **kwargs)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
            result = None  # sys.exit(0) ends this rank normally, without a value
        try:
            conn.send(("ok", result))
        except Exception as exc:  # unpicklable result
            raise TypeError(
                f"rank {spec['rank']} returned a {type(result).__name__} that cannot be sent back "
                f"to the launcher: {exc}"
            ) from exc
        code = 0
    except BaseException:
        try:
            conn.send(("err", traceback.format_exc()))
        except Exception:
            pass
        code = 1
    try:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------ parent


class launcher:
    """Decorator running ``func`` on ``n_gpus`` local ranks (MegEngine's ``dist.launcher``).

    Arguments: ``n_gpus`` local processes (default: visible GPUs, or on CPU ``MINIGRAD_NPROC`` or
    2), ``world_size`` (default ``n_gpus``; larger for multi-machine jobs), ``rank_start`` (first
    global rank on this machine), ``master_ip``/``port`` of the store (``port=0``: any free port;
    the machine with ``rank_start == 0`` runs the store), ``backend``, ``timeout`` (collectives),
    ``job_timeout`` (whole run), ``max_restarts`` (when a rank fails, stop the others and run
the group again, with a new rendezvous, up to this many times: torchrun's elastic restarts; each
rank finds the start number in ``MINIGRAD_RESTART_COUNT`` and resumes from
``dist.checkpoint.latest(...)``). Calling the decorated function returns the per-rank return values
    in rank order (None for a rank that exited with status 0 without returning). Rank i of this
    machine runs on ``gpu{i}`` when there are GPUs (made its current CUDA device); asked for more
    ranks than GPUs, ``device_type="xpu"`` runs them on the CPU (with a warning) and
    ``device_type="gpu"`` raises.

    Inside a job started by ``python -m minigrad.distributed.launch``, mpiexec or srun, calling the
    decorated function joins that job instead and returns ``[this rank's result]``.
    """

    def __new__(cls, func: Callable | None = None, **kwargs):
        if func is None:
            return functools.partial(cls, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        func: Callable | None = None,
        n_gpus: int | None = None,
        world_size: int | None = None,
        rank_start: int = 0,
        master_ip: str = "localhost",
        port: int = 0,
        device_type: str = "xpu",
        backend: str = "auto",
        timeout: float | None = None,
        job_timeout: float | None = None,
        nproc: int | None = None,
        max_restarts: int = 0,
    ):
        functools.update_wrapper(self, func)
        self.func = func
        gpus = visible_gpu_count(device_type) if device_type in ("xpu", "gpu") else 0
        if device_type == "gpu" and gpus == 0:
            raise RuntimeError(
                f"dist.launcher(device_type='gpu'): no visible CUDA device ({probe_gpus().reason})"
            )
        self.on_gpu = gpus > 0
        n = n_gpus if n_gpus is not None else nproc
        if n is None:
            n = gpus if self.on_gpu else int(os.environ.get(NPROC_ENV, DEFAULT_NPROC))
        if n < 1:
            raise ValueError(f"dist.launcher: need at least one process, got n_gpus={n}")
        if self.on_gpu and n > gpus:
            self.on_gpu = False
            too_many = (f"dist.launcher: {n} ranks but {gpus} visible GPU(s), and each rank needs "
                        "a GPU of its own (NCCL refuses two ranks on one GPU)")
            if device_type == "gpu":
                raise ValueError(f"{too_many}; use n_gpus <= {gpus}, or device_type='cpu' and put "
                                 "tensors on a GPU explicitly")
            warnings.warn(f"{too_many}: running the ranks on the CPU", RuntimeWarning,
                          stacklevel=3)
        self.n = int(n)
        self.world_size = int(world_size) if world_size is not None else self.n
        self.rank_start = int(rank_start)
        if self.rank_start + self.n > self.world_size:
            raise ValueError(
                f"dist.launcher: ranks {self.rank_start}..{self.rank_start + self.n - 1} do not "
                f"fit in world_size {self.world_size}"
            )
        self.master_ip, self.port = master_ip, int(port)
        self.backend = backend
        self.timeout = timeout
        self.job_timeout = job_timeout
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or \
                max_restarts < 0:
            raise ValueError(f"dist.launcher: max_restarts must be an int >= 0, got "
                             f"{max_restarts!r}")
        self.max_restarts = max_restarts

    def __call__(self, *args, **kwargs) -> list:
        started_by_other = os.environ.get(LAUNCHED_ENV) or _env.detect().external
        if started_by_other and not _group.is_distributed():
            # Already one rank of a launched job (launch CLI, mpiexec, srun): join and run.
            _group.init_process_group(backend=self.backend, timeout=self.timeout)
            return [self.func(*args, **kwargs)]
        # The fork guard, whatever the device type: GPU ranks are refused here; ranks launched on
        # the CPU start (they may never touch a GPU), but each raises CUDA_IN_PARENT at its first
        # GPU request instead of failing inside CUDA.
        cuda_in_parent = cuda_initialized()
        if self.on_gpu and cuda_in_parent:
            raise RuntimeError(f"dist.launcher: {CUDA_IN_PARENT}")
        for restart in range(self.max_restarts + 1):
            try:
                return self._run(args, kwargs, cuda_in_parent, restart)
            except LaunchError as exc:
                if exc.rank is None or restart == self.max_restarts:
                    raise
                get_logger().warning(
                    "dist.launcher: rank %d failed; restarting the group (restart %d of %d)",
                    exc.rank, restart + 1, self.max_restarts)
        raise AssertionError("unreachable")

    def _run(self, args: tuple, kwargs: dict, cuda_in_parent: bool = False,
             restart: int = 0) -> list:
        if self.rank_start > 0 and self.port == 0:
            raise ValueError("dist.launcher: rank_start > 0 needs the master's store port")
        server, port, secret, job = start_job_store(self.rank_start == 0, self.port)
        cores = os.cpu_count() or 1
        user_threads = any(v in os.environ for v in _THREAD_VARS)
        threads = None if user_threads else max(1, cores // self.n)
        timeout = self.timeout
        if timeout is None:
            timeout = default_timeout()
            if self.job_timeout is not None and TIMEOUT_ENV not in os.environ:
                timeout = self.job_timeout
        ctx = mp.get_context("fork")
        procs, conns = [], []
        results: dict[int, Any] = {}
        output = OutputForwarder()
        pipes = [(*os.pipe(), *os.pipe()) for _ in range(self.n)]  # stdout r/w, stderr r/w
        unowned = {fd for p in pipes for fd in p}  # fds neither closed nor handed to `output`
        try:
            for local in range(self.n):
                rank = self.rank_start + local
                device = f"gpu{local}" if self.on_gpu else "cpu0"
                env = _env.rank_environment(
                    rank, local, self.world_size, self.n, self.master_ip, port, secret, job, device
                )
                env[RESTART_COUNT_ENV] = str(restart)
                out_r, out_w, err_r, err_w = pipes[local]
                later_writers = [fd for p in pipes[local + 1 :] for fd in (p[1], p[3])]
                spec = {
                    "parent_pid": os.getpid(),
                    "server_fd": server.fileno() if server is not None else None,
                    "output_fds": (out_w, err_w),
                    "close_fds": [fd for p in pipes for fd in (p[0], p[2])] + later_writers,
                    "env": env,
                    "threads": threads,
                    "device": device,
                    "master_ip": self.master_ip,
                    "port": port,
                    "world_size": self.world_size,
                    "rank": rank,
                    "backend": self.backend,
                    "timeout": timeout,
                    "secret": secret,
                    "cuda_in_parent": cuda_in_parent,
                }
                recv_end, send_end = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_child_main,
                    args=(spec, self.func, args, kwargs, send_end),
                    name=f"rank{rank}",
                    daemon=False,
                )
                p.start()
                send_end.close()
                os.close(out_w)
                os.close(err_w)
                output.add(rank, out_r, "stdout")
                output.add(rank, err_r, "stderr")
                unowned -= {out_r, out_w, err_r, err_w}
                procs.append(p)
                conns.append(recv_end)
            self._monitor(procs, conns, results)
        except BaseException:
            # the others usually fail a moment later (a mismatch raises on every rank; a dead
            # peer is noticed within the watchdog's check interval): let them write their dumps
            deadline = time.monotonic() + FAILURE_GRACE
            for p in procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
            kill_tree([p.pid for p in procs if p.pid is not None], grace=1.0)
            recorder.report_after_failure(job)  # what each rank did last, if they dumped
            raise
        finally:
            kill_tree([p.pid for p in procs if p.pid is not None], grace=1.0)
            for p in procs:
                p.join(timeout=5)
            for c in conns:
                c.close()
            for fd in unowned:
                os.close(fd)
            output.close()
            if server is not None:
                server.close()
            remove_job_segments(job)
        return [results.get(self.rank_start + i) for i in range(self.n)]

    def _monitor(self, procs: list, conns: list, results: dict) -> None:
        deadline = None if self.job_timeout is None else time.monotonic() + self.job_timeout
        by_conn = {c: i for i, c in enumerate(conns)}
        by_sentinel = {p.sentinel: i for i, p in enumerate(procs)}
        open_conns, running = set(conns), set(by_sentinel)
        while running or open_conns:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                ranks = [self.rank_start + i for i in range(self.n)]
                missing = [r for r in ranks if r not in results]
                raise LaunchError(
                    f"dist.launcher: job timed out after {self.job_timeout:g} s; rank(s) {missing} "
                    f"had not finished"
                )
            ready = mpc.wait(list(open_conns) + list(running), timeout=left)
            for obj in ready:  # read messages before judging exits
                if obj in open_conns:
                    self._read(obj, by_conn[obj], results, open_conns)
            for obj in ready:
                if obj in running:
                    running.discard(obj)
                    i = by_sentinel[obj]
                    c = conns[i]
                    while c in open_conns and c.poll():
                        self._read(c, i, results, open_conns)
                    p = procs[i]
                    p.join(timeout=1)
                    rank = self.rank_start + i
                    if p.exitcode == 0 and rank not in results:
                        get_logger().warning(
                            "dist.launcher: rank %d exited with code 0 without returning a value; "
                            "its result is None", rank,
                        )
                        results[rank] = None
                    if p.exitcode != 0:
                        raise LaunchError(
                            f"dist.launcher: rank {rank} (pid {p.pid}) {describe_exit(p.exitcode)} "
                            f"without returning a result",
                            rank,
                        )

    def _read(self, conn, i: int, results: dict, open_conns: set) -> None:
        rank = self.rank_start + i
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            open_conns.discard(conn)
            return
        if kind == "ok":
            results[rank] = payload
            return
        raise LaunchError(f"dist.launcher: rank {rank} failed:\n{payload}", rank)
