"""DeepSpeed's pipeline tutorial on 2 CPU ranks: ``deepspeed.initialize(model=PipelineModule,
training_data=...)`` then ``engine.train_batch()`` with no argument; the trained layers equal a
float64 single-process reference (1e-10), as 2 stages and as 1 stage x 2 replicas."""

import numpy as np
import pytest
from ds_programs import N_HIDDEN, N_IN, Dense, pipeline_reference, pipeline_tutorial

import minigrad.distributed.deepspeed as deepspeed
import minigrad.optimizer as optim
from minigrad.distributed.deepspeed.utils import RepeatingLoader
from minigrad.distributed.pipeline import RepeatingLoader as PipelineRepeatingLoader
from minigrad.testing.distributed import run_workers

MICRO, ACCUM, STEPS = 4, 3, 4


@pytest.mark.parametrize("stages,replicas,zero", [(2, 1, 0), (1, 2, 0), (1, 2, 1)])
def test_pipeline_tutorial_equals_one_process(stages, replicas, zero):
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUM,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.1}},
              "zero_optimization": {"stage": zero}, "steps_per_print": 1000}
    out = run_workers(pipeline_tutorial, 2, [], config, STEPS, stages, timeout=120)
    layers, losses = pipeline_reference(replicas, MICRO, ACCUM, STEPS,
                                        lambda p: optim.AdamW(p, lr=0.02, weight_decay=0.1))
    for rank_out in out:
        assert rank_out["kind"] == "DeepSpeedPipelineEngine"
        assert (rank_out["optimizer"] == "ZeroRedundancyOptimizer") == (zero == 1)
        np.testing.assert_allclose(rank_out["losses"], losses, rtol=0, atol=1e-10)
        state = rank_out["state"]
        assert state  # every stage holds some layers
        for key, value in state.items():  # "<global layer index>.<name>"
            index, name = key.split(".", 1)
            want = np.asarray(getattr(layers[int(index)], name))
            np.testing.assert_allclose(value, want, rtol=0, atol=1e-10, err_msg=key)
    assert abs(np.asarray(layers[0].w) - np.asarray(Dense(N_IN, N_HIDDEN, 1).w)).max() > 1e-3
    if stages == 2:  # the two stages hold different layers, together all three
        keys = [set(k.split(".")[0] for k in r["state"]) for r in out]
        assert keys[0].isdisjoint(keys[1]) and keys[0] | keys[1] == {"0", "1", "2"}


def test_pipeline_engine_is_deepspeeds_names_and_refuses_zero_2():
    assert deepspeed.PipelineEngine is deepspeed.DeepSpeedPipelineEngine
    assert RepeatingLoader is PipelineRepeatingLoader
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    with pytest.raises(Exception, match="zero_stage=2 is not supported with pipeline"):
        run_workers(pipeline_tutorial, 2, [], config, 1, 2, timeout=60)


def _halving(optimizer):
    return optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_pipeline_fp16_scaler_and_scheduler_follow_the_config():
    """fp16 gives the pipeline engine DeepSpeed's scaler (2**4, doubling every 2 clean steps:
    64 after 4 steps on every stage); the scheduler steps after each train_batch."""
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "steps_per_print": 1000,
              "fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2}}
    out = run_workers(pipeline_tutorial, 2, [], config, 4, 2, _halving, timeout=120)
    for rank_out in out:
        assert rank_out["scale"] == 64
        assert rank_out["lr"] == [0.1 / 2 ** 4]
        assert np.isfinite(rank_out["losses"]).all()
