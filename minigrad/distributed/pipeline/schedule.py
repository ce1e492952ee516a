"""Pipeline schedules as pure data: which action each stage performs, in which order.

A schedule is a function of the pipeline's shape — ``stages`` S, ``micro_batches`` M and, for
interleaved schedules, ``chunks`` v per stage — to one list of actions per stage
(:mod:`~minigrad.distributed.pipeline.actions`). Nothing here runs a model: the engine walks a
stage's list and performs each action, so the same object can be printed, validated, simulated
and asserted on without processes.

API::

    sched = OneFOneB(stages=4, micro_batches=8)   # or get_schedule("1f1b", 4, 8)
    sched.actions(0)        # stage 0's program: [F0, SA0, F1, SA1, ..., RG0, B0, ...,
                            #                     ReduceTiedGrads, ReduceGrads, OptimizerStep]
    sched.compute_order(0)  # the same without communication: [F0, F1, F2, F3, B0, F4, ...]
    sched.steps()           # stage x step grid of compute actions (None = idle)
    print(sched.render())
    sched.simulate(tF=1, tB=2).span()   # 33.0 == (M + S - 1) * (tF + tB)
    sched.peak_activations(0)           # 4 == min(S - s, M)

``render()`` of that schedule (DeepSpeed's lock-step order, one column per step)::

    stage 0: F0 .  F1 .  F2 .  F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
    stage 1: .  F0 .  F1 .  F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
    stage 2: .  .  F0 .  F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
    stage 3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .

Schedules:

* :class:`GPipe` — all forwards, then all backwards (with chunks: chunk by chunk, "looped BFS").
  Keeps all M micro-batches alive.
* :class:`OneFOneB` — DeepSpeed's 1F1B: ``min(S - s - 1, M)`` warm-up forwards, then one forward
  and one backward alternately, then the remaining backwards. Same bubble as GPipe, but at most
  ``min(S - s, M)`` live micro-batches on stage s.
* :class:`Interleaved1F1B` — Megatron's virtual-stage 1F1B: rank s holds chunks s, s + S, ...;
  micro-batches go through each chunk in groups of S. ``M % S == 0``. Bubble about v times
  smaller, at the cost of v times more messages.
* :class:`ZeroBubbleH1` — 1F1B with each backward split into an input pass (``BI``, on the
  critical path) and a weight pass (``BW``) that stage s delays by s micro-batches, so the weight
  passes fill the drain bubble. Live activations (freed after ``BW``) stay within 1F1B's peak
  ``min(S, M)``; with ``tF = tI = tW`` the bubble shrinks to a third of 1F1B's.
* :class:`InferenceSchedule` — forwards only, for ``eval_batch``.
* :class:`CustomSchedule` — a user-written action list per stage, validated like the others.

Rules every schedule obeys, checked by :meth:`Schedule.validate` when it is built (a broken rule
raises :class:`~minigrad.distributed.pipeline.actions.ScheduleError` showing every program with
the offending action marked ``<-- ERROR HERE``):

1. every micro-batch runs exactly one forward per chunk and, when training, either one ``B`` or
   one ``BI`` followed by one ``BW`` — after its forward;
2. a forward on a logical stage after the first is preceded by its ``RecvActivation``, and one
   before the last is followed by its ``SendActivation``; backwards likewise receive and send
   gradients; nothing talks to a neighbour that does not exist;
3. a training step ends with ``ReduceTiedGrads``, ``ReduceGrads``, ``OptimizerStep``, after every
   backward;
4. simulated with FIFO channels, blocking receives and **buffered sends** (what the engine uses),
   every receive gets the message it expects and nothing deadlocks or is left unreceived.

Steps. :meth:`Schedule.steps` lays the compute actions out on a lock-step grid: 1F1B uses
DeepSpeed's grid, where stage s runs a forward when ``step - s`` is even and a backward when it
is odd, so neighbours always pair a send with a receive within one step; the other schedules put
every action at its earliest start when all actions take one unit of time.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Sequence

from minigrad.distributed.pipeline.actions import (
    Action,
    Backward,
    BackwardInput,
    BackwardWeight,
    Communication,
    Forward,
    MicroBatchAction,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ReduceGrads,
    ReduceTiedGrads,
    ScheduleError,
    SendActivation,
    SendGrad,
    format_programs,
    logical_stage,
    parse_actions,
)
from minigrad.distributed.pipeline.simulator import simulate
from minigrad.distributed.pipeline.timeline import Timeline

__all__ = [
    "CustomSchedule",
    "GPipe",
    "InferenceSchedule",
    "Interleaved1F1B",
    "OneFOneB",
    "SCHEDULES",
    "Schedule",
    "ZeroBubbleH1",
    "add_communication",
    "check_positive_int",
    "get_schedule",
    "peak_activations",
    "validate_programs",
]

STEP_END = (ReduceTiedGrads(), ReduceGrads(), OptimizerStep())
_BACKWARDS = (Backward, BackwardInput, BackwardWeight)


def check_positive_int(name: str, value, owner: str) -> int:
    """``value`` if it is an int >= 1 (not a bool); else a ValueError naming ``owner`` and
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


