"""The GPU check script (``gpu_check.py``) without a GPU: it says "no GPU" and exits 2, refuses an
output folder inside the repository, runs every step with its own timeout and goes on after a
failure, its host-CPU benchmark step runs the right benchmarks with the right BLAS settings, and
its synchronisation counter finds the waits of a simulated GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_check  # noqa: E402


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "gpu_check.py"), "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu_check: no GPU: " in proc.stderr and "nothing was run" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_steps_run_with_their_own_timeouts_and_a_summary(monkeypatch, tmp_path, capsys):
    py = sys.executable
    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "plan", lambda out: [
        ("fails", [py, "-c", "raise SystemExit('broken here')"], 30),
        ("hangs", [py, "-c", "import time; time.sleep(60)"], 1),
        ("passes", [py, "-c", "print('all good')"], 30),
        ("late", [py, "-c", "print('never')"], 30),
    ])
    t0 = time.monotonic()
    assert gpu_check.main(["--out", str(tmp_path), "--budget", "12"]) == 1
    assert time.monotonic() - t0 < 30
    summary = capsys.readouterr().out.split("== summary")[1]
    rows = {line.split()[0]: line for line in summary.splitlines()[1:] if line.strip()}
    assert "FAIL (exit 1)" in rows["fails"] and "broken here" in rows["fails"]
    assert "TIMEOUT (1 s)" in rows["hangs"]
    assert "PASS" in rows["passes"] and "all good" in rows["passes"]
    assert (tmp_path / "passes.log").read_text().strip() == "all good"
    monkeypatch.setattr(gpu_check, "plan", lambda out: [("late", [py, "-c", "pass"], 30)])
    assert gpu_check.main(["--out", str(tmp_path), "--budget", "5"]) == 1  # under 10 s left
    assert "SKIPPED (out of time)" in capsys.readouterr().out


def test_output_inside_the_repository_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    assert gpu_check.main(["--out", os.path.join(gpu_check.ROOT, "runs")]) == 2
    assert "inside the repository" in capsys.readouterr().err


_FAKE_BENCH = """
import json, os, sys
with open(os.path.join(os.path.dirname(__file__), "..", "calls.jsonl"), "a") as fh:
    fh.write(json.dumps({"script": os.path.basename(__file__), "argv": sys.argv[1:],
                         "coretype": os.environ.get("OPENBLAS_CORETYPE"),
                         "blas": os.environ.get("MINIGRAD_BLAS"),
                         "mkl": os.environ.get("MINIGRAD_MKL_LIBRARY"),
                         "cores": len(os.sched_getaffinity(0))}) + "\\n")
"""


def _run_cpu_bench(tmp_path, env):
    """Run the step's script in a folder whose benchmarks only log how they were called."""
    (tmp_path / "benchmarks").mkdir()
    for name in ("bench_training.py", "bench_blas.py", "bench_collectives.py",
                 "bench_dp_scaling.py"):
        (tmp_path / "benchmarks" / name).write_text(_FAKE_BENCH)
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-c", gpu_check.CPU_BENCH, str(out)], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=60)
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return out, [json.loads(line) for line in lines]


def test_the_cpu_step_also_measures_the_cpus_own_blas_kernels_and_mkl(tmp_path):
    """With OPENBLAS_CORETYPE set and an MKL at hand: NumPy's products as set, minigrad's through
    MKL, OpenBLAS's own kernels, the products alone, then the collectives and data parallelism."""
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", MINIGRAD_MKL_LIBRARY="/x/libmkl_rt.so")
    out, calls = _run_cpu_bench(tmp_path, env)
    assert [(c["script"], c["coretype"], c["blas"], c["argv"][-1]) for c in calls] == [
        ("bench_training.py", "Haswell", "numpy", str(out / "training_cpu.json")),
        ("bench_training.py", "Haswell", "mkl", str(out / "training_cpu_mkl.json")),
        ("bench_training.py", None, "numpy", str(out / "training_cpu_kernels.json")),
        ("bench_blas.py", "Haswell", "numpy", str(out / "blas_cpu.json")),
        ("bench_collectives.py", "Haswell", "numpy", str(out / "collectives_cpu.json")),
        ("bench_dp_scaling.py", "Haswell", "numpy", str(out / "dp_scaling_cpu.json")),
    ]
    assert calls[1]["mkl"] == "/x/libmkl_rt.so"
    assert all(c["cores"] <= 2 for c in calls)
    assert all("--threads" in c["argv"] for c in calls[:4])  # the others take the cores given


