"""OneFlow's ``nn.graph.GraphModule``: the settings a module has inside a graph.

OneFlow programs mark the pipeline stages of a graph with
``self.stage0.to(nn.graph.GraphModule).set_stage(stage_id=0, placement=P0)`` in the graph's
``__init__``. ``Module.to(GraphModule)`` returns this handle; ``set_stage`` records the stage on
the module, and the graph (``mg.Graph``) picks up the stages of the modules it holds when it is
first called — the same as its one-line ``self.set_stage(module, stage_id, placement)``.

Example::

    class Step(mg.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.stage0.to(GraphModule).set_stage(stage_id=0, placement=P0)
"""

from __future__ import annotations

import weakref

__all__ = ["GraphModule"]

_STAGES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> (stage, placement)


class GraphModule:
    """A module seen from a graph (see the module docstring); ``Module.to(GraphModule)``."""

    def __init__(self, module) -> None:
        self.module = module

    def set_stage(self, stage_id: int, placement=None) -> "GraphModule":
        """Make the module pipeline stage ``stage_id`` of the graph that holds it, its parameters
        on ``placement``; checked when the graph takes it (see ``mg.Graph.set_stage``)."""
        if isinstance(stage_id, bool) or not isinstance(stage_id, int) or stage_id < 0:
            raise ValueError(f"GraphModule.set_stage: stage_id must be an int >= 0, got "
                             f"{stage_id!r}")
        _STAGES[self.module] = (stage_id, placement)
        return self

    @property
    def stage_id(self) -> int | None:
        """The stage set for the module, None when none was."""
        entry = _STAGES.get(self.module)
        return None if entry is None else entry[0]

    @staticmethod
    def stage_of(module) -> tuple | None:
        """``(stage_id, placement)`` set for ``module``, or None."""
        return _STAGES.get(module)