class Schedule:
    """Base class: a pipeline schedule for ``stages`` stages, ``micro_batches`` micro-batches per
    step and ``chunks`` model chunks per stage.

    A subclass defines :meth:`compute_order` (forwards and backwards of one stage, in order);
    the base class inserts the sends and receives (:func:`add_communication`), appends the end of
    a training step, validates the result and offers grids, simulation and activation counts.
    """

    name: ClassVar[str] = "schedule"
    training: ClassVar[bool] = True

    def __init__(self, stages: int, micro_batches: int, chunks: int = 1):
        owner = type(self).__name__
        self.stages = check_positive_int("stages", stages, owner)
        self.micro_batches = check_positive_int("micro_batches", micro_batches, owner)
        self.chunks = check_positive_int("chunks", chunks, owner)
        self._check_shape()
        self._programs = [self._program(s) for s in range(self.stages)]
        self.validate()

    # -- what a subclass provides ---------------------------------------------------------------
    def _check_shape(self) -> None:
        """Reject pipeline shapes the schedule cannot handle (a clear ``ValueError``)."""

    def compute_order(self, stage: int) -> list[Action]:
        """The forwards and backwards of ``stage``, in execution order."""
        raise NotImplementedError(f"{type(self).__name__}.compute_order")

    def _program(self, stage: int) -> list[Action]:
        return add_communication(self.compute_order(stage), stage, self.stages, self.chunks,
                                 self.training)

    # -- the schedule as data -------------------------------------------------------------------
    def actions(self, stage: int) -> list[Action]:
        """Everything ``stage`` does in one step, in order (compute, transfers, step end)."""
        if not 0 <= stage < self.stages:
            raise ValueError(f"{self!r}.actions: stage {stage} is outside [0, {self.stages})")
        return list(self._programs[stage])

    def programs(self) -> list[list[Action]]:
        """``[actions(0), actions(1), ...]``."""
        return [list(p) for p in self._programs]

    def steps(self) -> list[list[Action | None]]:
        """The compute actions on a stage x step grid (``None`` = idle), every row equally long.

        The default places each action at its earliest start when every compute action takes
        one unit and transfers are free.
        """
        timeline = self.simulate(tF=1, tB=1, tI=1, tW=1, scale_chunks=False)
        width = int(round(timeline.span()))
        grid: list[list[Action | None]] = [[None] * width for _ in range(self.stages)]
        compute = [[a for a in p if isinstance(a, (Forward, *_BACKWARDS))] for p in self._programs]
        position = [0] * self.stages
        for e in timeline:
            if e.is_compute:
                grid[e.rank][int(round(e.start))] = compute[e.rank][position[e.rank]]
                position[e.rank] += 1
        return grid

    def render(self) -> str:
        """The stage x step grid as text, ``.`` for an idle step (see the module docstring)."""
        grid = self.steps()
        cells = [[repr(a) if a is not None else "." for a in row] for row in grid]
        width = max((len(c) for row in cells for c in row), default=1)
        return "\n".join(
            (f"stage {s}: " + " ".join(c.ljust(width) for c in row)).rstrip()
            for s, row in enumerate(cells)
        )

    def validate(self) -> None:
        """Check the rules of the module docstring; raise :class:`ScheduleError` if one breaks."""
        validate_programs(self._programs, self.micro_batches, self.chunks, self.training,
                          title=repr(self))

    def simulate(
        self,
        tF: float = 1.0,
        tB: float = 2.0,
        tI: float | None = None,
        tW: float | None = None,
        latency: float = 0.0,
        sends: str = "buffered",
        scale_chunks: bool = True,
    ) -> Timeline:
        """The timeline of one step when a stage's forward takes ``tF``, its backward ``tB`` and
        the split halves ``tI`` and ``tW`` (default ``tB / 2`` each). With ``scale_chunks`` a
        chunk holds ``1 / chunks`` of a stage's layers and takes that share of the time. See
        :func:`~minigrad.distributed.pipeline.simulate`.
        """
        tI = tB / 2 if tI is None else tI
        tW = tB / 2 if tW is None else tW
        share = 1.0 / self.chunks if scale_chunks else 1.0
        durations = {"F": tF * share, "B": tB * share, "BI": tI * share, "BW": tW * share}
        return simulate(self._programs, self.stages, durations, sends=sends, latency=latency)

    def peak_activations(self, stage: int) -> int:
        """The most micro-batch chunks whose activations ``stage`` holds at once (see
        :func:`peak_activations`)."""
        return peak_activations(self.actions(stage))

    def __repr__(self) -> str:
        chunks = f", chunks={self.chunks}" if self.chunks != 1 else ""
        return (f"{type(self).__name__}(stages={self.stages}, "
                f"micro_batches={self.micro_batches}{chunks})")


