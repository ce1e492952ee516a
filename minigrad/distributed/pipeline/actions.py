"""The instructions of a pipeline schedule: small immutable actions with short, readable names.

A pipeline schedule is *data*: for every stage, the ordered list of actions that stage performs
in one training (or inference) step. This module is the vocabulary of those lists:

======================  ========  ===========================================================
action                  label     what the stage does
======================  ========  ===========================================================
``Forward(m, c)``       ``F3``    run its layers of chunk ``c`` on micro-batch ``m``
``Backward(m, c)``      ``B3``    backward of that forward: input *and* weight gradients
``BackwardInput(m, c)`` ``BI3``   only the gradient w.r.t. the chunk's input (critical path)
``BackwardWeight(m,c)`` ``BW3``   only the weight gradients (may run later: zero-bubble)
``SendActivation``      ``SA3``   send the forward output to the next logical stage
``RecvActivation``      ``RA3``   receive the forward input from the previous logical stage
``SendGrad``            ``SG3``   send the input gradient to the previous logical stage
``RecvGrad``            ``RG3``   receive the output gradient from the next logical stage
``ReduceTiedGrads()``   —         sum tied-weight gradients over each tie group
``ReduceGrads()``       —         average gradients over the data-parallel group
``OptimizerStep()``     —         step the optimizer on this stage's parameters
======================  ========  ===========================================================

A chunk other than 0 shows in the label as a suffix: ``F3c1`` is the forward of micro-batch 3
through the rank's second model chunk (interleaved schedules). :func:`parse_action` reads labels
back, so a custom schedule can be written as text: ``parse_actions("F0 F1 B0 B1")``.

Chunks and logical stages. With ``S`` stages (ranks of one pipeline) and ``v`` chunks per rank,
the model is cut into ``S * v`` consecutive parts and rank ``s`` holds parts ``s, s + S, ...``:
chunk ``c`` of stage ``s`` is *logical stage* ``c * S + s``. Activations flow from logical stage
``L`` to ``L + 1`` and gradients back; :meth:`Communication.peer` names the neighbour, so the
wrap-around from the last rank's chunk ``c`` to rank 0's chunk ``c + 1`` needs no special case.
A send to the own rank (one stage with several chunks) is a local hand-over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Iterable, Mapping, Sequence

__all__ = [
    "Action",
    "Backward",
    "BackwardInput",
    "BackwardWeight",
    "Communication",
    "Forward",
    "MICRO_BATCH_ACTIONS",
    "MicroBatchAction",
    "OptimizerStep",
    "RecvActivation",
    "RecvGrad",
    "ReduceGrads",
    "ReduceTiedGrads",
    "STEP_ACTIONS",
    "ScheduleError",
    "SendActivation",
    "SendGrad",
    "format_programs",
    "logical_stage",
    "parse_action",
    "parse_actions",
]


class ScheduleError(ValueError):
    """A schedule breaks a rule (or deadlocks); the message shows its grid with the offending
    action marked."""


def logical_stage(stage: int, chunk: int, stages: int) -> int:
    """The position of ``stage``'s chunk ``chunk`` in the whole pipeline: ``chunk * stages +
    stage``."""
    return chunk * stages + stage


@dataclass(frozen=True)
class Action:
    """Base class of every schedule action (immutable, hashable, compared by type and fields)."""

    label: ClassVar[str] = "?"

    def __repr__(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, repr=False)
class MicroBatchAction(Action):
    """An action on one micro-batch (``micro_batch``) of one model chunk (``chunk``)."""

    micro_batch: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.label}{self.micro_batch}" + (f"c{self.chunk}" if self.chunk else "")


@dataclass(frozen=True, repr=False)
class Forward(MicroBatchAction):
    """Run the chunk's layers on the micro-batch (the last logical stage also computes the loss)."""

    label: ClassVar[str] = "F"


@dataclass(frozen=True, repr=False)
class Backward(MicroBatchAction):
    """Backward through the chunk: gradients of its input and of its weights in one pass."""

    label: ClassVar[str] = "B"


@dataclass(frozen=True, repr=False)
class BackwardInput(MicroBatchAction):
    """First half of a split backward: only the gradient of the chunk's input (sent upstream)."""

    label: ClassVar[str] = "BI"


@dataclass(frozen=True, repr=False)
class BackwardWeight(MicroBatchAction):
    """Second half of a split backward: the weight gradients. Nobody waits for it, so a
    zero-bubble schedule runs it later, in what would be idle time; the micro-batch's activations
    are freed only after it."""

    label: ClassVar[str] = "BW"


