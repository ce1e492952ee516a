"""DeepSpeed's learning-rate schedulers (``deepspeed.runtime.lr_schedules``) and the config's
``scheduler`` section: each schedule equals the formula of DeepSpeed's documentation, written
here independently (1e-12) over a few hundred steps; the CIFAR-10 tutorial's own ds_config (with
its WarmupLR) trains on 2 ranks like a one-process run that applies the formula; checkpoints keep
the scheduler's position; the errors name what is accepted."""

import json
import math
import warnings

import numpy as np
import pytest
from ds_programs import Net, ToySet, cifar_tutorial, pipeline_tutorial, reference

import minigrad.distributed.deepspeed as deepspeed
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.distributed.deepspeed.config import DeepSpeedConfigError
from minigrad.distributed.deepspeed.runtime.lr_schedules import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)
from minigrad.testing.distributed import run_workers

STEPS = 300

#: the CIFAR-10 tutorial's ds_config.json, verbatim (DeepSpeed's docs/_tutorials/cifar-10.md)
CIFAR_DS_CONFIG = {
    "train_batch_size": 4,
    "steps_per_print": 2000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                             "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                 "warmup_num_steps": 1000}},
    "wall_clock_breakdown": False,
}


def _two_groups(cls=optim.SGD, lrs=(0.1, 0.02)):
    a, b = Parameter(np.zeros(3)), Parameter(np.zeros(2))
    return cls([{"params": [a], "lr": lrs[0]}, {"params": [b], "lr": lrs[1]}])


def _rates(opt, sched, steps=STEPS, key="lr"):
    """The groups' values after construction and after each of ``steps`` steps."""
    out = [[g[key] for g in opt.param_groups]]
    for _ in range(steps):
        sched.step()
        out.append([g[key] for g in opt.param_groups])
    return np.array(out, dtype=object if key == "betas" else float)


# -- the formulas, from DeepSpeed's documentation; ``k`` = steps taken (iteration k - 1) ---------
def warmup_factor(kind, k, n):
    """0 -> 1 over the warm-up: log(k) / log(n) (log) or (k - 1) / n (linear); 0 before any step,
    1 once k > n."""
    if k == 0:
        return 0.0
    if k > n:
        return 1.0
    return math.log(k) / math.log(n) if kind == "log" else (k - 1) / n


def warmup_lr(lo, hi, n, kind, k):
    return lo + (hi - lo) * warmup_factor(kind, k, n)


def warmup_decay_lr(lo, hi, n, total, kind, k):
    if k <= n:
        return warmup_lr(lo, hi, n, kind, k)
    return lo + (hi - lo) * max(0.0, (total - (k - 1)) / (total - n))


def warmup_cosine_lr(base, n, total, min_ratio, cos_min, kind, k):
    if k == 0:
        return 0.0
    if k <= n:
        return base * (min_ratio + (1 - min_ratio) * warmup_factor(kind, k, n))
    progress = (k - n) / (total - n)
    return base * max(0.0, cos_min + (1 - cos_min) * (1 + math.cos(math.pi * progress)) / 2)


def one_cycle(lo, hi, up, down, decay_rate, decay_every, k):
    """The triangle min -> max over ``up`` steps, back over ``down``; then min / (1 + rate * d /
    decay_every) with d = steps past the cycle. The position counts from step k (i + 1 = k)."""
    if k - 1 < up + down:
        t = k % (up + down)
        s = t / up if t <= up else (up + down - t) / down
        return lo + (hi - lo) * s
    return lo / (1 + decay_rate * (k - up - down) / decay_every)


def one_cycle_momentum(lo, hi, up, down, decay_rate, decay_every, k):
    """Inverse to the rate: max -> min -> max, then max * (1 + rate * d / decay_every)."""
    if k - 1 < up + down:
        t = k % (up + down)
        s = t / up if t <= up else (up + down - t) / down
        return hi - (hi - lo) * s
    return hi * (1 + decay_rate * (k - up - down) / decay_every)


def range_test(lo, rate, size, staircase, k):
    fraction = k / size
    return lo * (1 + rate * (math.floor(fraction) if staircase else fraction))