class GPipe(Schedule):
    """Fill and drain: every forward, then every backward (micro-batches in order).

    With ``chunks`` v the forwards run chunk by chunk and the backwards in reverse chunk order
    (PyTorch's "looped BFS"). Wall time ``(M + S - 1)(tF + tB)``; all M micro-batches alive.
    """

    name = "gpipe"

    def compute_order(self, stage: int) -> list[Action]:
        chunks, micro_batches = range(self.chunks), range(self.micro_batches)
        return ([Forward(m, c) for c in chunks for m in micro_batches]
                + [Backward(m, c) for c in reversed(chunks) for m in micro_batches])


class OneFOneB(Schedule):
    """1F1B (PipeDream-Flush) in DeepSpeed's order: ``w = min(S - s - 1, M)`` warm-up forwards,
    then ``F(w + i), B(i)`` pairs, then the last ``w`` backwards.

    Wall time ``(M + S - 1)(tF + tB)`` like GPipe, but stage s holds at most ``min(S - s, M)``
    micro-batches. Any ``M >= 1``.
    """

    name = "1f1b"

    def _check_shape(self) -> None:
        if self.chunks != 1:
            raise ValueError(
                f"OneFOneB: chunks must be 1, got {self.chunks}; use Interleaved1F1B for "
                f"several model chunks per stage"
            )

    def compute_order(self, stage: int) -> list[Action]:
        warmup = min(self.stages - stage - 1, self.micro_batches)
        order: list[Action] = [Forward(m) for m in range(warmup)]
        for i in range(self.micro_batches - warmup):
            order += [Forward(warmup + i), Backward(i)]
        return order + [Backward(m) for m in range(self.micro_batches - warmup, self.micro_batches)]

    def steps(self) -> list[list[Action | None]]:
        """DeepSpeed's lock-step grid of ``2 (M + S - 1)`` steps: at step t stage s runs forward
        ``(t - s) / 2`` when ``t - s`` is even, else backward ``(t + s + 1) / 2 - S``, when that
        micro-batch exists."""
        S, M = self.stages, self.micro_batches
        grid: list[list[Action | None]] = []
        for s in range(S):
            row: list[Action | None] = []
            for t in range(2 * (M + S - 1)):
                if (t - s) % 2 == 0:
                    m, action = (t - s) // 2, Forward
                else:
                    m, action = (t + s + 1) // 2 - S, Backward
                row.append(action(m) if 0 <= m < M else None)
            grid.append(row)
        return grid


