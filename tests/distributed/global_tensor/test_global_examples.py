"""examples/global_tensor_hybrid.py: the 2 x 2 data x tensor parallel MLP trained 3 steps equals
one process (float64, 1e-10), and its command writes the folder it names."""

import json
import os

import numpy as np
from example_programs import load_example

import minigrad as mg
from minigrad.testing.distributed import run_workers

EX = load_example("global_tensor_hybrid")


def _train_on_mesh(steps):
    out = EX.train(steps, mg.placement("cpu", [[0, 1], [2, 3]]))
    return out["losses"], out["weights"]


def test_hybrid_mlp_on_a_2x2_mesh_equals_one_process():
    results = run_workers(_train_on_mesh, 4, 3, timeout=120)
    ref = EX.train(3)
    for losses, weights in results:
        np.testing.assert_allclose(losses, ref["losses"], rtol=1e-10)
        for name, w in ref["weights"].items():
            np.testing.assert_allclose(weights[name], w, rtol=1e-10, atol=1e-14, err_msg=name)
    assert ref["losses"][-1] < ref["losses"][0]


def _main():
    EX.main(["--steps", "2"])


def test_hybrid_command_writes_the_folder_it_names(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    run_workers(_main, 4, timeout=120)
    out = capfd.readouterr().out
    assert f"writing outputs to {os.path.join('runs', 'global_tensor_hybrid')}{os.sep}" in out
    folder = tmp_path / "runs" / "global_tensor_hybrid"
    assert sorted(p.name for p in folder.iterdir()) == ["losses.json", "mlp.mgc"]
    assert len(json.loads((folder / "losses.json").read_text())["losses"]) == 2
    saved = mg.load(str(folder / "mlp.mgc"))
    assert saved["fc1.weight"].shape == (EX.HIDDEN, EX.D_IN)  # logical, not a rank's piece
