"""examples/tensor_parallel_lm.py, reduced: it trains, its loss falls, its checkpoint samples."""

import importlib.util
from pathlib import Path

import numpy as np

import minigrad as mg

ROOT = Path(__file__).resolve().parents[3]


def _example():
    spec = importlib.util.spec_from_file_location(
        "tensor_parallel_lm", ROOT / "examples" / "tensor_parallel_lm.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tensor_parallel_lm_example(tmp_path):
    argv = ["--tp", "2", "--mode", "1d", "--dp", "2"]  # the other modes: test_tp_modes
    out = tmp_path / "run"
    small = ["--steps", "12", "--batch", "4", "--seq", "8", "--dim", "16", "--heads", "2",
             "--layers", "1", "--lr", "1e-2", "--out", str(out)]
    result = _example().main(argv + small)
    losses = result["losses"]
    assert len(losses) == 12 and result["tensor_group_agrees"]
    assert np.mean(losses[-3:]) < losses[0] - 0.5  # from ~ln(128) = 4.85 down
    assert (out / "loss.csv").read_text().splitlines()[0] == "step,loss"
    state = mg.load(str(out / "checkpoint.mgz"))
    assert state["head.weight"].shape == (128, 16)  # full tensors, single-device layout
    assert len(result["sample"]) == len("import minigrad") + 300
