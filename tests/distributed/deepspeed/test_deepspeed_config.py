"""The DeepSpeed config: DeepSpeed's batch-size rule, where the config comes from, and the errors
(each names the key, what was expected and what was given)."""

import argparse
import importlib
import inspect
import json
import warnings

import pytest
from ds_programs import Net, ToySet

import minigrad.distributed.deepspeed as deepspeed
import minigrad.optimizer as optim
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed import LaunchError
from minigrad.distributed.deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from minigrad.testing.distributed import run_workers

SGD = {"type": "SGD", "params": {"lr": 0.1}}


@pytest.mark.parametrize("given,world,want", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (32, 4, 4)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2, (32, 8, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 2, (24, 4, 3)),
    ({"train_batch_size": 12}, 3, (12, 4, 1)),
    ({"train_micro_batch_size_per_gpu": 5}, 2, (10, 5, 1)),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4}, 2, (16, 2, 4)),
])
def test_the_missing_batch_size_is_derived(given, world, want):
    cfg = DeepSpeedConfig(given, world_size=world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
            cfg.gradient_accumulation_steps) == want


@pytest.mark.parametrize("given", [
    {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
     "gradient_accumulation_steps": 2},
    {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4},  # 30 // 8 = 3: 24 != 30
])
def test_inconsistent_batch_sizes_name_all_three_and_the_world_size(given):
    with pytest.raises(DeepSpeedConfigError) as err:
        DeepSpeedConfig(given, world_size=2)
    msg = str(err.value)
    for part in ("train_batch_size (30)", "train_micro_batch_size_per_gpu (4)",
                 "gradient_accumulation_steps (", "data-parallel world size (2)"):
        assert part in msg, msg


def _initialize_inconsistent():
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
              "gradient_accumulation_steps": 2, "optimizer": SGD}
    deepspeed.initialize(model=Net(), config=config)


def test_the_world_size_of_the_rule_is_the_jobs_on_every_rank():
    with pytest.raises(LaunchError, match=r"= 16") as err:  # 4 * 2 * 2 ranks
        run_workers(_initialize_inconsistent, 2, timeout=60)
    assert "data-parallel world size (2)" in str(err.value)


@pytest.mark.parametrize("config,match", [
    ({}, "either train_batch_size or train_micro_batch_size_per_gpu must be given"),
    ({"train_batch_size": "32"}, r"train_batch_size must be an int >= 1, got '32' \(str\)"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}},
     r"zero_optimization.stage must be 0, 1, 2 or 3, got 4 \(int\)"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 1,
                                                   "offload_optimizer": {"device": "cpu"}}},
     r"zero_optimization.offload_optimizer.device must be \"none\" .*got 'cpu'"),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "hysteresis": 0}},
     r"fp16.hysteresis must be an int >= 1, got 0 \(int\)"),
    ({"train_batch_size": 8, "fp16": {"enabled": "yes"}},
     r"fp16.enabled must be true or false, got 'yes' \(str\)"),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "scale": 2}},
     r"fp16 has unknown key\(s\) \['scale'\]; expected"),
    ({"train_batch_size": 8, "gradient_clipping": -1},
     r"gradient_clipping must be a number >= 0, got -1 \(int\)"),
    ({"train_batch_size": 8, "optimizer": {"params": {}}},
     r"optimizer.type must be a string such as Adam, got None"),
])
def test_bad_values_name_the_key_the_expected_and_the_actual(config, match):
    with pytest.raises(DeepSpeedConfigError, match=match):
        DeepSpeedConfig(config, world_size=1)


@pytest.mark.parametrize("section,match", [
    ({"type": "Lamb", "params": {"lr": 0.1}},
     r"optimizer.type must be one of Adam, AdamW, SGD \(any case\) in minigrad, got 'Lamb'"),
    ({"type": "Adam", "params": {"lr": 0.1, "momentum": 0.9}},
     r"optimizer.params for Adam has unknown key\(s\) \['momentum'\]; expected"),
    ({"type": "SGD", "params": {}}, "optimizer.params.lr is required for SGD, got nothing"),
])
def test_optimizer_errors(section, match):
    with pytest.raises(DeepSpeedConfigError, match=match):
        deepspeed.initialize(model=Net(), config={"train_batch_size": 4, "optimizer": section})


