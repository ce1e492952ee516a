"""Global recording state shared by GradManagers, Function and Tensor.

``recording`` counts the GradManagers currently recording; ops record a graph node only while it is
positive, ``enabled`` is on, and some input needs a gradient. ``epoch`` advances whenever the last
recording ends: a node made in an earlier epoch is dead, so tensors kept from an old step behave as
constants instead of dragging a freed graph into the next one.
"""

from __future__ import annotations

import contextlib


class _State:
    __slots__ = ("recording", "enabled", "epoch", "seq", "backwarding", "recorders")

    def __init__(self):
        self.recording = 0
        self.enabled = True
        self.epoch = 0
        self.seq = 0
        self.backwarding = []  # stack of GradManagers inside backward()
        self.recorders = []  # GradManagers recording now, outermost first


STATE = _State()


@contextlib.contextmanager
def no_grad():
    """Run a block without recording any op, even inside ``with gm:`` (like ``torch.no_grad``)."""
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


def is_recording() -> bool:
    """True when ops executed now would be recorded for some GradManager."""
    return STATE.recording > 0 and STATE.enabled
