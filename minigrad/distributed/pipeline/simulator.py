"""Run a pipeline schedule on paper: a discrete-event simulation of every stage's action list.

Each stage executes its program in order, one action at a time, on its own clock. Compute
actions take a given duration; a receive waits until its message has arrived. Messages travel
on one **FIFO channel per ordered pair of ranks** (src → dst), like minigrad's point-to-point
``send``/``recv``, which carry no tags: a receive takes the *next* message from its peer, so the
message at the head of the channel must be the one the receive expects (same kind, micro-batch
and receiving logical stage). Anything else would silently feed a stage the wrong tensor in a
real run, so the simulation reports it.

Two models of a send:

* ``sends="buffered"`` (what the engine uses: minigrad's CPU ``send`` returns once the data is
  buffered, and a GPU engine uses non-blocking sends): a send takes no time on the sender and
  its message is available to the receiver ``latency`` later.
* ``sends="blocking"`` (a rendezvous, like a synchronous MPI send or an unbuffered NCCL pair):
  sender and receiver both wait until the other side reaches the matching action. Orders that
  are fine with buffered sends can deadlock here; DeepSpeed orders the transfers of each step by
  the parity of (step, stage) for exactly this reason.

Because every stage's timing depends only on its own clock and the arrival times of its messages,
the result does not depend on the order in which the simulator visits the stages. The simulation
ends when every program is done; if some stage can never proceed — a receive whose message is
never sent, a rendezvous nobody joins, a cycle of waits — it raises :class:`ScheduleError` with
every stuck stage's action marked.

Example::

    tl = simulate(OneFOneB(4, 8).programs(), stages=4, durations={"F": 1, "B": 2})
    tl.span()            # 33.0 == (M + S - 1) * (tF + tB)
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Mapping, Sequence

from minigrad.distributed.pipeline.actions import (
    Action,
    Communication,
    ScheduleError,
    format_programs,
)
from minigrad.distributed.pipeline.timeline import Timeline, TimelineEvent

__all__ = ["simulate"]

Durations = Mapping[str, float] | Callable[[int, Action], float]


def _duration_fn(durations: Durations) -> Callable[[int, Action], float]:
    if callable(durations):
        return durations
    table = dict(durations)
    return lambda _stage, action: float(table.get(action.label, 0.0))


def simulate(
    programs: Sequence[Sequence[Action]],
    stages: int,
    durations: Durations,
    sends: str = "buffered",
    latency: float = 0.0,
) -> Timeline:
    """Simulate one step of ``programs`` (one action list per stage) and return its timeline.

    ``durations`` maps an action label (``"F"``, ``"B"``, ``"BI"``, ``"BW"``...) to its time,
    unlisted actions taking 0, or is a function ``(stage, action) -> time``. ``sends`` is
    ``"buffered"`` or ``"blocking"`` (see the module docstring); ``latency`` is the transfer
    time of every message. Raises :class:`ScheduleError` on a deadlock or a message received
    out of order.
    """
    if sends not in ("buffered", "blocking"):
        raise ValueError(f"simulate: sends must be 'buffered' or 'blocking', got {sends!r}")
    if len(programs) != stages:
        raise ValueError(
            f"simulate: expected {stages} programs (one per stage), got {len(programs)}")
    duration = _duration_fn(durations)
    pc = [0] * stages                      # index of each stage's next action
    clock = [0.0] * stages                 # when each stage is free
    channels: dict[tuple[int, int], deque] = {}  # (src, dst) -> [(key, arrival, index)]
    events: list[TimelineEvent] = []

    def record(stage: int, action: Action, start: float, end: float) -> None:
        events.append(TimelineEvent.of(stage, action, start, end))
        clock[stage] = end
        pc[stage] += 1

    def fail(why: str, marks: dict[int, int]) -> None:
        raise ScheduleError(f"{why}\n{format_programs(programs, marks)}")

    def check_head(stage: int, action: Communication, head_key, src: int, where: int) -> None:
        expected = action.key(stage, stages)
        if head_key != expected:
            fail(f"stage {stage} receives {action!r} from stage {src}, but the next message on "
                 f"that channel is {_describe(head_key)} (sent by action {where} of stage "
                 f"{src}); point-to-point channels are FIFO, so sends and receives between two "
                 f"stages must happen in the same order", {stage: pc[stage], src: where})

    def step(stage: int) -> bool:
        """Run ``stage``'s next action if it can run now; whether it did."""
        action = programs[stage][pc[stage]]
        if not isinstance(action, Communication):
            record(stage, action, clock[stage], clock[stage] + duration(stage, action))
            return True
        peer, _ = action.peer(stage, stages)
        if action.is_send and sends == "buffered":
            channels.setdefault((stage, peer), deque()).append(
                (action.key(stage, stages), clock[stage] + latency, pc[stage]))
            record(stage, action, clock[stage], clock[stage])
            return True
        if action.is_send:  # rendezvous: the receiver completes both sides
            return False
        if sends == "buffered":
            channel = channels.get((peer, stage))
            if not channel:
                return False
            key, arrival, where = channel[0]
            check_head(stage, action, key, peer, where)
            channel.popleft()
            record(stage, action, clock[stage], max(clock[stage], arrival))
            return True
        if pc[peer] >= len(programs[peer]):
            return False
        sender = programs[peer][pc[peer]]
        if not (isinstance(sender, Communication) and sender.is_send
                and sender.peer(peer, stages)[0] == stage):
            return False
        check_head(stage, action, sender.key(peer, stages), peer, pc[peer])
        start = max(clock[stage], clock[peer])
        record(peer, sender, start, start + latency)
        record(stage, action, start, start + latency)
        return True

    while True:
        progressed = False
        for stage in range(stages):
            while pc[stage] < len(programs[stage]) and step(stage):
                progressed = True
        if all(pc[s] == len(programs[s]) for s in range(stages)):
            break
        if not progressed:
            stuck = {s: pc[s] for s in range(stages) if pc[s] < len(programs[s])}
            fail(f"the schedule deadlocks with {sends} sends: "
                 + "; ".join(f"stage {s} waits at {programs[s][i]!r}" for s, i in stuck.items()),
                 stuck)
    leftovers = [(src, dst, key) for (src, dst), ch in channels.items() for key, _, _ in ch]
    if leftovers:
        src, dst, key = leftovers[0]
        fail(f"stage {src} sends {_describe(key)} to stage {dst}, which never receives it",
             {src: channels[(src, dst)][0][2]})
    return Timeline(events)


def _describe(key: tuple[str, int, int]) -> str:
    message, micro_batch, receiver = key
    return f"the {message} of micro-batch {micro_batch} for logical stage {receiver}"