@pytest.mark.parametrize("kind,params,cls,weight_decay", [
    ("adam", {"lr": 0.1}, optim.AdamW, 0.0),  # DeepSpeed's Adam is AdamW by default
    ("Adam", {"lr": 0.1, "adam_w_mode": False, "weight_decay": 0.1}, optim.Adam, 0.1),
    ("ADAMW", {"lr": 0.1, "weight_decay": 0.2}, optim.AdamW, 0.2),
    ("sgd", {"lr": 0.1, "momentum": 0.5}, optim.SGD, 0.0),
])
def test_optimizer_types_are_case_insensitive(kind, params, cls, weight_decay):
    _, opt, _, _ = deepspeed.initialize(model=Net(), config={
        "train_batch_size": 4, "optimizer": {"type": kind, "params": params}})
    assert type(opt) is cls
    assert opt.param_groups[0]["lr"] == 0.1
    assert opt.param_groups[0]["weight_decay"] == weight_decay


def test_a_scheduler_passed_to_initialize_steps_with_the_optimizer():
    engine, opt, _, sched = deepspeed.initialize(
        model=Net(), config={"train_batch_size": 4, "optimizer": SGD},
        lr_scheduler=lambda o: optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    assert engine.get_lr() == [0.1]
    x = Tensor(ToySet().x[:4])
    for _ in range(2):
        engine.backward(engine(x).sum())
        engine.step()
    assert sched is engine.lr_scheduler and engine.get_lr() == [0.025]


def _args(argv):
    return deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(argv)


def test_add_config_arguments_adds_deepspeeds_flags():
    args = _args([])
    assert (args.deepspeed, args.deepspeed_config, args.deepscale, args.deepscale_config) == (
        False, None, False, None)
    args = _args(["--deepspeed", "--deepspeed_config", "c.json"])
    assert args.deepspeed and args.deepspeed_config == "c.json"


def test_where_the_config_comes_from(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 4, "optimizer": SGD}))
    with pytest.raises(DeepSpeedConfigError, match="deepspeed arguments .* and deepspeed"
                       r".initialize\(\) function call"):
        deepspeed.initialize(args=_args(["--deepspeed_config", str(path)]), model=Net(),
                             config={"train_batch_size": 4})
    with pytest.raises(DeepSpeedConfigError, match="requires --deepspeed_config"):
        deepspeed.initialize(args=_args([]), model=Net())
    with pytest.warns(DeprecationWarning, match="--deepscale_config is deprecated"):
        engine, _, _, _ = deepspeed.initialize(args=_args(["--deepscale_config", str(path)]),
                                               model=Net())
    assert engine.train_batch_size() == 4
    with pytest.raises(DeepSpeedConfigError, match="both a deepscale_config and deepspeed_"), \
            pytest.warns(DeprecationWarning):
        deepspeed.initialize(args=_args(["--deepscale_config", "a", "--deepspeed_config", "b"]),
                             model=Net())


def test_bad_json_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "train_batch_size": 4,\n  "optimizer": {"type": "SGD",,}\n}\n')
    with pytest.raises(DeepSpeedConfigError, match=rf"{path}: invalid JSON at line 3 column"):
        deepspeed.initialize(model=Net(), config=str(path))
    path.write_text('{"train_batch_size": 4, "train_batch_size": 8}')
    with pytest.raises(DeepSpeedConfigError, match="duplicate key 'train_batch_size'"):
        deepspeed.initialize(model=Net(), config=str(path))


def test_an_unknown_top_level_key_warns_once():
    config = {"train_batch_size": 4, "optimizer": SGD, "flops_profiler_xyz": {"enabled": False}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deepspeed.initialize(model=Net(), config=config)
        deepspeed.initialize(model=Net(), config=config)
    named = [w for w in caught if "'flops_profiler_xyz'" in str(w.message)]
    assert len(named) == 1 and "not used by minigrad" in str(named[0].message)


def test_zero_2_refuses_a_client_optimizer():
    with pytest.raises(LaunchError, match="zero_optimization.stage 2 shards every parameter"):
        run_workers(_zero2_with_client_optimizer, 2, timeout=60)


def _zero2_with_client_optimizer():
    net = Net()
    deepspeed.initialize(model=net, optimizer=optim.SGD(net.parameters(), lr=0.1),
                         config={"train_batch_size": 8, "zero_optimization": {"stage": 2}})


def test_every_public_name_is_documented():
    missing = []
    for name in ("", ".config", ".components", ".engine", ".pipe_engine", ".entry", ".pipe",
                 ".utils", ".runtime", ".runtime.lr_schedules"):
        module = importlib.import_module("minigrad.distributed.deepspeed" + name)
        assert inspect.getdoc(module), module.__name__
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            if not inspect.getdoc(obj):
                missing.append(f"{module.__name__}.{attr}")
            if inspect.isclass(obj) and obj.__module__.startswith("minigrad.distributed.deep"):
                missing += [f"{obj.__name__}.{m}" for m, member in vars(obj).items()
                            if not m.startswith("_") and callable(member)
                            and not inspect.getdoc(member)]
    assert not missing, missing
