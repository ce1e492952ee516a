"""examples/tensor_parallel_lm.py, reduced: it trains, its loss falls, its checkpoint samples."""


import numpy as np
from example_programs import load_example

import minigrad as mg


def test_tensor_parallel_lm_example(tmp_path):
    argv = ["--tp", "2", "--mode", "1d", "--dp", "2"]  # the other modes: test_tp_modes
    out = tmp_path / "run"
    small = ["--steps", "12", "--batch", "4", "--seq", "8", "--dim", "16", "--heads", "2",
             "--layers", "1", "--lr", "1e-2", "--out", str(out)]
    result = load_example("tensor_parallel_lm").main(argv + small)
    losses = result["losses"]
    assert len(losses) == 12 and result["tensor_group_agrees"]
    assert np.mean(losses[-3:]) < losses[0] - 0.5  # from ~ln(128) = 4.85 down
    assert (out / "loss.csv").read_text().splitlines()[0] == "step,loss"
    state = mg.load(str(out / "checkpoint.mgz"))
    assert state["head.weight"].shape == (128, 16)  # full tensors, single-device layout
    assert len(result["sample"]) == len("import minigrad") + 300
