"""Which BLAS multiplies minigrad's matrices fastest on this CPU (issue 29's "beat the floor").

Usage: python benchmarks/bench_blas.py [--rounds 15] [--steps 20] [--threads N] [--out PATH]

The products are those of one training step of each model of ``bench_training.py`` (same shapes
and layouts, from ``gemms.py``), in float32. The contenders, each in a worker process of its own
(a BLAS chooses its kernels when it loads, and two BLAS libraries in one process compete for the
cores with two thread pools):

* ``openblas``: NumPy's matmul on the OpenBLAS NumPy loaded, with the environment as it is;
* ``openblas-cpu-kernels``: the same with ``OPENBLAS_CORETYPE`` removed from the environment, so
  OpenBLAS runs the kernels it picks for this CPU (only when that variable is set: an environment
  that names ``Haswell`` on an AVX-512 CPU holds every product to AVX2 kernels);
* ``mkl``: Intel MKL's ``sgemm_`` and ``sgemm_batch_`` through ctypes (the thin binding the issue
  asks to measure): from the ``mkl`` wheel's ``libmkl_rt`` when it is installed, else from the MKL
  that PyTorch links into ``libtorch_cpu``, which exports the same Fortran symbols.

Every contender's products are first checked against float64 ones within float32's rounding bound
for a dot product of length k (``|error| <= k * eps * (|a| @ |b|)``). Then the contenders take
turns (who goes first rotates each round, with a 0.2 s pause before each so the last one's idle
threads stop spinning): each runs one model's products ``--steps`` times and reports its median.
The table gives, per model, each contender's median time and the median and p10 of its per-round
ratio to ``openblas``; below 0.9 is the 10 % win for which the issue would have minigrad pick a
library up automatically. Results go to ``benchmarks/results/blas.json``.
"""

from __future__ import annotations  # noqa: I001  (minigrad is imported before NumPy on purpose)

import argparse
import ctypes
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import minigrad as mg  # first: its BLAS waiting policy applies before NumPy loads OpenBLAS

import numpy as np

import gemms
from machine import blas_info, blas_name, cpu_info, cpu_name, env_with_cpu_kernels

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "blas.json")


# ---------------------------------------------------------------------------------------------
# the contenders (each runs in its own worker process)


def _operands(products: list) -> list:
    """``(a, b, transpose b, out)`` float32 arrays for each product."""
    return [(a, b, tb, np.empty(a.shape[:-1] + (b.shape[-2] if tb else b.shape[-1],), np.float32))
            for a, b, tb in gemms.operands(products)]


class NumpyProducts:
    """NumPy's matmul into preallocated outputs: whatever BLAS NumPy loaded."""

    def __init__(self, threads: int):
        mg.set_num_threads(threads)
        self.describe = {"library": blas_name(blas_info())}

    def prepare(self, cases: list):
        calls = [(a, np.swapaxes(b, -1, -2) if tb else b, out) for a, b, tb, out in cases]

        def run():
            for a, b, out in calls:
                np.matmul(a, b, out=out)
        return run


class MklProducts:
    """MKL's Fortran ``sgemm_`` (2-D) and ``sgemm_batch_`` (a stack as one group) on row-major
    arrays: ``C = A @ B`` is computed as the column-major ``C.T = B.T @ A.T``, so no data moves."""

    def __init__(self, threads: int):
        lib, source = self._load(threads)
        self.sgemm, self.sgemm_batch = lib.sgemm_, lib.sgemm_batch_
        self.sgemm.restype = self.sgemm_batch.restype = None
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        self.describe = {"library": buf.value.decode().strip(), "source": source}
        self._keep = []  # the ctypes arguments the prepared calls point into

    @staticmethod
    def _load(threads: int):
        wheel = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
        if wheel:
            lib = ctypes.CDLL(wheel[0])
            lib.MKL_Set_Num_Threads(threads)
            return lib, wheel[0]
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            raise RuntimeError("neither the mkl wheel nor PyTorch (whose MKL it can use) is "
                               "installed") from None
        torch.set_num_threads(threads)
        path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        lib = ctypes.CDLL(path)
        if not hasattr(lib, "sgemm_batch_"):
            raise RuntimeError(f"{path} exports no MKL (sgemm_batch_ not found)")
        return lib, path

    def _args(self, *values):
        """Fortran arguments by reference: chars as one-byte buffers, ints as MKL_INT (32-bit,
        the LP64 interface), floats, and pointers passed as they are."""
        out = []
        for v in values:
            if isinstance(v, bytes):
                v = ctypes.c_char(v)
            elif isinstance(v, int):
                v = ctypes.c_int32(v)
            elif isinstance(v, float):
                v = ctypes.c_float(v)
            else:
                out.append(v)
                continue
            self._keep.append(v)
            out.append(ctypes.byref(v))
        return out

    def _call(self, a, b, trans_b, out):
        """The prepared call ``out = a @ b`` (``b.T`` when ``trans_b``) for 2-D or stacked 3-D
        operands."""
        m, k = a.shape[-2:]
        n = out.shape[-1]
        transa, lda = (b"T", k) if trans_b else (b"N", n)
        if a.ndim == 2:
            args = self._args(transa, b"N", n, m, k, 1.0, b.ctypes.data_as(ctypes.c_void_p), lda,
                              a.ctypes.data_as(ctypes.c_void_p), k, 0.0,
                              out.ctypes.data_as(ctypes.c_void_p), n)
            return self.sgemm, args
        g = a.shape[0]
        pointers = [(ctypes.c_void_p * g)(*[x[i].ctypes.data for i in range(g)])
                    for x in (b, a, out)]
        self._keep += pointers
        group_size = (ctypes.c_int32 * 1)(g)
        self._keep.append(group_size)
        args = self._args(transa, b"N", n, m, k, 1.0)
        args += [pointers[0], *self._args(lda), pointers[1], *self._args(k, 0.0), pointers[2],
                 *self._args(n, 1), group_size]
        return self.sgemm_batch, args

    def prepare(self, cases: list):
        calls = [self._call(a, b, tb, out) for a, b, tb, out in cases]

        def run():
            for fn, args in calls:
                fn(*args)
        return run


