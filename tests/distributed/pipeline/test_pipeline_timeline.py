"""Timelines: the bubble fraction of hand-made and simulated steps, and the Gantt chart.

The chart needs matplotlib, the optional ``[bench]`` extra, which ``[test]`` pulls in: the
drawing test runs everywhere the README's test command runs; the error a missing matplotlib
raises is tested by hiding it.
"""

import sys

import pytest

from minigrad.distributed.pipeline import (
    OneFOneB,
    Timeline,
    TimelineEvent,
    ZeroBubbleH1,
    bubble_fraction,
    plot_timeline,
)


def test_bubble_fraction_by_hand():
    events = [
        TimelineEvent(0, "F", 0, 0, 0.0, 1.0),
        TimelineEvent(0, "SA", 0, 0, 1.0, 1.0),       # transfers are not busy time
        TimelineEvent(1, "F", 0, 0, 1.0, 2.0),
        TimelineEvent(1, "B", 0, 0, 2.0, 4.0),
        TimelineEvent(0, "B", 0, 0, 4.0, 6.0),
        TimelineEvent(0, "OptimizerStep", None, 0, 6.0, 6.0),
    ]
    timeline = Timeline(events)
    assert timeline.ranks() == [0, 1]
    assert timeline.span() == 6.0
    assert (timeline.busy(0), timeline.busy(1)) == (3.0, 3.0)
    assert bubble_fraction(timeline) == pytest.approx(1 - 6 / 12)
    merged = Timeline(events[:2]) + Timeline(events[2:])
    assert [e.start for e in merged] == [e.start for e in timeline]


def test_bubble_fraction_of_an_empty_timeline_is_an_error():
    with pytest.raises(ValueError, match="no events"):
        bubble_fraction(Timeline())


def test_zero_bubble_h1_has_a_third_of_the_1f1b_idle_time():
    S, M = 4, 8
    ofob = OneFOneB(S, M).simulate(tF=1, tB=2)
    zb = ZeroBubbleH1(S, M).simulate(tF=1, tI=1, tW=1)
    assert bubble_fraction(ofob) == pytest.approx(3 / 11)
    assert bubble_fraction(ofob) * ofob.span() == pytest.approx(9)       # idle per stage
    assert bubble_fraction(zb) * zb.span() == pytest.approx(3)


def test_plot_timeline_writes_a_png_with_the_bubble_in_the_title(tmp_path):
    path = tmp_path / "timeline.png"
    timeline = OneFOneB(4, 8).simulate(tF=1, tB=2)
    fig = plot_timeline(timeline, str(path), title="1F1B, 4 stages x 8 micro-batches")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.axes[0].get_title() == "1F1B, 4 stages x 8 micro-batches — bubble fraction 27.3%"
    assert len(fig.axes[0].patches) == 4 * 16     # one box per forward and backward


def test_plot_timeline_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
                 "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'^plot_timeline needs matplotlib .*: '
                                          r'pip install "minigrad\[bench\]"') as caught:
        plot_timeline(OneFOneB(2, 2).simulate(), str(tmp_path / "t.png"))
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "\n" not in str(caught.value)
