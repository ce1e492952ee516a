"""What every collective and message of this rank did: the flight recorder and the comm log.

Every call of :mod:`.arrays` (the layer all of minigrad's communication goes through) is a
:class:`CallRecord`: kind, group (global ranks), sequence number, shapes, dtypes, bytes, start and
end time, provider and the caller (file:line of the first frame outside minigrad).

* **Flight recorder** (always on): the last :data:`RING_SIZE` records, kept in a ring. When a
  collective of this rank fails (``CollectiveTimeoutError``, ``CollectiveMismatchError``, any
  ``CollectiveError``) or its watchdog warns, the rank writes its ring as JSON to
  ``<dir>/rank<r>.json`` and says where; ``<dir>`` is ``$MINIGRAD_FLIGHT_RECORDER_DIR`` or
  ``<tmp>/minigrad-flight-recorder/<job id>``. Rank 0, after a failure, waits briefly for the
  other ranks' files and prints :func:`analyze`'s cross-rank diff ("rank 1 never called seq 5
  all_reduce (group [0, 1]); its last call was seq 5 barrier, from train.py:88"), and so does the
  launcher when rank 0 could not. ``python -m minigrad.distributed.flight_recorder DIR`` prints the
  same analysis from the files.
* **Comm log** (``dist.comm_log.enable()`` or ``MINIGRAD_COMM_LOG=1``): every record, unbounded,
  and :meth:`CommLog.summary`: per op and message size, count, bytes, total and mean time,
  algorithm and bus bandwidth (DeepSpeed's comms-logger table).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

from minigrad import seams
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime.log import get_logger

RING_SIZE = int(os.environ.get("MINIGRAD_FLIGHT_RECORDER_SIZE", "256"))
DIR_ENV = "MINIGRAD_FLIGHT_RECORDER_DIR"
LOG_ENV = "MINIGRAD_COMM_LOG"
PEER_WAIT = 10.0  # seconds rank 0 waits for the other ranks' dumps before it analyses them

# files of this package: the caller is the first frame outside them
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the bus-bandwidth factor of each op on n ranks (how much of the algorithm's data crosses links)
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


class CallRecord:
    """One collective or message of this rank (times: ``time.time()`` seconds; end None while
    the call has not finished).

    Recording is on every call's path, so the record keeps what it is given (shape, dtype object,
    bytes of each array; the caller's file and line) and derives the readable fields (``shapes``,
    ``dtypes`` named ``float32``, ``nbytes``, ``caller`` as ``file:line``) only when read."""

    __slots__ = ("kind", "group", "seq", "provider", "start", "end", "_arrays", "_where")
    FIELDS = ("kind", "group", "seq", "shapes", "dtypes", "nbytes", "start", "end", "caller",
              "provider")

    def __init__(self, kind: str, group, seq, arrays, provider: str,
                 where: tuple[str, int] | None = None):
        self.kind, self.seq, self.provider, self._where = kind, seq, provider, where
        self.group = group if type(group) is tuple else tuple(group)
        if len(arrays) == 1 and arrays[0] is not None:  # the common case, without a loop
            a = arrays[0]
            self._arrays = ((a.shape, a.dtype, a.nbytes),)
        else:
            self._arrays = [(a.shape, a.dtype, a.nbytes) for a in arrays if a is not None]
        self.start, self.end = _now(), None

    @property
    def shapes(self) -> list:
        return [shape for shape, _, _ in self._arrays]

    @property
    def dtypes(self) -> list[str]:
        return [dtype.name for _, dtype, _ in self._arrays]

    @property
    def nbytes(self) -> int:
        return int(sum(n for _, _, n in self._arrays))

    @property
    def caller(self) -> str:
        """``file:line`` of the first frame outside minigrad that led to the call."""
        where = self._where
        if where is None:
            return "?"
        text = _CALLERS.get(where)
        if text is None:
            try:
                name = os.path.relpath(where[0])
            except ValueError:  # another drive (Windows)
                name = where[0]
            text = _CALLERS[where] = f"{name}:{where[1]}"
        return text

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    def describe(self) -> str:
        seq = "" if self.seq is None else f"seq {self.seq} "
        return f"{seq}{self.kind} (group {list(self.group)}), from {self.caller}"


_now = time.time
_getframe = sys._getframe


_CALLERS: dict[tuple[str, int], str] = {}
_INSIDE: dict[str, bool] = {}  # source file -> whether it is one of minigrad's


class CommLog:
    """The comm log: every record while enabled (see the module docstring)."""

    def __init__(self):
        self.records: list[CallRecord] | None = [] if os.environ.get(LOG_ENV) == "1" else None

    @property
    def enabled(self) -> bool:
        return self.records is not None

    def enable(self) -> None:
        """Start logging every collective and message (keeps what was logged before)."""
        if self.records is None:
            self.records = []

    def disable(self) -> None:
        """Stop logging and forget the records."""
        self.records = None

    def clear(self) -> None:
        """Forget the records, keep logging."""
        if self.records is not None:
            self.records.clear()

    def totals(self) -> dict:
        """``{(op, bytes per call): {"count", "bytes", "time"}}`` of the finished records."""
        rows: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "time": 0.0, "ranks": 1})
        for r in self.records or []:
            if r.end is None:
                continue
            row = rows[(r.kind, r.nbytes)]
            row["count"] += 1
            row["bytes"] += r.nbytes
            row["time"] += r.end - r.start
            row["ranks"] = len(r.group)
        return dict(rows)

    def summary(self, print_out: bool = True) -> str:
        """DeepSpeed's table: per op and message size, count, total bytes, total and mean time,
        algorithm bandwidth (bytes / time) and bus bandwidth (times the op's link factor)."""
        lines = [f"{'op':<16} {'msg size':>10} {'count':>7} {'total bytes':>12} "
                 f"{'total ms':>10} {'mean us':>9} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
        for (op, size), row in sorted(self.totals().items()):
            mean = row["time"] / row["count"]
            algbw = size / mean / 1e9 if mean > 0 else 0.0
            busbw = algbw * _BUS_FACTOR.get(op, lambda n: 1.0)(row["ranks"])
            lines.append(f"{op:<16} {size:>10} {row['count']:>7} {row['bytes']:>12} "
                         f"{row['time'] * 1e3:>10.3f} {mean * 1e6:>9.1f} {algbw:>11.3f} "
                         f"{busbw:>11.3f}")
        text = "\n".join(lines)
        if print_out:
            print(text)
        return text


comm_log = CommLog()
_ring: collections.deque = collections.deque(maxlen=RING_SIZE)
_job = {"id": "local", "rank": 0, "world": 1}


def configure(job: str, rank: int, world_size: int) -> None:
    """Name this rank's job (``init_process_group`` calls this): where the dumps go."""
    _job.update(id=job or "local", rank=rank, world=world_size)


def begin(kind: str, group, seq, arrays, provider: str) -> CallRecord:
    """Record the start of a call (every call of :mod:`.arrays`)."""
    frame = _getframe(1)  # the caller: the first frame outside minigrad
    while frame is not None:
        name = frame.f_code.co_filename
        inside = _INSIDE.get(name)  # a dict lookup per frame, not a prefix comparison
        if inside is None:
            inside = _INSIDE[name] = name.startswith(_PACKAGE)
        if not inside:
            break
        frame = frame.f_back
    where = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
    record = CallRecord(kind, group, seq, arrays, provider, where)
    _ring.append(record)
    if comm_log.records is not None:
        comm_log.records.append(record)
    return record


def finish(record: CallRecord) -> None:
    """The call of ``record`` ended: note the time, and put it on the profiler's timeline when
    one runs (category "collective", or "p2p" for messages)."""
    record.end = _now()
    tracer = seams.TRACER.value
    if tracer is not None:
        tracer.event(record.kind, "p2p" if record.seq is None else "collective", record.start,
                     record.end, group=list(record.group), seq=record.seq, bytes=record.nbytes,
                     shapes=[list(s) for s in record.shapes])


def recent() -> list[CallRecord]:
    """The flight recorder's records, oldest first."""
    return list(_ring)


def dump_dir(job: str | None = None) -> str:
    """Where the ranks of ``job`` (default: this rank's) write their flight-recorder files."""
    return os.environ.get(DIR_ENV) or os.path.join(
        tempfile.gettempdir(), "minigrad-flight-recorder", job or _job["id"])


def report_after_failure(job: str) -> None:
    """The launcher's part: after a failed job, print the analysis if ranks dumped and rank 0
    did not print it (it may be the rank that was stuck, or was stopped first)."""
    directory = dump_dir(job)
    if _dump_files(directory) and not os.path.exists(os.path.join(directory, "analysis.txt")):
        report(directory)


def dump(reason: str) -> str:
    """Write this rank's ring and ``reason`` to ``<dump_dir>/rank<r>.json``; return the path."""
    directory = dump_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{_job['rank']}.json")
    data = {"rank": _job["rank"], "world_size": _job["world"], "reason": reason,
            "records": [r.as_dict() for r in _ring]}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)
    return path


def on_failure(exc: BaseException) -> None:
    """A collective of this rank failed: dump the ring, and on rank 0 print the cross-rank
    analysis once the other ranks' dumps are there (or after :data:`PEER_WAIT` seconds; ranks
    that ended their program in an MPI job, which dump nothing, are not waited for)."""
    try:
        path = dump(f"{type(exc).__name__}: {exc}")
        get_logger().error("flight recorder: rank %d wrote %s", _job["rank"], path)
        if _job["rank"] == 0:
            directory = os.path.dirname(path)
            expected = _job["world"] - len(failures.exited(range(1, _job["world"]), within=1.0))
            deadline = time.monotonic() + PEER_WAIT
            while len(_dump_files(directory)) < expected and time.monotonic() < deadline:
                time.sleep(0.05)
            report(directory)
    except Exception as err:  # noqa: BLE001 - the report must never hide the failure itself
        get_logger().warning("flight recorder: could not dump (%s: %s)", type(err).__name__, err)


def on_watchdog_warning(what: str) -> str:
    """A wait of this rank passed its warning time: dump the ring (the job may hang for good);
    returns the file written (or why none was), for the watchdog's warning."""
    try:
        return dump(f"watchdog: {what}")
    except Exception as err:  # noqa: BLE001 - the warning must still be written
        return f"not written ({type(err).__name__}: {err})"


def report(directory: str) -> str:
    """Print :func:`analyze` of ``directory`` once (a marker file says it was printed)."""
    text = analyze(directory)
    marker = os.path.join(directory, "analysis.txt")
    if not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(text + "\n")
        print(text, file=sys.stderr, flush=True)
    return text


def _dump_files(directory: str) -> dict[int, str]:
    files = {}
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name.startswith("rank") and name.endswith(".json"):
            files[int(name[4:-5])] = os.path.join(directory, name)
    return files


def analyze(directory: str) -> str:
    """The cross-rank diff of the dumps in ``directory``: for each group, the furthest sequence
    number any rank reached, and every rank that did not call that same op there, with the last
    call it did make (op, sequence number, file:line)."""
    dumps = {}
    for rank, path in sorted(_dump_files(directory).items()):
        with open(path) as fh:
            dumps[rank] = json.load(fh)
    if not dumps:
        return f"flight recorder: no dumps in {directory}"
    world = max(d["world_size"] for d in dumps.values())
    lines = [f"flight recorder: {len(dumps)} of {world} rank(s) dumped to {directory}"]
    missing = sorted(set(range(world)) - set(dumps))
    if missing:
        lines.append(f"  rank(s) {missing} wrote nothing: they never failed in or waited on a "
                     "collective (skipped it and ended, or hang outside minigrad's calls)")
    # per group: each rank's collectives (sequence-numbered calls) by sequence number
    by_group: dict[tuple, dict[int, dict[int, dict]]] = defaultdict(dict)
    for rank, d in dumps.items():
        for r in d["records"]:
            if r["seq"] is not None:
                by_group[tuple(r["group"])].setdefault(rank, {})[r["seq"]] = r
    for group, per_rank in sorted(by_group.items()):
        front = max(max(calls) for calls in per_rank.values())
        calls_at_front = {rank: calls.get(front) for rank, calls in per_rank.items()}
        ops = {c["kind"] for c in calls_at_front.values() if c is not None}
        leaders = sorted(r for r, c in calls_at_front.items() if c is not None)
        lead = calls_at_front[leaders[0]]
        if len(ops) == 1 and len(leaders) == len([r for r in group if r in dumps]):
            state = "finished" if all(c["end"] for c in calls_at_front.values()) else "in"
            lines.append(f"  group {list(group)}: all dumped ranks {state} seq {front} "
                         f"{lead['kind']} (from {lead['caller']})")
            continue
        lines.append(f"  group {list(group)}: rank(s) {leaders} reached seq {front}; rank "
                     f"{leaders[0]} called {lead['kind']} there, from {lead['caller']}")
        for rank in group:
            if rank not in dumps:
                continue
            call = calls_at_front.get(rank)
            if call is not None and call["kind"] == lead["kind"]:
                continue
            records = dumps[rank]["records"]
            last = records[-1] if records else None
            what = f"never called seq {front} {lead['kind']}" + (
                f" (it called {call['kind']} there instead)" if call is not None else "")
            lines.append(f"    rank {rank} {what}; its last call: " + (
                "none" if last is None else
                f"seq {last['seq']} {last['kind']} (group {last['group']}, "
                f"{'done' if last['end'] else 'not finished'}), from {last['caller']}"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m minigrad.distributed.flight_recorder DIR``: print the analysis of DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m minigrad.distributed.flight_recorder DIR", file=sys.stderr)
        return 2
    print(analyze(args[0]))
    return 0