CONTENDERS = {"openblas": NumpyProducts, "openblas-cpu-kernels": NumpyProducts,
              "mkl": MklProducts}


def check_products(run, cases: list) -> None:
    """Raise unless every output is within float32's rounding bound of the float64 product."""
    run()
    eps = float(np.finfo(np.float32).eps)
    for i, (a, b, tb, out) in enumerate(cases):
        b64 = np.swapaxes(b, -1, -2).astype(np.float64) if tb else b.astype(np.float64)
        exact = np.matmul(a.astype(np.float64), b64)
        bound = a.shape[-1] * eps * np.matmul(np.abs(a.astype(np.float64)), np.abs(b64))
        err = np.abs(out - exact)
        if not np.all(err <= bound + 1e-30):
            worst = np.unravel_index(np.argmax(err - bound), err.shape)
            raise AssertionError(f"product {i} ({a.shape} @ {b.shape}{'.T' if tb else ''}): "
                                 f"error {err[worst]:.3g} above the bound {bound[worst]:.3g}")


def worker(name: str, threads: int) -> None:
    """Serve one contender: announce it (JSON), then answer ``model steps`` with the median
    seconds of ``steps`` runs of that model's products, until ``quit``."""
    try:
        impl = CONTENDERS[name](threads)
        runs = {}
        for model in gemms.MODELS:
            cases = _operands(gemms.PRODUCTS[model]())
            runs[model] = impl.prepare(cases)
            check_products(runs[model], cases)
    except Exception as exc:  # noqa: BLE001 - told to the parent, which goes on without it
        print(json.dumps({"unavailable": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    print(json.dumps(impl.describe), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        model, steps = line.split()
        run = runs[model]
        run()  # wakes the threads
        times = []
        for _ in range(int(steps)):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        print(statistics.median(times), flush=True)


# ---------------------------------------------------------------------------------------------
# the parent: alternate the workers


def _start(name: str, threads: int):
    env = env_with_cpu_kernels() if name == "openblas-cpu-kernels" else None
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", name,
                             "--threads", str(threads)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    return proc, json.loads(proc.stdout.readline())


def _p10(values: list) -> float:
    return sorted(values)[int(0.1 * len(values))]


def measure(rounds: int, steps: int, threads: int) -> dict:
    names = ["openblas", "mkl"]
    if env_with_cpu_kernels() is not None:
        names.insert(1, "openblas-cpu-kernels")
    workers, about = {}, {}
    for name in names:
        proc, about[name] = _start(name, threads)
        if "unavailable" in about[name]:
            proc.wait()
            print(f"{name}: not measured: {about[name]['unavailable']}", flush=True)
        else:
            workers[name] = proc
    times = {n: {m: [] for m in gemms.MODELS} for n in workers}
    order = list(workers)
    for r in range(rounds):
        for model in gemms.MODELS:
            for k in range(len(order)):
                name = order[(r + k) % len(order)]
                time.sleep(0.2)
                workers[name].stdin.write(f"{model} {steps}\n")
                workers[name].stdin.flush()
                times[name][model].append(float(workers[name].stdout.readline()))
    for proc in workers.values():
        proc.stdin.write("quit\n")
        proc.stdin.close()
        proc.wait()
    results = {}
    for model in gemms.MODELS:
        base = times["openblas"][model]
        results[model] = {name: {
            "ms": statistics.median(ts[model]) * 1e3,
            "ratio_median": statistics.median([t / b for t, b in zip(ts[model], base)]),
            "ratio_p10": _p10([t / b for t, b in zip(ts[model], base)]),
        } for name, ts in times.items()}
    return {"contenders": about, "models": results}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=mg.get_num_threads())
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.threads)
        return
    meta = {"cpu": cpu_info(), "threads": args.threads, "rounds": args.rounds,
            "steps_per_round": args.steps, "numpy": np.__version__,
            "load_average_start": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"{cpu_name()}; {args.threads} threads; {args.rounds} rounds x {args.steps} runs of "
          f"each model's products; load average {meta['load_average_start']:.2f}", flush=True)
    result = measure(args.rounds, args.steps, args.threads)
    for name, about in result["contenders"].items():
        print(f"  {name}: {about.get('library', about.get('unavailable'))}"
              + (f" (from {about['source']})" if "source" in about else ""))
    print(f"{'products of':<14} {'contender':<22} {'ms':>8} {'vs openblas':>12} {'p10':>6}")
    for model, row in result["models"].items():
        for name, r in row.items():
            print(f"{model:<14} {name:<22} {r['ms']:>8.3f} {r['ratio_median']:>11.2f}x "
                  f"{r['ratio_p10']:>5.2f}x")
    meta["load_average_end"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, **result}, fh, indent=1)
    print(f"load average at the end: {meta['load_average_end']:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