def _check(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# -- each schedule against its formula ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr_per_group(kind):
    opt = _two_groups()
    sched = WarmupLR(opt, warmup_min_lr=[0.0, 0.001], warmup_max_lr=[0.01, 0.05],
                     warmup_num_steps=120, warmup_type=kind)
    want = [[warmup_lr(lo, hi, 120, kind, k) for lo, hi in ((0.0, 0.01), (0.001, 0.05))]
            for k in range(STEPS + 1)]
    _check(_rates(opt, sched), want)
    assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups] == [0.01, 0.05]


def test_warmup_lr_defaults_and_warmup_of_one_step():
    opt = _two_groups()
    sched = WarmupLR(opt)  # 0 -> 0.001 over 1000 steps, log
    _check(_rates(opt, sched, 50)[:, 0], [warmup_lr(0, 1e-3, 1000, "log", k) for k in range(51)])
    short = WarmupLR(_two_groups(), warmup_num_steps=1)  # DeepSpeed warms up over at least 2
    assert short.warmup_num_steps == 2


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_lr_reaches_zero_at_total_steps(kind):
    opt = _two_groups()
    sched = WarmupDecayLR(opt, total_num_steps=250, warmup_min_lr=0.001, warmup_max_lr=0.01,
                          warmup_num_steps=60, warmup_type=kind)
    got = _rates(opt, sched)
    _check(got[:, 0], [warmup_decay_lr(0.001, 0.01, 60, 250, kind, k)
                       for k in range(STEPS + 1)])
    assert got[251, 0] == pytest.approx(0.001) and got[-1, 0] == pytest.approx(0.001)


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_cosine_lr_scales_each_groups_rate(kind):
    opt = _two_groups(lrs=(0.1, 0.02))
    sched = WarmupCosineLR(opt, total_num_steps=260, warmup_min_ratio=0.1, warmup_num_steps=40,
                           cos_min_ratio=0.01, warmup_type=kind)
    want = [[warmup_cosine_lr(base, 40, 260, 0.1, 0.01, kind, k) for base in (0.1, 0.02)]
            for k in range(STEPS + 1)]
    _check(_rates(opt, sched), want)


def test_one_cycle_cycles_rate_and_adam_momentum_then_decays():
    opt = _two_groups(optim.Adam)
    sched = OneCycle(opt, cycle_min_lr=0.01, cycle_max_lr=0.1, decay_lr_rate=0.5,
                     cycle_first_step_size=40, cycle_second_step_size=60, decay_step_size=10,
                     cycle_min_mom=0.85, cycle_max_mom=0.95, decay_mom_rate=0.01)
    lrs = [[g["lr"] for g in opt.param_groups]]
    moms = [[g["betas"] for g in opt.param_groups]]
    for _ in range(STEPS):
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        moms.append([g["betas"] for g in opt.param_groups])
    want = [one_cycle(0.01, 0.1, 40, 60, 0.5, 10, k) for k in range(STEPS + 1)]
    _check(np.array(lrs), np.array([want, want]).T)
    want_mom = [one_cycle_momentum(0.85, 0.95, 40, 60, 0.01, 10, k) for k in range(1, STEPS + 1)]
    _check(np.array([[m[0] for m in step] for step in moms[1:]]), np.array([want_mom] * 2).T)
    assert moms[0] == [(0.85, 0.99)] * 2  # construction writes the lower bounds
    assert {m[1] for step in moms for m in step} == {0.99}  # DeepSpeed's fixed beta2
    assert max(lrs)[0] == pytest.approx(0.1)


