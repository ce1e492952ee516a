"""``benchmarks/bench_gpu.py`` compares minigrad with PyTorch at the same float32 precision: TF32
is off in PyTorch (matmul and cuDNN) and ``CUPY_TF32`` is gone before CuPy is imported, while the
steps are measured, and the output says so. Checked with stand-ins for CuPy and PyTorch (the real
run needs a GPU: ``tests/distributed/gpu_check.sh``)."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def _load_bench():
    sys.path.insert(0, str(BENCH.parent))  # it imports its sibling ``machine``
    try:
        spec = importlib.util.spec_from_file_location("bench_gpu_under_test", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def _fake_torch():
    """PyTorch's defaults where they matter here: TF32 allowed for cuDNN (and for matmul on
    builds before 1.12)."""
    torch = types.SimpleNamespace(__version__="fake", precision=[])
    torch.backends = types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
        cudnn=types.SimpleNamespace(allow_tf32=True))
    torch.set_float32_matmul_precision = torch.precision.append
    torch.cuda = types.SimpleNamespace(
        get_device_properties=lambda i: types.SimpleNamespace(name="fake GPU"))
    return torch


def test_tf32_is_off_on_both_sides_while_measuring(monkeypatch, tmp_path, capsys):
    bench = _load_bench()
    torch, seen = _fake_torch(), {}
    monkeypatch.setenv("CUPY_TF32", "1")
    monkeypatch.delitem(sys.modules, "cupy", raising=False)  # (a test run on the fake CuPy)

    def gpu_or_exit():
        seen["CUPY_TF32 when CuPy is imported"] = os.environ.get("CUPY_TF32")
        return types.SimpleNamespace(__version__="fake"), torch

    def bench_models(which, torch, cp, rounds, steps):
        seen["torch flags while measuring"] = (torch.backends.cuda.matmul.allow_tf32,
                                               torch.backends.cudnn.allow_tf32, torch.precision)
        return {}

    monkeypatch.setattr(bench, "_gpu_or_exit", gpu_or_exit)
    monkeypatch.setattr(bench, "bench_models", bench_models)
    monkeypatch.setattr(bench, "cpu_name", lambda: "fake CPU")
    bench.main(["--only", "mlp", "--rounds", "1", "--steps", "1",
                "--out", str(tmp_path / "gpu.json")])
    assert seen == {"CUPY_TF32 when CuPy is imported": None,
                    "torch flags while measuring": (False, False, ["highest"])}
    assert "TF32: off on both sides" in capsys.readouterr().out
    assert '"tf32": false' in (tmp_path / "gpu.json").read_text()
