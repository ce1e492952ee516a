"""Every example, run in reduced form, with assertions on what it produced."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from example_programs import load_example

import minigrad as mg

ROOT = Path(__file__).resolve().parents[2]


def test_train_mnist_trains_saves_and_resumes(tmp_path, monkeypatch, capsys):
    ex = load_example("train_mnist")
    monkeypatch.chdir(tmp_path)  # outputs go to ./runs/train_mnist/, never next to tracked files
    first = ex.main(["--epochs", "1", "--save", "mlp.mgc", "--nproc", "2", "--device", "cpu"])
    assert first["acc"] > 0.85  # one epoch of the MLP on the bundled 8k split
    ckpt = tmp_path / "runs" / "train_mnist" / "mlp.mgc"
    assert f"writing outputs to {os.path.join('runs', 'train_mnist')}{os.sep}" in (
        capsys.readouterr().out)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["mlp.mgc"]
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/train_mnist/checkpoint.mgc"],
                             cwd=ROOT, capture_output=True)
    assert ignored.returncode == 0, "the README quick start's output folder must be git-ignored"
    saved = mg.load(str(ckpt))
    assert saved["epoch"] == 0 and saved["model"] == "mlp"
    assert saved["acc"] == pytest.approx(first["acc"])
    resumed = ex.main(
        [
            "--epochs",
            "2",
            "--resume",
            "mlp.mgc",  # found in the run folder
            "--save",
            str(ckpt),
            "--nproc",
            "2",
            "--device",
            "cpu",
        ]
    )
    assert len(resumed["history"]) == 1  # only the second epoch ran
    assert mg.load(str(ckpt))["epoch"] == 1
    assert resumed["acc"] > 0.88


def test_train_mnist_resume_reads_the_model_kind_from_the_checkpoint(tmp_path):
    ex = load_example("train_mnist")
    cnn = ex.build_model("cnn")
    opt = ex.optim.Adam(cnn.parameters(), lr=1e-3)
    path = str(tmp_path / "cnn.mgc")
    mg.save({"net": cnn.state_dict(), "opt": opt.state_dict(), "epoch": 0, "acc": 0.5,
             "model": "cnn"}, path)
    # no --model: the CNN comes from the file (this used to fail with missing/unexpected keys)
    out = ex.main(["--resume", path, "--epochs", "1", "--save", "", "--nproc", "2",
                   "--device", "cpu"])
    assert out["model"] == "cnn" and out["history"] == []  # epoch 0 was done: nothing to run
    old = mg.load(path)
    del old["model"]  # a checkpoint written before the kind was saved: told by its names
    assert ex.checkpoint_model_kind(old, path) == "cnn"
    with pytest.raises(ex.dist.LaunchError, match="holds a cnn model but --model mlp was given"):
        ex.main(["--resume", path, "--model", "mlp", "--epochs", "1", "--save", "",
                 "--nproc", "2", "--device", "cpu"])


def test_megengine_dp_tutorial_matches_single_process(tmp_path):
    ex = load_example("megengine_dp_mnist")
    dp = ex.main(["--max-steps", "15", "--save", str(tmp_path / "dp.mgc")])
    single = ex.main(["--max-steps", "15", "--single", "--save", str(tmp_path / "single.mgc")])
    assert dp["losses"][-1] < dp["losses"][0]
    np.testing.assert_allclose(dp["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(dp["w"], single["w"], rtol=1e-4, atol=1e-6)
    ckpt = mg.load(str(tmp_path / "dp.mgc"))
    assert set(ckpt) == {"net", "acc"} and ckpt["acc"] == pytest.approx(dp["acc"])


def test_megengine_pipeline_toy_gradients_equal_single_process():
    ex = load_example("megengine_pipeline_toy")
    pipe = ex.main(["--steps", "12"])
    single = ex.main(["--steps", "12", "--single"])
    assert pipe["losses"][-1] < pipe["losses"][0]
    np.testing.assert_allclose(pipe["losses"], single["losses"], rtol=1e-6)
    for gp, gs in zip(pipe["grads"], single["grads"]):
        for a, b in zip(gp, gs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_pipeline_mlp_matches_single_process():
    ex = load_example("pipeline_mlp")
    out = ex.main(["--steps", "6", "--micro-batches", "4", "--check"])
    assert out["max_diff"] < 1e-5
    assert out["losses"][-1] < out["losses"][0]


def test_oneflow_ddp_via_launch_cli(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "minigrad.distributed.launch",
            "--nproc_per_node",
            "2",
            "--logdir",
            str(tmp_path),
            str(ROOT / "examples" / "oneflow_ddp.py"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),  # 2 CPU ranks also on a 1-GPU machine
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = proc.stdout + "".join(p.read_text() for p in tmp_path.glob("*"))
    ws = [np.array(m.split(), dtype=float) for m in re.findall(r"w = \[([^\]]*)\]", logs)]
    assert len(ws) == 2, logs
    for w in ws:
        np.testing.assert_allclose(w, [2.0, 3.0], atol=1e-3)
    np.testing.assert_array_equal(ws[0], ws[1])


def test_readme_commands_are_the_ones_ci_uses():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    install_and_train, install_and_test = commands
    assert "examples/train_mnist.py" in install_and_train
    assert "pytest" in install_and_test
    assert install_and_test in ci.splitlines(), (
        "the README's test command must be what .ci/run runs"
    )
    # ... in a virtual environment made fresh for the run, so nothing installed by hand counts
    assert re.search(r'^"\$\{PYTHON:-python3\}" -m venv "\$venv_root/venv"$', ci, re.M)
    assert 'export PATH="$venv_root/venv/bin:$PATH"' in ci


def test_readme_tour_runs_as_written():
    # the tour is code a newcomer copies: it must run, compute what it says, and train over 2 ranks
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## A 20-line tour.*?```python\n(.*?)```", readme, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README tour", "exec"), ns)  # noqa: S102
    x, w = ns["x"].numpy(), ns["w"]
    np.testing.assert_allclose(w.grad.numpy(), 0.5 * np.repeat(x.sum(0)[:, None], 2, 1),
                               rtol=1e-6)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 784)).astype("float32"),
                rng.integers(0, 10, 8).astype("int32")) for _ in range(2)]
    assert ns["train"](batches) == [None, None]  # both ranks ran the loop to the end


@pytest.mark.gpu
def test_train_mnist_on_the_gpu(tmp_path):
    # a fresh interpreter: its rank is forked before anything initialises CUDA (this process may
    # have, in its single-process GPU tests)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_mnist.py"), "--device", "gpu", "--nproc",
         "1", "--epochs", "1", "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    acc = float(re.search(r"epoch 1: test accuracy ([0-9.]+)", proc.stdout).group(1))
    assert acc > 0.85  # as on the CPU: one epoch of the MLP on the bundled split