class Interleaved1F1B(Schedule):
    """Interleaved 1F1B (Megatron's virtual stages): stage s holds chunks s, s + S, ...

    The k-th forward of a stage is micro-batch ``(k // (S v)) S + k % S`` through chunk
    ``(k // S) % v`` — groups of S micro-batches per chunk, depth first — and its k-th backward
    the same micro-batch through chunk ``v - 1 - (k // S) % v``. Stage s warms up with
    ``2 (S - s - 1) + (v - 1) S`` forwards (all of them when ``M == S``), alternates, then drains.
    Needs ``M % S == 0``.
    """

    name = "interleaved"

    def __init__(self, stages: int, micro_batches: int, chunks: int = 2):
        super().__init__(stages, micro_batches, chunks)

    def _check_shape(self) -> None:
        if self.micro_batches % self.stages:
            raise ValueError(
                f"Interleaved1F1B: micro_batches ({self.micro_batches}) must be a multiple of "
                f"stages ({self.stages})"
            )

    def _chunk_micro_batch(self, k: int, backward: bool) -> tuple[int, int]:
        S, v = self.stages, self.chunks
        chunk = (k // S) % v
        return (k // (S * v)) * S + k % S, (v - 1 - chunk) if backward else chunk

    def compute_order(self, stage: int) -> list[Action]:
        S, v, M = self.stages, self.chunks, self.micro_batches
        total = M * v
        warmup = total if M == S else min(2 * (S - stage - 1) + (v - 1) * S, total)
        forwards = [Forward(*self._chunk_micro_batch(k, False)) for k in range(total)]
        backwards = [Backward(*self._chunk_micro_batch(k, True)) for k in range(total)]
        order: list[Action] = forwards[:warmup]
        for i in range(total - warmup):
            order += [forwards[warmup + i], backwards[i]]
        return order + backwards[total - warmup:]


class ZeroBubbleH1(Schedule):
    """Zero-bubble ZB-H1 (Qi et al., 2023): 1F1B with each backward split in two.

    Stage s runs 1F1B's warm-up and steady phases with ``BI`` (input gradient) in place of
    ``B``, and runs the weight pass ``BW(i)`` only after ``BI(i + s)`` — the last stages, which
    would otherwise idle while the gradients travel back, fill that time with weight passes.
    An activation is freed after its ``BW``, so stage s holds up to ``min(S - s - 1, M) + 1 + s``
    micro-batches, never more than 1F1B's peak ``min(S, M)``. With ``tF = tI = tW`` and
    ``M >= S`` the wall time is ``M (tF + tI + tW) + (S - 1)(tF + tI - tW)``: a third of 1F1B's
    bubble, and the least any flushed schedule can reach (the last stage cannot start before
    ``(S - 1) tF`` and then has ``M (tF + tI + tW)`` of work).
    """

    name = "zb-h1"

    def _check_shape(self) -> None:
        if self.chunks != 1:
            raise ValueError(f"ZeroBubbleH1: chunks must be 1, got {self.chunks}")

    def compute_order(self, stage: int) -> list[Action]:
        M = self.micro_batches
        warmup = min(self.stages - stage - 1, M)
        delay = stage
        order: list[Action] = [Forward(m) for m in range(warmup)]
        pending: deque[int] = deque()

        def input_pass(m: int) -> None:
            order.append(BackwardInput(m))
            pending.append(m)
            if len(pending) > delay:
                order.append(BackwardWeight(pending.popleft()))

        for i in range(M - warmup):
            order.append(Forward(warmup + i))
            input_pass(i)
        for m in range(M - warmup, M):
            input_pass(m)
        return order + [BackwardWeight(m) for m in pending]


class InferenceSchedule(Schedule):
    """Forwards only (``eval_batch``): each stage runs its forwards in micro-batch order, chunk
    by chunk; no backward and no optimizer step."""

    name = "inference"
    training = False

    def compute_order(self, stage: int) -> list[Action]:
        return [Forward(m, c) for c in range(self.chunks) for m in range(self.micro_batches)]


class CustomSchedule(Schedule):
    """A schedule written by hand: one list of actions (or a string of labels) per stage.

    With ``add_communication`` (default) the lists hold only forwards and backwards, and the
    transfers and the end of the step are inserted as for the built-in schedules; without it
    the lists must spell out every action. Validated like every schedule.

    Example::

        CustomSchedule(["F0 F1 B0 B1", "F0 B0 F1 B1"], micro_batches=2)
    """

    name = "custom"

    def __init__(
        self,
        programs: Sequence[Sequence[Action] | str],
        micro_batches: int,
        chunks: int = 1,
        training: bool = True,
        add_communication: bool = True,
    ):
        self._given = [parse_actions(p) if isinstance(p, str) else list(p) for p in programs]
        self.training = training
        self._add_communication = add_communication
        if add_communication:
            for stage, program in enumerate(self._given):
                extra = [a for a in program if not isinstance(a, (Forward, *_BACKWARDS))]
                if extra:
                    raise ValueError(
                        f"CustomSchedule: stage {stage} lists {extra[0]!r}, but with "
                        f"add_communication=True the programs hold only forwards and backwards "
                        f"(pass add_communication=False to write every action)"
                    )
        super().__init__(len(self._given), micro_batches, chunks)

    def compute_order(self, stage: int) -> list[Action]:
        return [a for a in self._given[stage] if isinstance(a, (Forward, *_BACKWARDS))]

    def _program(self, stage: int) -> list[Action]:
        return super()._program(stage) if self._add_communication else list(self._given[stage])


SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1, InferenceSchedule)
}


