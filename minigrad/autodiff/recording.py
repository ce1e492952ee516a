"""The recording state shared by ``GradManager``, ``Function`` and ``Tensor``: the bottom of the
autodiff layer (it imports nothing from minigrad, so ``tensor.py`` can use it).

Each ``GradManager.record()`` opens a ``Recording``. ``STATE.tape`` is the tuple of recordings
that an op executed now is recorded for (outermost first); every recorded node keeps that tuple,
which is what makes liveness *per graph*:

- a node is alive while one of its recordings is active; once they have all ended, tensors it
  produced are constants in any later recording (their graph is dead, not reused);
- a GradManager back-propagates only through nodes that carry its own recording, so nested and
  grouped managers see exactly what MegEngine's would (see ``GradManager``);
- a backward frees the nodes it consumed and nothing else, so many graphs can live side by side in
  one recording and be back-propagated one by one, in any order.

While a manager runs its backward, ``tape`` is narrowed to the recordings entered *before* it (the
managers that see its backward, for higher-order gradients), and recording is off when there are
none.

Outside every GradManager, ops on tensors that require gradients are recorded for :data:`EAGER`,
the one permanent recording of PyTorch-style eager autograd (``loss.backward()`` without a
manager, see ``minigrad.autodiff.eager``). It is never in ``tape``: ``Function.__call__`` uses
:data:`EAGER_TAPE` only when ``tape`` is empty, so nothing inside ``with gm:`` changes.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref


class Recording:
    """One ``record()`` ... ``release()`` span of one GradManager.

    ``level`` orders visibility: a manager sees the backward of the managers whose recordings have
    a higher level (entered after it); the members of a ``GradManager | GradManager`` group share
    one level and do not see each other. ``consumed`` holds the nodes this recording's backward
    already went through but had to keep because another active recording still needs them.
    """

    __slots__ = ("_manager", "level", "active", "consumed")

    def __init__(self, manager, level: int):
        self._manager = weakref.ref(manager) if manager is not None else None
        self.level = level
        self.active = True
        self.consumed = None  # a WeakSet once needed

    def mark_consumed(self, node) -> None:
        """Remember that this recording's backward went through ``node`` (kept for another one)."""
        if self.consumed is None:
            self.consumed = weakref.WeakSet()
        self.consumed.add(node)

    @property
    def manager(self):
        """The GradManager that opened this recording (None for a private one, or once deleted)."""
        return self._manager() if self._manager is not None else None

    def bind(self, manager) -> None:
        """Make ``manager`` (held weakly) the one that back-propagates this recording's graphs:
        how ``minigrad.autodiff.eager`` takes charge of :data:`EAGER` without this module
        importing it."""
        self._manager = weakref.ref(manager)

    def __repr__(self) -> str:
        return f"Recording(level={self.level}, active={self.active})"


class _State:
    __slots__ = ("tape", "enabled", "seq", "backwarding", "recorders", "_levels")

    def __init__(self):
        self.tape: tuple = ()  # recordings new ops are recorded for, outermost first
        self.enabled = True  # False inside no_grad
        self.seq = 0  # creation counter of recorded nodes: a topological order of every graph
        self.backwarding: list = []  # stack of GradManagers inside a backward pass
        self.recorders: list = []  # GradManagers recording now, outermost first
        self._levels = itertools.count(1)

    def next_level(self) -> int:
        """A fresh visibility level (one per ``record()``, or one per group)."""
        return next(self._levels)


STATE = _State()

#: The permanent recording of eager autograd (ops outside every GradManager on tensors that
#: require gradients); always active, bound to its backward by ``minigrad.autodiff.eager``.
EAGER = Recording(None, level=0)
#: The tape of every eagerly recorded node (one tuple, so ``node._tape is EAGER_TAPE`` tells an
#: eager node in one comparison).
EAGER_TAPE = (EAGER,)


@contextlib.contextmanager
def no_grad():
    """Run a block without recording any op, even inside ``with gm:`` (like ``torch.no_grad``).

    Example::

        with gm, mg.no_grad():
            ema = 0.9 * ema + 0.1 * w  # not part of any graph
    """
    prev = STATE.enabled
    STATE.enabled = False
    try:
        yield
    finally:
        STATE.enabled = prev


@contextlib.contextmanager
def enable_grad():
    """Re-enable recording inside a ``no_grad`` block."""
    prev = STATE.enabled
    STATE.enabled = True
    try:
        yield
    finally:
        STATE.enabled = prev


@contextlib.contextmanager
def recording_for(tape: tuple):
    """Record the ops of a block for exactly the recordings in ``tape`` (recording is off when it
    is empty); how a backward pass records its ops only for the managers that see it."""
    prev_tape, prev_enabled = STATE.tape, STATE.enabled
    STATE.tape, STATE.enabled = tape, bool(tape)
    try:
        yield
    finally:
        if not all(r.active for r in prev_tape):  # a recording ended inside the block
            prev_tape = tuple(r for r in prev_tape if r.active)
        STATE.tape, STATE.enabled = prev_tape, prev_enabled


def is_recording() -> bool:
    """True when ops executed now would be recorded for some GradManager."""
    return STATE.enabled and bool(STATE.tape)


def shares_recording(node_tape: tuple, tape: tuple) -> bool:
    """Whether a node recorded for ``node_tape`` belongs to a graph that ``tape`` still records
    (the slow path of the liveness test: the fast one is ``node_tape is tape``)."""
    return any(r in tape for r in node_tape)
