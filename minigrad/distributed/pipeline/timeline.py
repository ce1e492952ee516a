"""What each rank of a pipeline did when: a timeline of actions, its bubble fraction, a Gantt chart.

The same record type serves a *simulated* step (:func:`~minigrad.distributed.pipeline.simulate`)
and a *measured* one (the engine stamps each action it runs), so a benchmark can put both side by
side. Every event says which rank ran which action on which micro-batch and chunk, and when::

    TimelineEvent(rank=0, action="F", micro_batch=3, chunk=0, start=0.50, end=0.75)

Only compute actions (``F``, ``B``, ``BI``, ``BW``) count as busy time. The **bubble fraction** is
the share of the step a rank spends idle, averaged over ranks:

    bubble = 1 - sum(compute time of every rank) / (ranks * span)

where ``span`` runs from the first event's start to the last event's end. For GPipe and 1F1B
with balanced stages it is ``(S - 1) / (M + S - 1)``.

:func:`plot_timeline` draws the chart with matplotlib, an optional dependency
(``pip install 'minigrad[bench]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

__all__ = ["COMPUTE_ACTIONS", "Timeline", "TimelineEvent", "bubble_fraction", "plot_timeline"]

COMPUTE_ACTIONS = frozenset({"F", "B", "BI", "BW"})

_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "BI": "#C44E52", "BW": "#55A868"}


@dataclass(frozen=True)
class TimelineEvent:
    """One action on one rank: ``action`` is its kind (``"F"``, ``"BI"``, ``"SA"``,
    ``"ReduceGrads"``...), ``micro_batch`` is None for per-step actions; times in seconds (or
    simulated units)."""

    rank: int
    action: str
    micro_batch: int | None
    chunk: int
    start: float
    end: float

    @classmethod
    def of(cls, rank: int, action, start: float, end: float) -> "TimelineEvent":
        """The event of a schedule action (a micro-batch action by its label, a per-step action by
        its name)."""
        mb = getattr(action, "micro_batch", None)
        label = action.label if mb is not None else repr(action)
        return cls(rank, label, mb, getattr(action, "chunk", 0), start, end)

    @property
    def duration(self) -> float:
        """``end - start``."""
        return self.end - self.start

    @property
    def is_compute(self) -> bool:
        """Whether the action is a forward or (part of a) backward: what counts as busy."""
        return self.action in COMPUTE_ACTIONS


class Timeline:
    """The events of one pipelined step (or several), from any number of ranks.

    Example::

        tl = Timeline([TimelineEvent(0, "F", 0, 0, 0.0, 1.0),
                       TimelineEvent(1, "F", 0, 0, 1.0, 2.0)])
        tl.ranks(), tl.span(), bubble_fraction(tl)   # ([0, 1], 2.0, 0.5)
    """

    def __init__(self, events: Iterable[TimelineEvent] = ()):
        self.events: list[TimelineEvent] = sorted(events, key=lambda e: (e.start, e.rank))

    def __iter__(self) -> Iterator[TimelineEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __add__(self, other: "Timeline") -> "Timeline":
        """The events of both timelines (e.g. the per-rank timelines gathered by an engine)."""
        return Timeline([*self.events, *other.events])

    def ranks(self) -> list[int]:
        """The ranks that have events, ascending."""
        return sorted({e.rank for e in self.events})

    def for_rank(self, rank: int) -> list[TimelineEvent]:
        """``rank``'s events in time order."""
        return [e for e in self.events if e.rank == rank]

    def span(self) -> float:
        """From the earliest start to the latest end (0 for an empty timeline)."""
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def busy(self, rank: int) -> float:
        """The compute time of ``rank``."""
        return sum(e.duration for e in self.events if e.rank == rank and e.is_compute)

    def __repr__(self) -> str:
        return f"Timeline({len(self.events)} events, ranks={self.ranks()}, span={self.span():g})"


def bubble_fraction(timeline: Timeline) -> float:
    """The idle share of the step, averaged over the timeline's ranks (0 = always busy).

    Example: 4 stages and 8 micro-batches of 1F1B have ``bubble_fraction == 3 / 11``.
    """
    ranks = timeline.ranks()
    span = timeline.span()
    if not ranks or span <= 0:
        raise ValueError("bubble_fraction: the timeline has no events with a positive span")
    busy = sum(timeline.busy(r) for r in ranks)
    return 1.0 - busy / (len(ranks) * span)


def plot_timeline(timeline: Timeline, path: str, title: str | None = None):
    """Draw ``timeline`` as a Gantt chart (one row per rank, a box per compute action labelled
    with its micro-batch) and save it to ``path`` (PNG, SVG or PDF by extension). The title
    shows the measured bubble fraction. Returns the matplotlib ``Figure``.

    Needs matplotlib: ``pip install "minigrad[bench]"``; draws with the Agg canvas (no pyplot),
    so it works without a display.

    Example: ``plot_timeline(schedule.simulate(), "timeline.png")``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:  # one line naming the extra, not the import machinery's traceback
        raise ImportError(
            f'plot_timeline needs matplotlib ({e}): pip install "minigrad[bench]" '
            '(or pip install -e ".[bench]" in a checkout)'
        ) from None
    ranks = timeline.ranks()
    bubble = bubble_fraction(timeline)
    origin = min(e.start for e in timeline)
    fig = Figure(figsize=(max(6.0, 0.25 * len(timeline.events) / max(len(ranks), 1)),
                          0.6 * len(ranks) + 1.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for e in timeline:
        if not e.is_compute:
            continue
        row = ranks.index(e.rank)
        ax.barh(row, e.duration, left=e.start - origin, height=0.8,
                color=_COLOURS[e.action], edgecolor="black", linewidth=0.5,
                alpha=1.0 if e.chunk % 2 == 0 else 0.6)
        label = "" if e.micro_batch is None else str(e.micro_batch)
        ax.text(e.start - origin + e.duration / 2, row, label, ha="center", va="center",
                fontsize=7, color="white")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    present = [a for a in _COLOURS if any(e.action == a for e in timeline)]
    ax.legend(handles=[Patch(color=_COLOURS[a], label=a) for a in present],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    heading = f"{title} — " if title else ""
    ax.set_title(f"{heading}bubble fraction {bubble:.1%}")
    fig.tight_layout()
    fig.savefig(path)
    return fig