def get_schedule(
    schedule: str | type[Schedule] | Schedule, stages: int, micro_batches: int, chunks: int = 1
) -> Schedule:
    """The schedule an engine should run: a name from :data:`SCHEDULES` (``"gpipe"``,
    ``"1f1b"``, ``"interleaved"``, ``"zb-h1"``, ``"inference"``), a :class:`Schedule` subclass,
    or a built schedule, which must match the given shape.

    Example: ``get_schedule("interleaved", stages=2, micro_batches=4, chunks=2)``.
    """
    if isinstance(schedule, Schedule):
        shape = (schedule.stages, schedule.micro_batches, schedule.chunks)
        if shape != (stages, micro_batches, chunks):
            raise ValueError(
                f"get_schedule: {schedule!r} does not match the pipeline (stages={stages}, "
                f"micro_batches={micro_batches}, chunks={chunks})"
            )
        return schedule
    if isinstance(schedule, str):
        cls = SCHEDULES.get(schedule.lower())
        if cls is None:
            raise ValueError(
                f"get_schedule: unknown schedule {schedule!r}; expected one of {sorted(SCHEDULES)}"
            )
        schedule = cls
    if not (isinstance(schedule, type) and issubclass(schedule, Schedule)):
        raise TypeError(
            f"get_schedule: expected a schedule name, class or instance, got {schedule!r}"
        )
    return schedule(stages=stages, micro_batches=micro_batches, chunks=chunks)


def add_communication(
    compute: Sequence[Action], stage: int, stages: int, chunks: int, training: bool
) -> list[Action]:
    """``compute`` with the transfers around each action and, when ``training``, the end of the
    step appended: ``RecvActivation`` before and ``SendActivation`` after a forward, ``RecvGrad``
    before and ``SendGrad`` after a ``B``/``BI``, where the neighbour exists."""
    last = stages * chunks - 1
    program: list[Action] = []
    for action in compute:
        position = logical_stage(stage, getattr(action, "chunk", 0), stages)
        m, c = getattr(action, "micro_batch", 0), getattr(action, "chunk", 0)
        if isinstance(action, Forward):
            program += [RecvActivation(m, c)] if position > 0 else []
            program.append(action)
            program += [SendActivation(m, c)] if position < last else []
        elif isinstance(action, (Backward, BackwardInput)):
            program += [RecvGrad(m, c)] if position < last else []
            program.append(action)
            program += [SendGrad(m, c)] if position > 0 else []
        else:
            program.append(action)
    return program + (list(STEP_END) if training else [])


