"""examples/pipeline_lm.py, run in reduced form, with assertions on what it produced."""

import json
import os

import numpy as np
import pytest
from example_programs import load_example

from minigrad.distributed.pipeline import load_layer_states


def test_block_parameter_count_matches_a_built_block():
    ex = load_example("pipeline_lm")
    assert ex.Block.parameter_count(16, 2, 0.0) == sum(p.size for p in ex.Block(16, 2, 0.0)
                                                       .parameters())


@pytest.mark.parametrize("argv", [
    ["--stages", "2", "--dp", "2", "--schedule", "interleaved", "--micro-batches", "2"],
    ["--stages", "2", "--schedule", "zb-h1", "--checkpoint-interval", "1"],
])
def test_pipeline_lm_trains_and_writes_its_outputs(tmp_path, monkeypatch, capsys, argv):
    ex = load_example("pipeline_lm")
    monkeypatch.chdir(tmp_path)
    small = ["--steps", "6", "--layers", "2", "--d-model", "16", "--heads", "2", "--seq-len",
             "8", "--batch-size", "4", "--lr", "1e-2", "--timeline", "tl.png"]
    out = ex.main(argv + small)
    run = tmp_path / "runs" / "pipeline_lm"
    assert f"writing outputs to {os.path.join('runs', 'pipeline_lm')}{os.sep}" in \
        capsys.readouterr().out
    losses = out["losses"]
    assert all(r["losses"] == losses for r in out["ranks"])  # the same float on every rank
    assert losses[-1] < losses[0] and np.isfinite(out["val_loss"])
    assert json.loads((run / "metrics.json").read_text())["losses"] == losses
    assert (run / "tl.png").stat().st_size > 1000
    # the checkpoint loads into one process: every layer but the tied head (saved as layer 0)
    state = load_layer_states(str(run / "checkpoint"))
    assert {k.split(".")[0] for k in state} == {"0", "1", "2", "3", "4"}
    assert state["0.weight"].shape == (ex.VOCAB, 16)
    assert state["1.weight"].shape == (8, 16)  # the positions
