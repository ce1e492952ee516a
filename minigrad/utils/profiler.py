"""``Profiler``: where a step's time goes, per rank, as a Chrome trace (MegEngine's
``megengine.utils.profiler.Profiler``, same path and name).

While a profiler runs it is the tracer of :data:`minigrad.seams.TRACER`: minigrad then times
every op's forward (``Function.__call__``: its name and input shapes), every op's backward, every
module's forward (its path in the model when ``model=`` names the model), and the spans other
layers report while a tracer is set — data loading (``DataLoader`` batches), pipeline actions
(``PipelineEngine``) and collectives. Spans nest by time: a module's forward contains its ops.
Nothing of this costs anything when no profiler runs: the traced versions of those calls are
swapped in on entry and out on exit.

On exit each rank writes ``<path>/rank<r>.chrome_timeline.json`` (the trace-event format: opens in
Perfetto or chrome://tracing; ``pid`` is the rank, ``tid`` the thread) and rank 0, once every rank's
file is there, ``<path>/merged.chrome_timeline.json`` with all ranks side by side. Timestamps are
wall-clock microseconds, so ranks on one host line up. :meth:`Profiler.summary` is a table of the
ops that took the most time.

With ``profile_memory=True`` each module's end adds a counter event of the bytes in use (host
memory through ``tracemalloc``, which NumPy reports to; on a GPU also CuPy's pool), and
``peak_host_bytes`` / ``peak_gpu_bytes`` hold the peaks of the run (the host's also through
``mg.device.get_max_allocated_memory("cpu0")``). Counting host memory slows every allocation, so
it is off unless asked for.

Example::

    from minigrad.utils.profiler import Profiler
    with Profiler("runs/prof", model=net) as prof:      # also usable as a decorator
        train_steps(10)
    print(prof.summary(top=10))
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import tracemalloc
from collections import defaultdict
from typing import Callable

from minigrad import seams
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import device_api
from minigrad.backend.device import get_default_device_obj

MERGE_WAIT = 120.0  # seconds rank 0 waits for the other ranks' files before merging what is there


def _now_us() -> float:
    return time.time_ns() / 1000.0


def _shapes(values) -> list:
    return [list(v.shape) for v in values if isinstance(v, Tensor)]


class Profiler(contextlib.ContextDecorator):
    """Record a per-rank timeline of ops, backward passes, modules, data loading, pipeline
    actions and collectives, and write it as Chrome trace JSON (see the module docstring).

    ``path``: the output folder (created); ``format``: MegEngine's file-name suffix;
    ``model``: a Module whose sub-module paths name the module events (else their class names).
    A context manager, or a decorator that profiles every call of the function it decorates.
    """

    def __init__(self, path: str = "profile", format: str = "chrome_timeline.json",
                 model=None, profile_memory: bool = False, **kwargs):
        self.path, self.format, self.profile_memory = path, format, profile_memory
        self.peak_host_bytes = self.peak_gpu_bytes = None
        self._stop_tracing = False
        self._names = {id(m): name or type(m).__name__ for name, m in model.named_modules()} \
            if model is not None else {}
        self.events: list[dict] = []
        self._previous = None
        self._lock = threading.Lock()
        world = seams.WORLD.value()
        self.world_size, self.rank = world if world is not None else (1, 0)

    # -- the tracer interface (called by the layers below while this profiler is installed) ----
    def _add(self, name: str, cat: str, start_us: float, args: dict | None = None) -> None:
        self.event(name, cat, start_us / 1e6, _now_us() / 1e6, **(args or {}))

    def op(self, fn, inputs, call: Callable):
        """Time ``call(fn, *inputs)``: one op's forward."""
        start = _now_us()
        try:
            return call(fn, *inputs)
        finally:
            self._add(type(fn).__name__, "op", start, {"inputs": _shapes(inputs)})

    def backward(self, node, call: Callable):
        """Time ``call()``: one recorded op's backward."""
        start = _now_us()
        try:
            return call()
        finally:
            self._add(type(node).__name__ + ".backward", "backward", start)

    def module(self, module, call: Callable):
        """Time ``call()``: one module's forward (with its pre- and post-hooks)."""
        start = _now_us()
        try:
            return call()
        finally:
            name = self._names.get(id(module), type(module).__name__)
            self._add(name, "module", start, {"class": type(module).__name__})
            if self.profile_memory:
                self._memory_sample()

    def _memory_sample(self) -> None:
        counts = {"host": device_api.get_allocated_memory("cpu0")}
        gpu = get_default_device_obj()
        if gpu.kind == "gpu":
            counts["gpu"] = device_api.get_allocated_memory(gpu)
            self.peak_gpu_bytes = max(self.peak_gpu_bytes or 0, counts["gpu"])
        with self._lock:
            self.events.append({"name": "memory (bytes)", "ph": "C", "ts": _now_us(),
                                "pid": self.rank, "tid": threading.get_ident(), "args": counts})

    def event(self, name: str, category: str, start: float, end: float, **args) -> None:
        """Add an event measured elsewhere (``start``/``end``: ``time.time()`` seconds), e.g. a
        pipeline action of the engine's own timeline."""
        event = {"name": name, "cat": category, "ph": "X", "ts": start * 1e6,
                 "dur": (end - start) * 1e6, "pid": self.rank, "tid": threading.get_ident()}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    @contextlib.contextmanager
    def span(self, name: str, category: str, **args):
        """Time the block as an event of ``category`` ("data", "pipeline", "collective", ...).
        A block ended by StopIteration (an exhausted iterator) is not an event."""
        start = _now_us()
        try:
            yield
        except StopIteration:
            raise
        except BaseException:
            self._add(name, category, start, args or None)
            raise
        self._add(name, category, start, args or None)

    # -- running ------------------------------------------------------------------------------
    def start(self) -> "Profiler":
        """Begin recording (``with Profiler(...)`` calls this)."""
        if seams.TRACER.value is not None:
            raise RuntimeError("Profiler: another profiler is already running in this process")
        if self.profile_memory:
            self._stop_tracing = not tracemalloc.is_tracing()
            device_api.reset_max_memory_stats("cpu0")
        self._previous = seams.TRACER.install(self)
        return self

    def stop(self) -> None:
        """Stop recording and write this rank's trace (and, on rank 0, the merged one)."""
        seams.TRACER.install(self._previous)
        if self.profile_memory:
            self.peak_host_bytes = device_api.get_max_allocated_memory("cpu0")
            if self._stop_tracing:
                tracemalloc.stop()
        self.dump()

    def __enter__(self) -> "Profiler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- output -------------------------------------------------------------------------------
    def trace(self) -> dict:
        """This rank's events in the trace-event format (sorted by start time)."""
        events = sorted(self.events, key=lambda e: e["ts"])
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0,
                 "args": {"name": f"rank {self.rank}"}}]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def file_of(self, rank: int) -> str:
        """Where rank ``rank`` writes its trace."""
        return os.path.join(self.path, f"rank{rank}.{self.format}")

    def dump(self) -> str:
        """Write this rank's trace (atomically) and, on rank 0, the merged trace; return this
        rank's file."""
        os.makedirs(self.path, exist_ok=True)
        mine = self.file_of(self.rank)
        _write_json(mine, self.trace())
        if self.rank == 0 and self.world_size > 1:
            self._merge()
        return mine

    def _merge(self) -> None:
        files = [self.file_of(r) for r in range(self.world_size)]
        deadline = time.monotonic() + MERGE_WAIT
        while not all(os.path.exists(f) for f in files) and time.monotonic() < deadline:
            time.sleep(0.05)
        merged, missing = [], []
        for rank, f in enumerate(files):
            if os.path.exists(f):
                with open(f) as fh:
                    merged.extend(json.load(fh)["traceEvents"])
            else:
                missing.append(rank)
        out = {"traceEvents": merged, "displayTimeUnit": "ms"}
        if missing:
            out["otherData"] = {"missing_ranks": missing}
        _write_json(os.path.join(self.path, f"merged.{self.format}"), out)

    def summary(self, top: int = 20, category: str = "op") -> str:
        """A table of the ``top`` names of ``category`` by total time: calls, total and mean."""
        total, count = defaultdict(float), defaultdict(int)
        for e in self.events:
            if e["cat"] == category:
                total[e["name"]] += e["dur"]
                count[e["name"]] += 1
        grand = sum(total.values()) or 1.0
        rows = sorted(total, key=total.get, reverse=True)[:top]
        lines = [f"{'name':<28} {'calls':>7} {'total ms':>10} {'mean us':>9} {'share':>7}"]
        for name in rows:
            lines.append(f"{name:<28} {count[name]:>7} {total[name] / 1000:>10.3f} "
                         f"{total[name] / count[name]:>9.1f} {100 * total[name] / grand:>6.1f}%")
        return "\n".join(lines)


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


@contextlib.contextmanager
def scope(name: str, category: str = "scope"):
    """Mark a block of user code on the running profiler's timeline (nothing when none runs)."""
    tracer = seams.TRACER.value
    if tracer is None:
        yield
        return
    with tracer.span(name, category):
        yield