def test_the_cpu_step_runs_each_benchmark_once_when_openblas_chooses_and_no_mkl(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["MINIGRAD_MKL_LIBRARY"] = ""  # none
    _, calls = _run_cpu_bench(tmp_path, env)
    assert [(c["script"], c["coretype"], c["blas"]) for c in calls] == [
        ("bench_training.py", None, "numpy"), ("bench_blas.py", None, "numpy"),
        ("bench_collectives.py", None, "numpy"), ("bench_dp_scaling.py", None, "numpy")]


def test_the_mkl_step_runs_the_op_tests_through_mkl_or_says_there_is_none(tmp_path):
    """The MKL tests step: the product op tests with MINIGRAD_TEST_BLAS=mkl on the MKL found
    (here a stand-in pytest that logs its environment), or a failure that says no MKL is here."""
    (tmp_path / "pytest").mkdir()
    (tmp_path / "pytest" / "__init__.py").write_text("")  # first on the path: found before pytest
    (tmp_path / "pytest" / "__main__.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps([os.environ.get(k) for k in ('MINIGRAD_TEST_BLAS', "
        "'MINIGRAD_MKL_LIBRARY')] + sys.argv[1:]))\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MINIGRAD_MKL_LIBRARY="/x/libmkl_rt.so")
    run = subprocess.run([sys.executable, "-c", gpu_check.MKL_TESTS], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    blas, library, *argv = json.loads(run.stdout)
    assert run.returncode == 0 and (blas, library) == ("mkl", "/x/libmkl_rt.so")
    assert {"tests/backend/test_blas.py", "tests/distributed/test_deterministic_dp.py"} <= set(argv)
    env["MINIGRAD_MKL_LIBRARY"] = ""
    run = subprocess.run([sys.executable, "-c", gpu_check.MKL_TESTS], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "no MKL here" in run.stderr
    names = [name for name, _, _ in gpu_check.plan(str(tmp_path))]
    assert names.index("mkl_tests") == names.index("cpu_bench_2_cores") - 1


class _SimulatedGpu:
    """Just enough of CuPy for ``SyncDetector``: one queue, kernels of ``cycles`` at 1e9 per
    second, events that are done when the queue reaches them; ``wait()`` is a host
    synchronisation (it blocks until the queue is empty), ``launch()`` queues work without
    waiting."""

    def __init__(self):
        self.busy_until = 0.0
        gpu = self

        def kernel(grid, block, args):
            gpu.launch(int(args[0]) / 1e9)

        class Device:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def synchronize(self):
                gpu.wait()

        class Event:
            def record(self, stream=None):
                self.at = gpu.busy_until

            @property
            def done(self):
                return time.perf_counter() >= self.at

        self.RawKernel = lambda source, name: kernel
        self.cuda = types.SimpleNamespace(Device=Device, Event=Event,
                                          Stream=types.SimpleNamespace(null=Device()))

    def launch(self, seconds):
        self.busy_until = max(self.busy_until, time.perf_counter()) + seconds

    def wait(self):
        time.sleep(max(0.0, self.busy_until - time.perf_counter()))


def test_the_sync_detector_tells_waiting_code_from_code_that_only_queues_work():
    gpu = _SimulatedGpu()
    detector = gpu_check.SyncDetector(gpu, spin_s=0.5)

    def queues_only():
        for _ in range(200):
            gpu.launch(1e-4)
            sum(range(100))  # host work that does not wait

    def waits_once():
        queues_only()
        gpu.wait()
        sum(range(1000))

    assert detector.waits(queues_only) is None
    where = detector.waits(waits_once)
    assert where is not None and where.endswith("(wait)"), where  # the line that blocked
    assert detector.waits(lambda: None) is None
