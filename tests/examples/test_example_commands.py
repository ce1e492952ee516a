"""Every program in examples/ run as a user runs it: ``python examples/X.py`` (or the launch CLI
its docstring names) in a fresh interpreter, with small settings, checking what it printed. A
program started with too few ranks stops with one line naming the command that runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANG = 600  # seconds: only bounds a hang
LAUNCH = ["-m", "minigrad.distributed.launch", "--nproc_per_node"]

# (example, arguments after `python`, a line every successful run prints)
COMMANDS = [
    ("amp_lenet_mnist", ["examples/amp_lenet_mnist.py", "--max-steps", "2", "--test-images",
                         "500", "--out-dir", "{tmp}"],
     r"bfloat16: mean test accuracy \d+\.\d+ %, [+-]\d"),
    ("train_mnist", ["examples/train_mnist.py", "--epochs", "1", "--nproc", "2", "--device",
                     "cpu", "--out-dir", "{tmp}"], r"test accuracy"),
    ("megengine_dp_mnist", ["examples/megengine_dp_mnist.py", "--max-steps", "3", "--save",
                            "{tmp}/ckpt.mgc"], r"test accuracy 0\.\d+"),
    ("megengine_pipeline_toy", ["examples/megengine_pipeline_toy.py", "--steps", "2"],
     r"loss: first \d"),
    ("pipeline_mlp", ["examples/pipeline_mlp.py", "--steps", "2", "--micro-batches", "2",
                      "--check"], r"max \|pipeline - single process\| over all weights: "),
    ("pipeline_lm", ["examples/pipeline_lm.py", "--steps", "2", "--layers", "2", "--log-every",
                     "1", "--out-dir", "{tmp}"], r"validation loss \d"),
    ("sequence_parallel_lm", ["examples/sequence_parallel_lm.py", "--sp", "2", "--steps", "2",
                              "--out-dir", "{tmp}"], r"loss: first \d"),
    ("tensor_parallel_lm", ["examples/tensor_parallel_lm.py", "--tp", "2", "--mode", "1d",
                            "--steps", "2", "--out", "{tmp}"], r"\[rank 0\] step +1  loss"),
    ("oneflow_ddp", [*LAUNCH, "2", "examples/oneflow_ddp.py"], r"\[rank 1\] rank 1: w = "),
    ("global_tensor_pipeline", [*LAUNCH, "2", "examples/global_tensor_pipeline.py"],
     r"\[rank 1\] Tensor\(2\.\d+, dtype=float32"),
    ("global_tensor_hybrid", [*LAUNCH, "4", "examples/global_tensor_hybrid.py", "--steps", "2"],
     r"\[rank 0\] loss: first "),
]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")  # CPU ranks anywhere
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    return subprocess.run([sys.executable, *args], cwd=tmp_path / "cwd", env=env,
                          capture_output=True, text=True, timeout=HANG)


@pytest.fixture
def workdir(tmp_path):
    """The examples run from a scratch folder (whatever they write by default lands there), with
    ``examples/`` reachable by the documented relative path."""
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def test_every_example_has_a_command_here():
    names = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))
    assert names == sorted(name for name, _, _ in COMMANDS)


@pytest.mark.parametrize("name,args,expect", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_example_runs_with_its_documented_command(name, args, expect, workdir):
    proc = _run(args, workdir)
    assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    assert re.search(expect, proc.stdout), f"{name} printed:\n{proc.stdout[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("name,ranks", [("global_tensor_pipeline", 2),
                                        ("global_tensor_hybrid", 4)])
def test_example_started_without_its_ranks_names_the_command(name, ranks, workdir):
    proc = _run([f"examples/{name}.py"], workdir)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"examples/{name}.py needs {ranks} ranks{' (a 2 x 2 mesh)' if ranks == 4 else ''}; run: "
        f"python -m minigrad.distributed.launch --nproc_per_node {ranks} examples/{name}.py"
    ]