def peak_activations(actions: Sequence[Action]) -> int:
    """The most (micro-batch, chunk) activations alive at once in a program: a forward makes one
    live, a ``Backward`` or a ``BackwardWeight`` frees it (a ``BackwardInput`` does not: the
    weight pass still needs the activations)."""
    live: set[tuple[int, int]] = set()
    peak = 0
    for a in actions:
        if isinstance(a, Forward):
            live.add((a.micro_batch, a.chunk))
            peak = max(peak, len(live))
        elif isinstance(a, (Backward, BackwardWeight)):
            live.discard((a.micro_batch, a.chunk))
    return peak


def validate_programs(
    programs: Sequence[Sequence[Action]],
    micro_batches: int,
    chunks: int,
    training: bool,
    title: str = "schedule",
) -> None:
    """Check rules 1–4 of the module docstring for ``programs`` (one per stage); raise
    :class:`ScheduleError` naming the first broken rule, with the programs and the offending
    action marked."""
    stages = len(programs)
    for stage, program in enumerate(programs):
        problem = _first_problem(program, stage, stages, micro_batches, chunks, training)
        if problem is not None:
            index, why = problem
            raise ScheduleError(
                f"{title} is invalid: stage {stage}, action {index}: {why}\n"
                + format_programs(programs, {stage: index})
            )
    try:
        simulate(programs, stages, {"F": 1, "B": 2, "BI": 1, "BW": 1})
    except ScheduleError as e:
        raise ScheduleError(f"{title} is invalid: {e}") from None


def _first_problem(
    program: Sequence[Action], stage: int, stages: int, micro_batches: int, chunks: int,
    training: bool,
) -> tuple[int, str] | None:
    """``(index, reason)`` of the first action of ``program`` that breaks a per-stage rule, or
    ``(len(program), reason)`` for something missing at the end; None if the program is valid.
    Forwards and backwards are checked first, so that a mistake in a hand-written compute order
    is reported as such rather than through the transfers inserted around it."""
    for i, a in enumerate(program):
        if not isinstance(a, Action):
            return i, f"{a!r} is not an Action"
        if isinstance(a, MicroBatchAction) and not 0 <= a.micro_batch < micro_batches:
            return i, f"{a!r}: micro-batch {a.micro_batch} is outside [0, {micro_batches})"
        if isinstance(a, MicroBatchAction) and not 0 <= a.chunk < chunks:
            return i, f"{a!r}: chunk {a.chunk} is outside [0, {chunks})"
    compute = [(i, a) for i, a in enumerate(program) if isinstance(a, (Forward, *_BACKWARDS))]
    return (_compute_problem(compute, len(program), micro_batches, chunks, training)
            or _transfer_problem(program, stage, stages, micro_batches, chunks, training))