@dataclass(frozen=True, repr=False)
class Communication(MicroBatchAction):
    """A point-to-point transfer between neighbouring logical stages.

    ``direction`` is +1 when the peer is the next logical stage and -1 for the previous one;
    ``message`` names what travels (``"activation"`` or ``"grad"``).
    """

    direction: ClassVar[int] = 0
    message: ClassVar[str] = ""
    is_send: ClassVar[bool] = False

    def peer(self, stage: int, stages: int) -> tuple[int, int]:
        """``(stage, chunk)`` of the neighbour this action talks to, for an action of ``stage``
        in a pipeline of ``stages`` stages."""
        peer = logical_stage(stage, self.chunk, stages) + self.direction
        return peer % stages, peer // stages

    def key(self, stage: int, stages: int) -> tuple[str, int, int]:
        """What identifies the message on the wire: ``(message, micro_batch, logical stage of
        the receiver)`` — equal for a send and the receive that must consume it."""
        me = logical_stage(stage, self.chunk, stages)
        receiver = me + self.direction if self.is_send else me
        return self.message, self.micro_batch, receiver


@dataclass(frozen=True, repr=False)
class SendActivation(Communication):
    """Send the chunk's forward output of the micro-batch to the next logical stage."""

    label: ClassVar[str] = "SA"
    direction: ClassVar[int] = 1
    message: ClassVar[str] = "activation"
    is_send: ClassVar[bool] = True


@dataclass(frozen=True, repr=False)
class RecvActivation(Communication):
    """Receive the chunk's forward input of the micro-batch from the previous logical stage."""

    label: ClassVar[str] = "RA"
    direction: ClassVar[int] = -1
    message: ClassVar[str] = "activation"


@dataclass(frozen=True, repr=False)
class SendGrad(Communication):
    """Send the gradient of the chunk's input to the previous logical stage."""

    label: ClassVar[str] = "SG"
    direction: ClassVar[int] = -1
    message: ClassVar[str] = "grad"
    is_send: ClassVar[bool] = True


@dataclass(frozen=True, repr=False)
class RecvGrad(Communication):
    """Receive the gradient of the chunk's output from the next logical stage."""

    label: ClassVar[str] = "RG"
    direction: ClassVar[int] = 1
    message: ClassVar[str] = "grad"


@dataclass(frozen=True, repr=False)
class ReduceTiedGrads(Action):
    """Sum the gradients of tied weights over each tie group (before the data-parallel reduce)."""


@dataclass(frozen=True, repr=False)
class ReduceGrads(Action):
    """Average the stage's gradients over its data-parallel group."""


@dataclass(frozen=True, repr=False)
class OptimizerStep(Action):
    """Step the optimizer on the stage's own parameters."""


# Every action class by its label ("F", "BI", "SA"...) and every step action by its class name:
# the vocabulary of ``parse_actions`` and of the engine's gathered timeline.
MICRO_BATCH_ACTIONS = {
    cls.label: cls
    for cls in (Forward, Backward, BackwardInput, BackwardWeight, SendActivation,
                RecvActivation, SendGrad, RecvGrad)
}
STEP_ACTIONS = {cls.__name__: cls for cls in (ReduceTiedGrads, ReduceGrads, OptimizerStep)}
_LABEL = re.compile(r"(BI|BW|SA|RA|SG|RG|F|B)(\d+)(?:c(\d+))?")


def parse_action(text: str) -> Action:
    """The action a label names: ``"F3"``, ``"BW2c1"``, ``"ReduceGrads"``...

    Example: ``parse_action("BI2c1") == BackwardInput(2, chunk=1)``.
    """
    text = text.strip()
    if text in STEP_ACTIONS:
        return STEP_ACTIONS[text]()
    match = _LABEL.fullmatch(text)
    if match is None:
        raise ValueError(
            f"parse_action: {text!r} is not an action label; expected e.g. 'F3', 'B0', 'BI2', "
            f"'BW2c1', 'SA0', 'RG1' or one of {sorted(STEP_ACTIONS)}"
        )
    kind, micro_batch, chunk = match.groups()
    return MICRO_BATCH_ACTIONS[kind](int(micro_batch), int(chunk or 0))


def parse_actions(text: str) -> list[Action]:
    """The actions of a whitespace-separated list of labels: ``parse_actions("F0 F1 B0 B1")``."""
    return [parse_action(word) for word in text.split()]


def format_programs(
    programs: Sequence[Sequence[Action]], marks: Mapping[int, int] | None = None
) -> str:
    """Every stage's program on one line, action by action; ``marks`` (stage -> index) brackets
    the offending action of a stage and ends its line with ``<-- ERROR HERE``."""
    marks = marks or {}
    lines = []
    for stage, program in enumerate(programs):
        cells: Iterable[str] = (
            f"[{a!r}]" if marks.get(stage) == i else repr(a) for i, a in enumerate(program)
        )
        line = f"stage {stage}: " + " ".join(cells)
        if stage in marks:
            if marks[stage] >= len(program):
                line += " [end]"
            line += "   <-- ERROR HERE"
        lines.append(line)
    return "\n".join(lines)