def test_one_cycle_without_decay_holds_min_and_sgd_keeps_its_momentum():
    opt = _two_groups(lambda groups: optim.SGD(groups, momentum=0.9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = OneCycle(opt, 0.001, 0.004, cycle_first_step_size=30)
    got = _rates(opt, sched, 120)
    _check(got[:, 1], [one_cycle(0.001, 0.004, 30, 30, 0.0, 1, k) if k <= 60 else 0.001
                       for k in range(121)])
    assert not sched.cycle_momentum and sched.get_mom() is None
    assert all(g["momentum"] == 0.9 and "betas" not in g for g in opt.param_groups)


@pytest.mark.parametrize("staircase", [False, True])
def test_lr_range_test(staircase):
    opt = _two_groups()
    sched = LRRangeTest(opt, lr_range_test_min_lr=[1e-4, 2e-4], lr_range_test_step_size=25,
                        lr_range_test_step_rate=3.0, lr_range_test_staircase=staircase)
    want = [[range_test(lo, 3.0, 25, staircase, k) for lo in (1e-4, 2e-4)]
            for k in range(STEPS + 1)]
    _check(_rates(opt, sched), want)


# -- DeepSpeed's counter, state dict and jumps ----------------------------------------------------
def test_state_dict_is_the_counter_and_a_loaded_scheduler_continues():
    opt = _two_groups()
    sched = WarmupDecayLR(opt, 200, warmup_max_lr=0.01, warmup_num_steps=50)
    for _ in range(70):
        sched.step()
    assert sched.state_dict() == {"last_batch_iteration": 69}
    other = _two_groups()
    resumed = WarmupDecayLR(other, 200, warmup_max_lr=0.01, warmup_num_steps=50)
    resumed.load_state_dict(sched.state_dict())
    sched.step()
    resumed.step()
    assert resumed.get_last_lr() == sched.get_last_lr()
    _check(sched.get_last_lr()[0], warmup_decay_lr(0, 0.01, 50, 200, "log", 71))


def test_step_jumps_and_resume_from_last_batch_iteration():
    opt = _two_groups()
    sched = WarmupLR(opt, warmup_max_lr=0.01, warmup_num_steps=100, warmup_type="linear")
    sched.step(last_batch_iteration=49)
    _check(opt.param_groups[0]["lr"], warmup_lr(0, 0.01, 100, "linear", 50))
    cycle = OneCycle(_two_groups(optim.Adam), 0.01, 0.1, cycle_first_step_size=10)
    cycle.step(batch_iteration=9)  # OneCycle and LRRangeTest name it batch_iteration
    assert cycle.get_last_lr() == pytest.approx([0.1, 0.1])
    # resuming at a given index writes nothing until the first step, as DeepSpeed
    fresh = _two_groups()
    resumed = WarmupLR(fresh, warmup_max_lr=0.01, warmup_num_steps=100, last_batch_iteration=49)
    assert [g["lr"] for g in fresh.param_groups] == [0.1, 0.02]
    with pytest.raises(RuntimeError, match=r"WarmupLR.get_last_lr: no rate was written yet"):
        resumed.get_last_lr()
    resumed.step()
    _check(resumed.get_last_lr()[0], warmup_lr(0, 0.01, 100, "log", 51))


def test_scheduler_argument_errors():
    with pytest.raises(ValueError, match=r"WarmupLR: expected 2 value\(s\) for warmup_max_lr "
                                         r"\(one per param group\), got 3"):
        WarmupLR(_two_groups(), warmup_max_lr=[0.1, 0.2, 0.3])
    with pytest.raises(TypeError, match="WarmupLR: expected a minigrad Optimizer .* got dict"):
        WarmupLR({"lr": 0.1})
    with pytest.raises(ValueError, match="LRRangeTest: lr_range_test_step_size must be > 0"):
        LRRangeTest(_two_groups(), lr_range_test_step_size=0)
    with pytest.raises(ValueError, match="WarmupCosineLR: warmup_type must be 'log' or 'linear', "
                                         "got 'cosine'"):
        WarmupCosineLR(_two_groups(), 100, warmup_type="cosine")


# -- the config's scheduler section ---------------------------------------------------------------
def _config(scheduler, **extra):
    return {"train_batch_size": 4, "steps_per_print": 1000,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "scheduler": scheduler, **extra}


def _train(engine, steps, overflow=()):
    data = ToySet()
    for i in range(steps):
        loss = M.CrossEntropyLoss()(engine(Tensor(data.x[:4])), Tensor(data.y[:4]))
        if i in overflow:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()


def test_the_config_builds_each_scheduler_type():
    cases = {
        "WarmupLR": ({"warmup_max_lr": 0.02, "warmup_num_steps": 8}, WarmupLR,
                     lambda k: warmup_lr(0, 0.02, 8, "log", k)),
        "WarmupDecayLR": ({"total_num_steps": 12, "warmup_max_lr": 0.02, "warmup_num_steps": 4,
                           "warmup_type": "linear"}, WarmupDecayLR,
                          lambda k: warmup_decay_lr(0, 0.02, 4, 12, "linear", k)),
        "WarmupCosineLR": ({"total_num_steps": 12, "warmup_num_steps": 4}, WarmupCosineLR,
                           lambda k: warmup_cosine_lr(0.1, 4, 12, 0, 1e-4, "log", k)),
        "OneCycle": ({"cycle_min_lr": 0.01, "cycle_max_lr": 0.05, "cycle_first_step_size": 3},
                     OneCycle, lambda k: one_cycle(0.01, 0.05, 3, 3, 0, 1, k)),
        "LRRangeTest": ({"lr_range_test_step_size": 5}, LRRangeTest,
                        lambda k: range_test(1e-3, 1.0, 5, False, k)),
    }
    for kind, (params, cls, formula) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine, opt, _, sched = deepspeed.initialize(
                model=Net(), config=_config({"type": kind, "params": params}))
        assert type(sched) is cls and engine.lr_scheduler is sched, kind
        _train(engine, 5)
        _check(opt.param_groups[0]["lr"], formula(5))


def test_a_skipped_fp16_step_does_not_step_the_config_scheduler():
    engine, opt, _, sched = deepspeed.initialize(model=Net(), config=_config(
        {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 10,
                                        "warmup_type": "linear"}}, fp16={"enabled": True}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scaler's overflow report
        _train(engine, 5, overflow={1, 3})
    assert engine.skipped_steps == 2 and sched.last_batch_iteration == 2
    _check(opt.param_groups[0]["lr"], warmup_lr(0, 0.02, 10, "linear", 3))


def test_a_scheduler_passed_to_initialize_wins_over_the_config_one():
    """As DeepSpeed's ``_configure_lr_scheduler``: the client's scheduler is used, the config's
    section is not built (an unknown type there is not even looked at)."""
    for section in ({"type": "WarmupLR", "params": {}}, {"type": "NoSuchLR", "params": {}}):
        engine, _, _, sched = deepspeed.initialize(
            model=Net(), config=_config(section),
            lr_scheduler=lambda o: optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
        assert isinstance(sched, optim.lr_scheduler.StepLR)
        _train(engine, 2)
        assert engine.get_lr() == [0.025]


@pytest.mark.parametrize("section,match", [
    ({"type": "warmuplr"}, r"scheduler.type must be one of LRRangeTest, OneCycle, "
                           r"WarmupCosineLR, WarmupDecayLR, WarmupLR \(exact case\), got "
                           r"'warmuplr'.*lr_scheduler="),
    ({"type": "StepLR", "params": {"step_size": 2}}, r"must be one of .* got 'StepLR'"),
    ({"type": "WarmupLR", "params": {"warmup_steps": 5}},
     r"scheduler.params for WarmupLR has unknown key\(s\) \['warmup_steps'\]; expected some of "
     r"\['last_batch_iteration', 'warmup_max_lr', 'warmup_min_lr', 'warmup_num_steps', "
     r"'warmup_type'\]"),
    ({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}},
     r"scheduler.params for WarmupDecayLR must give \['total_num_steps'\], got "
     r"\['warmup_num_steps'\]"),
    ({"type": "OneCycle", "params": {"cycle_min_lr": 0.1}},
     r"OneCycle must give \['cycle_max_lr'\]"),
    ({"type": 3}, r"scheduler.type must be a string such as WarmupLR, got 3"),
])
def test_config_scheduler_errors(section, match):
    with pytest.raises(DeepSpeedConfigError, match=match):
        deepspeed.initialize(model=Net(), config=_config(section))


# -- 2 ranks: the tutorial's config, checkpoints --------------------------------------------------
class _Scheduled:
    """An optimizer that steps its scheduler after each step (for the one-process reference)."""

    def __init__(self, opt, sched):
        self.opt, self.sched = opt, sched

    def step(self):
        self.opt.step()
        self.sched.step()

    def clear_grad(self):
        self.opt.clear_grad()


def _tutorial_adam(params, scheduled=False):
    """The tutorial's optimizer (DeepSpeed's Adam: decoupled decay), with its WarmupLR."""
    opt = optim.AdamW(params, lr=0.001, betas=(0.8, 0.999), eps=1e-8, weight_decay=3e-7)
    if not scheduled:
        return opt
    return _Scheduled(opt, WarmupLR(opt, warmup_min_lr=0, warmup_max_lr=0.001,
                                    warmup_num_steps=1000))


def _lr_and_scheduler(engine):
    return engine.get_lr(), type(engine.lr_scheduler).__name__, engine.global_steps


def test_cifar_tutorial_ds_config_with_warmup_lr_on_two_ranks(tmp_path):
    """The tutorial's ds_config.json, unchanged, from ``--deepspeed_config``: train_batch_size 4
    on 2 ranks (micro-batches of 2), Adam (decoupled decay) under WarmupLR. After k steps the rate
    is 0.001 * log(k) / log(1000), and the parameters equal one process applying it."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(CIFAR_DS_CONFIG, indent=2))
    out = run_workers(cifar_tutorial, 2, ["--deepspeed", "--deepspeed_config", str(path)], None,
                      1, _lr_and_scheduler, timeout=120)
    steps = 10  # 40 samples, 2 ranks, micro-batches of 2
    want = reference(2, 2, 1, 1, lambda p: _tutorial_adam(p, scheduled=True))
    unscheduled = reference(2, 2, 1, 1, _tutorial_adam)
    for rank_out in out:
        lr, kind, global_steps = rank_out["check"]
        assert kind == "WarmupLR" and global_steps == steps
        _check(lr, [0.001 * math.log(steps) / math.log(1000)])
        for k in want:
            np.testing.assert_allclose(rank_out["params"][k], want[k], rtol=0, atol=1e-10)
    assert max(abs(want[k] - unscheduled[k]).max() for k in want) > 1e-4  # the schedule mattered


def _checkpoint_round_trip(tmp_dir, config):
    def check(engine):
        sched = engine.lr_scheduler
        saved_position, saved_lr = sched.last_batch_iteration, engine.get_lr()
        engine.save_checkpoint(tmp_dir, tag="t")
        _train(engine, 3)
        moved = sched.last_batch_iteration
        path, _ = engine.load_checkpoint(tmp_dir, "t")
        back = (sched.last_batch_iteration, engine.get_lr())
        _train(engine, 1)
        after_one = engine.get_lr()
        # a fresh engine resumes there too; load_lr_scheduler_states=False leaves it at -1
        fresh, _, _, fresh_sched = deepspeed.initialize(model=Net(), config=config)
        fresh.load_checkpoint(tmp_dir)
        other, _, _, other_sched = deepspeed.initialize(model=Net(), config=config)
        other.load_checkpoint(tmp_dir, load_lr_scheduler_states=False)
        return (saved_position, saved_lr, moved, back, after_one,
                fresh_sched.last_batch_iteration, other_sched.last_batch_iteration)
    return check


def test_checkpoint_round_trip_keeps_the_scheduler_position(tmp_path):
    config = {"train_batch_size": 4, "steps_per_print": 1000,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "scheduler": {"type": "WarmupDecayLR", "params": {
                  "total_num_steps": 40, "warmup_max_lr": 0.01, "warmup_num_steps": 8}}}
    check = _checkpoint_round_trip(str(tmp_path), config)
    out = run_workers(cifar_tutorial, 2, [], config, 1, check, timeout=120)
    lr = [warmup_decay_lr(0, 0.01, 8, 40, "log", k) for k in range(20)]
    for rank_out in out:
        saved_position, saved_lr, moved, back, after_one, fresh, other = rank_out["check"]
        assert saved_position == 9 and moved == 12  # 10 tutorial steps, then 3 more
        _check(saved_lr, [lr[10]])
        assert back == (9, saved_lr)  # the position and the optimizer's rate come back
        _check(after_one, [lr[11]])
        assert fresh == 9 and other == -1


def test_the_pipeline_engine_steps_the_config_scheduler():
    """A PipelineModule's engine builds the config's scheduler too, one step per train_batch."""
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "steps_per_print": 1000,
              "scheduler": {"type": "WarmupLR", "params": {
                  "warmup_min_lr": 0.01, "warmup_max_lr": 0.05, "warmup_num_steps": 6}}}
    out = run_workers(pipeline_tutorial, 2, [], config, 4, 2, timeout=120)
    for rank_out in out:
        _check(rank_out["lr"], [warmup_lr(0.01, 0.05, 6, "log", 4)])


def test_a_checkpoint_without_a_scheduler_leaves_the_scheduler_where_it_is(tmp_path):
    """One process: a checkpoint saved by an engine without a scheduler (as before schedulers were
    saved) loads into one with a scheduler; the scheduler keeps its position."""
    plain, _, _, _ = deepspeed.initialize(model=Net(), config={
        "train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    _train(plain, 2)
    plain.save_checkpoint(str(tmp_path), tag="plain")
    engine, _, _, sched = deepspeed.initialize(model=Net(), config=_config(
        {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}))
    _train(engine, 3)
    path, _ = engine.load_checkpoint(str(tmp_path), "plain")
    assert path is not None and engine.global_steps == 2 and sched.last_batch_iteration == 2
