"""Pipeline schedules as data: validity, grids, FIFO simulation, activation peaks and timing.

No processes: schedules are pure functions of (stages, micro-batches, chunks), checked here
against independent counts and the closed-form step times of PARALLELISM.md section 3.
"""

import itertools

import pytest

from minigrad.distributed.pipeline import (
    CustomSchedule,
    GPipe,
    InferenceSchedule,
    Interleaved1F1B,
    OneFOneB,
    ScheduleError,
    ZeroBubbleH1,
    bubble_fraction,
    get_schedule,
    parse_actions,
    simulate,
)
from minigrad.distributed.pipeline.actions import (
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    OptimizerStep,
    RecvActivation,
    ReduceGrads,
    SendActivation,
    parse_action,
)

STAGES = range(1, 6)
MICRO_BATCHES = range(1, 10)
CHUNKS = range(1, 4)

# PARALLELISM.md section 3.2: DeepSpeed's 1F1B order for S=4, M=8, re-derived from its generator.
DEEPSPEED_1F1B_4x8 = """\
stage 0: F0 .  F1 .  F2 .  F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
stage 1: .  F0 .  F1 .  F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
stage 2: .  .  F0 .  F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
stage 3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  ."""


def all_schedules():
    """Every built-in schedule for every shape of the sweep (interleaved only where M % S == 0)."""
    for S, M in itertools.product(STAGES, MICRO_BATCHES):
        yield OneFOneB(S, M)
        yield ZeroBubbleH1(S, M)
        for v in CHUNKS:
            yield GPipe(S, M, chunks=v)
            yield InferenceSchedule(S, M, chunks=v)
            if M % S == 0:
                yield Interleaved1F1B(S, M, chunks=v)


