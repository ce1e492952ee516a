"""examples/sequence_parallel_lm.py in reduced form: sequence 2 × data 2, float64, checked against
its one-process run, with the promised files in the folder it names."""

import json

import numpy as np
from example_programs import load_example

import minigrad as mg


def test_example_trains_like_one_process_and_writes_its_outputs(tmp_path, capsys):
    ex = load_example("sequence_parallel_lm")
    out = tmp_path / "run"
    res = ex.main(["--sp", "2", "--dp", "2", "--sp-impl", "ulysses", "--causal", "--zigzag",
                   "--steps", "3", "--seq-len", "16", "--dtype", "float64", "--check",
                   "--out-dir", str(out)])
    assert f"writing to {out.resolve()}" in capsys.readouterr().out
    assert res["max_diff"] < 1e-10
    np.testing.assert_allclose(res["losses"], res["reference"]["losses"], rtol=1e-10)
    assert (out / "losses.csv").read_text().splitlines()[0] == "step,loss"
    assert json.loads((out / "config.json").read_text())["sp_impl"] == "ulysses"
    state = mg.load(str(out / "model.mgc"))
    assert np.allclose(np.asarray(state["head.weight"]), res["params"][-2])