def _compute_problem(
    compute: Sequence[tuple[int, Action]], end: int, micro_batches: int, chunks: int,
    training: bool,
) -> tuple[int, str] | None:
    """Rule 1 on the ``(index, action)`` forwards and backwards of one program."""
    seen: dict[tuple[str, int, int], int] = {}
    for i, a in compute:
        m, c = a.micro_batch, a.chunk
        if (a.label, m, c) in seen:
            return i, f"{a!r} appears twice (first at action {seen[(a.label, m, c)]})"
        if isinstance(a, _BACKWARDS):
            if not training:
                return i, f"an inference schedule has no backward ({a!r})"
            if ("F", m, c) not in seen:
                return i, f"{a!r} runs before its forward F{m} (chunk {c})"
            if isinstance(a, Backward) and (("BI", m, c) in seen or ("BW", m, c) in seen):
                return i, f"{a!r}: micro-batch {m} (chunk {c}) already has a split backward"
            if isinstance(a, BackwardInput) and ("B", m, c) in seen:
                return i, f"{a!r}: micro-batch {m} (chunk {c}) already ran a full backward"
            if isinstance(a, BackwardWeight) and ("BI", m, c) not in seen:
                return i, f"{a!r} runs before its input pass BI{m} (chunk {c})"
        seen[(a.label, m, c)] = i
    for c in range(chunks):
        for m in range(micro_batches):
            split = ("BI", m, c) in seen or ("BW", m, c) in seen
            need = ["F"] + ((["BI", "BW"] if split else ["B"]) if training else [])
            for label in need:
                if (label, m, c) not in seen:
                    return end, f"{label}{m}{f'c{c}' if c else ''} is missing"
    return None


def _transfer_problem(
    program: Sequence[Action], stage: int, stages: int, micro_batches: int, chunks: int,
    training: bool,
) -> tuple[int, str] | None:
    """Rules 2 and 3 (transfers and the end of the step) on one program whose forwards and
    backwards already passed rule 1."""
    last = stages * chunks - 1
    done: set[tuple[str, int, int]] = set()
    step_end: list[Action] = []
    for i, a in enumerate(program):
        if step_end or not isinstance(a, MicroBatchAction):
            if not training:
                return i, f"an inference schedule has no {a!r}"
            expected = STEP_END[len(step_end)] if len(step_end) < len(STEP_END) else None
            if a != expected:
                return i, (f"{a!r} is out of place: a training step ends with ReduceTiedGrads, "
                           f"ReduceGrads, OptimizerStep, in this order, after every backward")
            step_end.append(a)
            continue
        m, c = a.micro_batch, a.chunk
        position = logical_stage(stage, c, stages)
        if isinstance(a, Communication):
            if (a.label, m, c) in done:
                return i, f"{a!r} appears twice"
            if not 0 <= position + a.direction <= last:
                return i, (f"{a!r}: logical stage {position} has no "
                           f"{'next' if a.direction > 0 else 'previous'} stage to talk to")
            if not training and a.message == "grad":
                return i, f"an inference schedule has no {a!r}"
            problem = _misplaced_transfer(a, m, c, done)
            if problem:
                return i, problem
        elif isinstance(a, Forward) and position > 0 and ("RA", m, c) not in done:
            return i, f"{a!r} runs before its input arrives (RecvActivation {m}, chunk {c})"
        elif isinstance(a, (Backward, BackwardInput)) and position < last \
                and ("RG", m, c) not in done:
            return i, f"{a!r} runs before its output gradient arrives (RecvGrad {m}, chunk {c})"
        done.add((a.label, m, c))
    for c in range(chunks):
        position = logical_stage(stage, c, stages)
        for m in range(micro_batches):
            need = ["SA"] if position < last else []
            if training:
                need += (["RG"] if position < last else []) + (["SG"] if position > 0 else [])
            for label in need:
                if (label, m, c) not in done:
                    return len(program), f"{label}{m}{f'c{c}' if c else ''} is missing"
    if training and len(step_end) < len(STEP_END):
        return len(program), f"the step does not end with {STEP_END[len(step_end)]!r}"
    return None


def _misplaced_transfer(a: Communication, m: int, c: int, done: set) -> str | None:
    """Why a send or receive is out of place (a send before the value exists), or None."""
    if isinstance(a, SendActivation) and ("F", m, c) not in done:
        return f"{a!r} sends an activation before its forward F{m} (chunk {c}) ran"
    if isinstance(a, SendGrad) and not (("B", m, c) in done or ("BI", m, c) in done):
        return f"{a!r} sends a gradient before the backward of micro-batch {m} (chunk {c}) ran"
    if isinstance(a, RecvGrad) and ("F", m, c) not in done:
        return f"{a!r} receives a gradient before its forward F{m} (chunk {c}) ran"
    return None
