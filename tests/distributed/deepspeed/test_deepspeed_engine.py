"""DeepSpeed's getting-started (CIFAR-10) tutorial on 2 CPU ranks: the parameters it trains equal a
float64 single-process reference written with GradManager and an optimizer (1e-10), with
gradient accumulation, every ZeRO stage, gradient clipping and a checkpoint round trip."""

import json

import numpy as np
import pytest
from ds_programs import Net, ToySet, cifar_tutorial, reference

import minigrad.distributed.deepspeed as deepspeed
import minigrad.optimizer as optim
from minigrad.autodiff.tensor import Tensor
from minigrad.testing.distributed import run_workers

WORLD, MICRO, ACCUM, EPOCHS = 2, 4, 2, 2


def _config(stage=0, optimizer=None, **extra):
    return {"train_batch_size": MICRO * ACCUM * WORLD, "train_micro_batch_size_per_gpu": MICRO,
            "optimizer": optimizer or {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}},
            "zero_optimization": {"stage": stage}, "steps_per_print": 1000, **extra}


def _assert_close(got: dict, want: dict):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-10, err_msg=k)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_cifar_tutorial_equals_one_process_at_every_zero_stage(stage):
    adam = {"type": "Adam", "params": {"lr": 0.05, "betas": [0.8, 0.99], "eps": 1e-8,
                                       "weight_decay": 0.01}}
    out = run_workers(cifar_tutorial, WORLD, [], _config(stage, adam), EPOCHS, timeout=120)
    # DeepSpeed's "Adam" decouples the weight decay (adam_w_mode defaults to true)
    want = reference(WORLD, MICRO, ACCUM, EPOCHS, lambda p: optim.AdamW(
        p, lr=0.05, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01))
    # 5 batches per rank and epoch: 10 micro-steps, 5 optimizer steps (one across the epochs)
    for rank_out in out:
        assert rank_out["micro_steps"] == 10 and rank_out["steps"] == 5
        _assert_close(rank_out["params"], want)


def test_accumulation_steps_the_optimizer_only_at_the_boundary():
    """With 4 accumulation steps the optimizer steps every 4th micro-step; the gradient is the
    mean over ranks and micro-steps (the reference at ACCUM=4, not 2)."""
    config = _config(gradient_accumulation_steps=4)
    config["train_batch_size"] = MICRO * 4 * WORLD

    def boundaries(engine):
        return engine.gradient_accumulation_steps(), engine.train_micro_batch_size_per_gpu()

    out = run_workers(cifar_tutorial, WORLD, [], config, EPOCHS, boundaries, timeout=120)
    want = reference(WORLD, MICRO, 4, EPOCHS, lambda p: optim.SGD(p, lr=0.1, momentum=0.9))
    wrong = reference(WORLD, MICRO, 2, EPOCHS, lambda p: optim.SGD(p, lr=0.1, momentum=0.9))
    for rank_out in out:
        assert rank_out["check"] == (4, MICRO)
        assert rank_out["steps"] == 2  # 10 micro-steps // 4; the last 2 left accumulating
        _assert_close(rank_out["params"], want)
    assert max(abs(want[k] - wrong[k]).max() for k in want) > 1e-3


def test_config_file_from_args_and_gradient_clipping(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(_config(gradient_clipping=0.05)))
    out = run_workers(cifar_tutorial, WORLD, ["--deepspeed", "--deepspeed_config", str(path)],
                      None, EPOCHS, timeout=120)
    want = reference(WORLD, MICRO, ACCUM, EPOCHS,
                     lambda p: optim.SGD(p, lr=0.1, momentum=0.9), clip=0.05)
    unclipped = reference(WORLD, MICRO, ACCUM, EPOCHS,
                          lambda p: optim.SGD(p, lr=0.1, momentum=0.9))
    for rank_out in out:
        _assert_close(rank_out["params"], want)
    assert max(abs(want[k] - unclipped[k]).max() for k in want) > 1e-3  # the clip mattered


def _save_then_resume(tmp_dir):
    """Train, save with client state, train more, load: the saved parameters and client state
    come back."""
    def check(engine):
        saved = {k: np.asarray(v).copy() for k, v in engine.module.state_dict().items()}
        engine.save_checkpoint(tmp_dir, tag="t1", client_state={"epoch": 3})
        steps = engine.global_steps
        for _ in range(2):  # move away from the saved point
            loss = engine(Tensor(engine.training_dataloader.dataset.x[:4])).sum()
            engine.backward(loss)
            engine.step()
        moved = any(abs(np.asarray(v) - saved[k]).max() > 0
                    for k, v in engine.module.state_dict().items())
        path, client = engine.load_checkpoint(tmp_dir, "t1")
        back = all(np.array_equal(np.asarray(v), saved[k])
                   for k, v in engine.module.state_dict().items())
        return moved, back, client, engine.global_steps == steps, path is not None
    return check


def test_save_and_load_checkpoint(tmp_path):
    out = run_workers(cifar_tutorial, WORLD, [], _config(), 1, _save_then_resume(str(tmp_path)),
                      timeout=120)
    for rank_out in out:
        moved, back, client, steps_back, found = rank_out["check"]
        assert moved and back and steps_back and found
        assert client == {"epoch": 3}
    assert (tmp_path / "latest").read_text().strip() == "t1"


def test_two_forwards_feed_one_backward_and_eval_records_nothing():
    """One process: ``engine(a) + engine(b)`` back-propagates through both forwards (the
    gradient of SGD's step is checked against NumPy); in eval mode nothing is recorded."""
    data = ToySet()
    engine, _, _, _ = deepspeed.initialize(model=Net(), config={
        "train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.5}}})
    b0 = np.asarray(engine.module.fc2.b).copy()
    engine.backward(engine(Tensor(data.x[:2])).sum() + engine(Tensor(data.x[2:5])).sum())
    engine.step()
    # d(sum of outputs)/d(fc2.b) = the number of rows, 5, for every output unit
    np.testing.assert_allclose(np.asarray(engine.module.fc2.b), b0 - 0.5 * 5, atol=1e-12)
    engine.eval()
    engine(Tensor(data.x[:2]))
    with pytest.raises(RuntimeError, match="no forward was recorded"):
        engine.backward(engine(Tensor(data.x[:2])).sum())