def assert_complete_and_ordered(sched):
    """Independent of the validator: every (micro-batch, chunk) runs one forward and one full or
    split backward, in order; transfers surround them exactly where a neighbour exists."""
    S, M, v = sched.stages, sched.micro_batches, sched.chunks
    for s in range(S):
        program = sched.actions(s)
        assert len(set(program)) == len(program), f"{sched!r} stage {s} repeats an action"
        where = {a: i for i, a in enumerate(program)}
        for m, c in itertools.product(range(M), range(v)):
            position = c * S + s
            f = where[Forward(m, c)]
            assert (RecvActivation(m, c) in where) == (position > 0)
            assert (SendActivation(m, c) in where) == (position < S * v - 1)
            if position > 0:
                assert where[RecvActivation(m, c)] < f
            if not sched.training:
                continue
            if Backward(m, c) in where:
                assert where[Backward(m, c)] > f
                assert BackwardInput(m, c) not in where and BackwardWeight(m, c) not in where
            else:
                assert f < where[BackwardInput(m, c)] < where[BackwardWeight(m, c)]
        if sched.training:
            assert [repr(a) for a in program[-3:]] == [
                "ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]
        else:
            assert all(isinstance(a, (Forward, RecvActivation, SendActivation)) for a in program)


def test_every_schedule_is_complete_ordered_and_deadlock_free():
    count = 0
    for sched in all_schedules():
        assert_complete_and_ordered(sched)
        sched.simulate()                       # FIFO channels, buffered sends: raises on deadlock
        count += 1
    assert count == 5 * 9 * 2 + 5 * 9 * 3 * 2 + sum(
        len(CHUNKS) for S in STAGES for M in MICRO_BATCHES if M % S == 0)


def test_deepspeed_1f1b_grid_is_reproduced_exactly():
    sched = OneFOneB(stages=4, micro_batches=8)
    assert sched.render() == DEEPSPEED_1F1B_4x8
    assert " ".join(map(repr, sched.compute_order(0))) == (
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7")


@pytest.mark.parametrize("S", STAGES)
@pytest.mark.parametrize("M", MICRO_BATCHES)
def test_1f1b_lockstep_grid_runs_the_program_order(S, M):
    sched = OneFOneB(S, M)
    grid = sched.steps()
    assert all(len(row) == 2 * (M + S - 1) for row in grid)
    for s in range(S):
        assert [a for a in grid[s] if a is not None] == sched.compute_order(s)


@pytest.mark.parametrize("S", STAGES)
@pytest.mark.parametrize("M", MICRO_BATCHES)
def test_peak_live_activations(S, M):
    gpipe, ofob, zb = GPipe(S, M), OneFOneB(S, M), ZeroBubbleH1(S, M)
    for s in range(S):
        assert gpipe.peak_activations(s) == M
        assert ofob.peak_activations(s) == min(S - s, M)
        # activations are freed after the weight pass: ZB-H1 never exceeds 1F1B's peak
        assert zb.peak_activations(s) <= min(S, M)
    assert max(zb.peak_activations(s) for s in range(S)) == max(
        ofob.peak_activations(s) for s in range(S))
    for v in CHUNKS:
        assert GPipe(S, M, chunks=v).peak_activations(0) == M * v
        if M % S == 0:
            # Megatron's warm-up: 2 (S - 1) + (v - 1) S chunk-forwards before the first backward
            expected = M * v if M == S else min((v + 1) * S - 1, M * v)
            assert Interleaved1F1B(S, M, chunks=v).peak_activations(0) == expected


@pytest.mark.parametrize("tF, tB", [(1.0, 2.0), (0.5, 1.25)])
def test_gpipe_and_1f1b_step_time_and_bubble(tF, tB):
    for S, M in itertools.product(STAGES, MICRO_BATCHES):
        for sched in (GPipe(S, M), OneFOneB(S, M)):
            timeline = sched.simulate(tF=tF, tB=tB)
            assert timeline.span() == pytest.approx((M + S - 1) * (tF + tB), abs=1e-12)
            assert bubble_fraction(timeline) == pytest.approx((S - 1) / (M + S - 1), abs=1e-12)


def test_interleaved_step_time():
    tF, tB = 1.0, 2.0
    for S, M, v in itertools.product(STAGES, MICRO_BATCHES, CHUNKS):
        if M % S == 0:
            span = Interleaved1F1B(S, M, chunks=v).simulate(tF=tF, tB=tB).span()
            assert span == pytest.approx(M * (tF + tB) + (S - 1) * (tF + tB) / v, abs=1e-12)


def test_zero_bubble_h1_fills_the_drain_with_weight_passes():
    S, M = 4, 8
    zb = ZeroBubbleH1(S, M).simulate(tF=1, tI=1, tW=1)
    ofob = OneFOneB(S, M).simulate(tF=1, tB=2)
    assert ofob.span() == (M + S - 1) * 3 == 33
    # M (tF + tI + tW) + (S - 1)(tF + tI - tW): a third of 1F1B's idle time per stage (3 vs 9)
    assert zb.span() == M * 3 + (S - 1) * 1 == 27
    assert zb.span() - M * 3 == (ofob.span() - M * 3) / 3
    # ...and the lower bound of any flushed schedule: the last stage cannot start before
    # (S - 1) tF and then has M (tF + tI + tW) of work. So 27/33 = 18.2% less time is the most
    # any schedule can gain here (a 25% gain would need a span of 24.75 < 27).
    assert zb.span() == (S - 1) * 1 + M * 3
    assert 1 - zb.span() / ofob.span() > 0.18


def test_zero_bubble_h1_step_time_formula_when_m_at_least_s():
    for S, M in itertools.product(STAGES, MICRO_BATCHES):
        if M >= S:
            span = ZeroBubbleH1(S, M).simulate(tF=1, tI=1, tW=1).span()
            assert span == M * 3 + (S - 1)


def test_schedule_shape_errors():
    with pytest.raises(ValueError, match=r"micro_batches \(6\) must be a multiple of stages \(4\)"):
        Interleaved1F1B(4, 6, chunks=2)
    with pytest.raises(ValueError, match="use Interleaved1F1B"):
        OneFOneB(2, 4, chunks=2)
    with pytest.raises(ValueError, match="chunks must be 1"):
        ZeroBubbleH1(2, 4, chunks=2)
    with pytest.raises(ValueError, match="micro_batches must be a positive integer, got 0"):
        GPipe(2, 0)
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        GPipe(True, 2)


def test_action_labels_round_trip():
    assert [repr(a) for a in (Forward(3), Backward(0), BackwardInput(2), BackwardWeight(2))] == [
        "F3", "B0", "BI2", "BW2"]
    assert repr(Forward(3, chunk=1)) == "F3c1"
    assert repr(ReduceGrads()) == "ReduceGrads"
    labels = "F0 B1 BI2 BW3c2 SA4 RA5c1 SG6 RG7 ReduceTiedGrads ReduceGrads OptimizerStep"
    assert " ".join(map(repr, parse_actions(labels))) == labels
    assert parse_action("BW2c1") == BackwardWeight(2, chunk=1)
    assert parse_action("B2") != BackwardInput(2)
    with pytest.raises(ValueError, match="'X3' is not an action label"):
        parse_action("X3")


def test_communication_peers_wrap_around_chunks():
    # 2 stages x 2 chunks: logical stages r0c0 -> r1c0 -> r0c1 -> r1c1
    assert SendActivation(0, chunk=0).peer(stage=1, stages=2) == (0, 1)
    assert RecvActivation(0, chunk=1).peer(stage=0, stages=2) == (1, 0)
    assert SendActivation(0, 0).key(1, 2) == RecvActivation(0, 1).key(0, 2)


def test_get_schedule():
    assert isinstance(get_schedule("1F1B", 2, 4), OneFOneB)
    assert get_schedule(Interleaved1F1B, 2, 4, chunks=3).chunks == 3
    sched = ZeroBubbleH1(2, 4)
    assert get_schedule(sched, 2, 4) is sched
    with pytest.raises(ValueError, match="does not match the pipeline"):
        get_schedule(sched, 2, 8)
    with pytest.raises(ValueError, match="unknown schedule 'pipedream'"):
        get_schedule("pipedream", 2, 4)


def test_inference_schedule_has_forwards_only():
    sched = InferenceSchedule(3, 4)
    assert all(isinstance(a, (Forward, RecvActivation, SendActivation))
               for s in range(3) for a in sched.actions(s))
    assert sched.simulate(tF=1).span() == 4 + 3 - 1


def test_render_marks_idle_steps_and_chunks():
    text = Interleaved1F1B(2, 2, chunks=2).render().splitlines()
    assert text[0].split()[2:6] == ["F0", "F1", "F0c1", "F1c1"]
    assert text[1].split()[2] == "."


def test_custom_schedule_accepts_a_valid_order():
    sched = CustomSchedule(["F0 F1 B0 B1", "F0 B0 F1 B1"], micro_batches=2)
    assert sched.render() == "stage 0: F0 F1 .  B0 .  B1\nstage 1: .  F0 B0 F1 B1 ."
    assert sched.actions(1)[-1] == OptimizerStep()


@pytest.mark.parametrize("programs, message, marked", [
    (["F0 F1 B0 B1", "F0 B1 F1 B0"], "B1 runs before its forward F1", (1, "[B1]")),
    (["F0 F0 B0", "F0 B0"], "F0 appears twice", (0, "[F0]")),
    (["F0 F1 B0", "F0 B0 F1 B1"], "B1 is missing", (0, "[end]")),
    (["F0 F1 BW0 BI0 B1", "F0 F1 B0 B1"], "BW0 runs before its input pass BI0", (0, "[BW0]")),
    (["F0 F1 B0 BI1 B1", "F0 F1 B0 B1"], "already has a split backward", (0, "[B1]")),
    (["F0 F1 B0 B1 BI1", "F0 F1 B0 B1"], "already ran a full backward", (0, "[BI1]")),
    (["F0 F1 B0 B1", "F1 F0 B0 B1"], "channels are FIFO", (1, "[RA1]")),
    (["F0 B0 F1 B1", "F0 F1 B0 B1"], "deadlocks", (0, "[RG0]")),
    (["F0 F2 B0 B2", "F0 B0 F2 B2"], "micro-batch 2 is outside", (0, "[F2]")),
])
def test_custom_schedule_errors_show_the_grid_with_the_error_marked(programs, message, marked):
    with pytest.raises(ScheduleError) as info:
        CustomSchedule(programs, micro_batches=2)
    text = str(info.value)
    assert message in text
    stage, cell = marked
    line = next(row for row in text.splitlines() if row.startswith(f"stage {stage}:"))
    assert cell in line and line.endswith("<-- ERROR HERE")


def test_custom_schedule_with_explicit_communication_is_checked():
    ok = [parse_actions("F0 SA0 RG0 B0 ReduceTiedGrads ReduceGrads OptimizerStep"),
          parse_actions("RA0 F0 B0 SG0 ReduceTiedGrads ReduceGrads OptimizerStep")]
    CustomSchedule(ok, micro_batches=1, add_communication=False)
    no_next = [ok[0], ok[1][:2] + parse_actions("SA0") + ok[1][2:]]
    with pytest.raises(ScheduleError, match="logical stage 1 has no next stage"):
        CustomSchedule(no_next, micro_batches=1, add_communication=False)
    early_step = [ok[0], ok[1][:2] + [ReduceGrads()] + ok[1][2:]]
    with pytest.raises(ScheduleError, match="ReduceGrads is out of place"):
        CustomSchedule(early_step, micro_batches=1, add_communication=False)
    with pytest.raises(ValueError, match="add_communication=True the programs hold only"):
        CustomSchedule(ok, micro_batches=1)
    with pytest.raises(ScheduleError, match="inference schedule has no backward"):
        CustomSchedule(["F0 B0"], micro_batches=1, training=False)


def test_simulator_times_a_two_stage_step_by_hand():
    timeline = OneFOneB(2, 1).simulate(tF=1, tB=2, latency=0.5)
    compute = [(e.rank, e.action, e.start, e.end) for e in timeline if e.is_compute]
    assert compute == [(0, "F", 0.0, 1.0), (1, "F", 1.5, 2.5), (1, "B", 2.5, 4.5),
                       (0, "B", 5.0, 7.0)]


def test_simulator_reports_unreceived_messages():
    programs = [[Forward(0), SendActivation(0)], [Forward(0)]]
    with pytest.raises(ScheduleError, match="stage 0 sends the activation of micro-batch 0 for "
                                            "logical stage 1 to stage 1, which never receives it"):
        simulate(programs, 2, {"F": 1})


def test_blocking_sends_deadlock_where_buffered_sends_do_not():
    """Why the engine uses buffered sends: in 1F1B's steady state neighbours both send first."""
    programs = OneFOneB(4, 8).programs()
    simulate(programs, 4, {"F": 1, "B": 2}, sends="buffered")
    with pytest.raises(ScheduleError, match="deadlocks with blocking sends") as info:
        simulate(programs, 4, {"F": 1, "B": 2}, sends="blocking")
    assert "stage 3 waits at SG0" in str(info.value)
    simulate(GPipe(3, 2).programs(), 3, {"F": 1, "B": 2}, sends="blocking")
