"""The ``fp16`` section drives minigrad's autocast and GradScaler with DeepSpeed's knobs:
``initial_scale_power``, ``loss_scale_window``, ``hysteresis``, ``min_loss_scale``, a static
``loss_scale``; ``bf16`` autocasts to bfloat16 without a scaler."""

import warnings

import numpy as np
import pytest
from ds_programs import N_IN, Net, ToySet

import minigrad.distributed.deepspeed as deepspeed
import minigrad.functional as F
import minigrad.module as M
from minigrad.amp import GradScaler
from minigrad.autodiff.tensor import Parameter, Tensor


def _engine(model=None, **precision):
    config = {"train_batch_size": 4, "steps_per_print": 1000,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, **precision}
    engine, _, _, _ = deepspeed.initialize(model=model or Net(), config=config)
    return engine


class Product(M.Module):
    """``x @ w``: its output has the dtype of the matrix product."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(np.ones((N_IN, 2), np.float32))

    def forward(self, x):
        return F.matmul(x, self.w)


def _step(engine, overflow: bool = False):
    data = ToySet()
    loss = M.CrossEntropyLoss()(engine(Tensor(data.x[:4])), Tensor(data.y[:4]))
    if overflow:
        loss = loss * float("inf")
    engine.backward(loss)
    engine.step()


def _params(engine):
    return {k: np.asarray(v).copy() for k, v in engine.module.state_dict().items()}


def test_dynamic_loss_scale_follows_deepspeeds_rules():
    engine = _engine(fp16={"enabled": True, "initial_scale_power": 5, "loss_scale_window": 2,
                           "hysteresis": 2, "min_loss_scale": 8})
    assert isinstance(engine.scaler, GradScaler) and engine.fp16_enabled()
    scales = [engine.cur_scale]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scaler's overflow reports
        for overflow in (False, False, True, True, True, True, True, False, False):
            before = _params(engine)
            _step(engine, overflow)
            moved = any(abs(v - before[k]).max() > 0 for k, v in _params(engine).items())
            assert moved != overflow  # an overflowing step is skipped
            scales.append(engine.cur_scale)
    # 2**5; doubles after 2 clean steps; the first overflow is absorbed (hysteresis 2), then
    # every overflow halves, down to min_loss_scale 8; 2 clean steps double it again
    assert scales == [32, 32, 64, 64, 32, 16, 8, 8, 8, 16]
    assert engine.skipped_steps == 5 and engine.global_steps == 9


def test_static_loss_scale_never_moves():
    engine = _engine(fp16={"enabled": True, "loss_scale": 128, "loss_scale_window": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for overflow in (False, False, True, False):
            _step(engine, overflow)
            assert engine.cur_scale == 128


def test_fp16_and_bf16_autocast_the_forward():
    x = Tensor(ToySet().x[:4].astype(np.float32))
    half = _engine(Product(), fp16={"enabled": True})
    assert half.cur_scale == 2.0 ** 16  # DeepSpeed's default initial_scale_power
    assert half(x).dtype.name == "float16"
    bf16 = _engine(Product(), bf16={"enabled": True})
    assert bf16.scaler is None and bf16.bfloat16_enabled()
    assert bf16(x).dtype.name == "bfloat16"
    plain = _engine(Product())
    assert plain.scaler is None and plain(x).dtype.name == "float32"
    for engine in (half, bf16, plain):  # drop the recordings no backward used
        engine.eval()


def test_fp16_and_bf16_together_is_an_error():
    with pytest.raises(deepspeed.DeepSpeedConfigError, match="fp16.enabled and bf16.enabled"):
        _engine(fp16={"enabled": True}, bf16={"enabled": True})
