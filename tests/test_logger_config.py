"""``mg.get_logger`` / ``mg.logger`` and ``mg.config``: MegEngine's logging helpers and global
switches, as MegEngine programs use them (issue 27)."""

import logging
import warnings

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
from minigrad.functional._util import compute_mode_inputs


def test_get_logger_writes_to_the_log_file_of_every_logger(tmp_path, capsys):
    before = mg.get_logger("zoo.before")
    path = tmp_path / "train.log"
    mg.logger.set_log_file(str(path))
    after = mg.get_logger("zoo.after")
    assert mg.get_logger("zoo.after") is after and len(after.handlers) == 2  # configured once
    before.info("epoch %d", 1)
    after.info("epoch %d", 2)
    text = path.read_text()
    assert "zoo.before INFO: epoch 1" in text and "zoo.after INFO: epoch 2" in text
    assert "epoch 1" in capsys.readouterr().err  # and still on stderr
    assert not before.propagate  # not printed twice by a root logger the program configures


def test_set_log_level_updates_existing_loggers_unless_told_not_to(capsys):
    log = mg.get_logger("zoo.level")
    try:
        mg.logger.set_log_level("WARNING")
        log.info("hidden")
        log.warning("shown")
        err = capsys.readouterr().err
        assert "hidden" not in err and "shown" in err
        mg.logger.set_log_level(logging.DEBUG, update_existing=False)
        assert log.level == logging.WARNING  # the existing logger kept its level
        assert mg.get_logger("zoo.level.new").level == logging.DEBUG  # new ones get the new one
        with pytest.raises(ValueError, match="level must be a number or one of DEBUG"):
            mg.logger.set_log_level("LOUD")
    finally:
        mg.logger.set_log_level("INFO")


def test_config_compute_mode_is_the_default_of_matmul_and_conv():
    """``"float32"`` computes float16 products in float32 (NumPy's CPU matmul already
    accumulates float16 in float32, so the inputs the kernel is given are what differs)."""
    a = mg.tensor(np.full((2, 3), 0.1, np.float16))
    (same,), cast_back = compute_mode_inputs("matmul", "default", a)
    assert same is a and cast_back is None
    with mg.config._override(compute_mode="float32"):
        assert mg.config.compute_mode == "float32"
        (up,), cast_back = compute_mode_inputs("matmul", "default", a)
        assert up.dtype == np.float32 and cast_back == np.float16
        out = F.matmul(a, F.transpose(a, (1, 0)))
        assert out.dtype == np.float16
        np.testing.assert_allclose(out.numpy(), np.float16(0.1) ** 2 * 3, rtol=1e-3)
    assert mg.config.compute_mode == "default"  # restored after the block
    with pytest.raises(ValueError, match="compute_mode must be 'default' or 'float32'"):
        mg.config.compute_mode = "float8"


def test_config_knobs_are_kept_checked_and_noted_once():
    with mg.config._override(async_level=0, deterministic_kernel=True):
        assert mg.config.async_level == 0 and mg.config.deterministic_kernel is True
    assert mg.config.async_level == 2 and mg.config.deterministic_kernel is False
    with pytest.raises(ValueError, match="async_level must be 0, 1 or 2, got 5"):
        mg.config.async_level = 5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mg.config._override(benchmark_kernel=True):
            assert mg.config.benchmark_kernel is True
        with mg.config._override(benchmark_kernel=True):
            pass
    notes = [w for w in caught if "benchmark_kernel" in str(w.message)]
    assert len(notes) == 1 and "no effect" in str(notes[0].message)
    with pytest.raises(AttributeError, match="the knobs are"):
        mg.config.no_such_knob  # noqa: B018
