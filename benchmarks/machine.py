"""The machine a benchmark ran on, described the same way by every script in ``benchmarks/``:
results are only comparable on the same CPU, so each table names it."""

from __future__ import annotations

import os
import platform

KERNELS_ENV = "OPENBLAS_CORETYPE"  # names the kernels OpenBLAS runs, overriding its own choice
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")


def cpu_info() -> dict:
    """CPU model, the SIMD flags that matter for BLAS and the cores this process may use."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "simd": [f for f in SIMD_FLAGS if f in flags],
            "cores": len(os.sched_getaffinity(0))}


def cpu_name() -> str:
    """One line for a table's caption, e.g. ``AMD EPYC (avx2, avx512f), 2 cores``."""
    info = cpu_info()
    simd = f" ({', '.join(info['simd'])})" if info["simd"] else ""
    return f"{info['model']}{simd}, {info['cores']} cores"


def blas_info() -> dict:
    """NumPy's BLAS as this process loaded it: library, version, the kernels it runs and what
    chose them.

    OpenBLAS picks its kernels for the CPU when it loads (it names them after a CPU: ``Haswell``
    is AVX2, ``SkylakeX`` and ``Cooperlake`` are AVX-512) unless ``OPENBLAS_CORETYPE`` names
    others. An environment that sets ``Haswell`` on an AVX-512 CPU runs every product on AVX2
    kernels (on the AMD EPYC of issue 29, 1.5-1.8x slower on the MLP's and the Transformer
    block's products), so each table says which kernels ran.
    """
    import numpy  # noqa: F401, PLC0415 - loads the BLAS
    import threadpoolctl  # noqa: PLC0415

    pools = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
    pools.sort(key=lambda p: "numpy" not in p.get("filepath", ""))  # NumPy's own first
    if not pools:
        return {"library": "unknown", "version": None, "kernels": None, "forced_by": None}
    pool = pools[0]
    forced = os.environ.get(KERNELS_ENV) if pool["internal_api"] == "openblas" else None
    return {"library": pool["internal_api"], "version": pool.get("version"),
            "kernels": pool.get("architecture"),
            "forced_by": f"{KERNELS_ENV}={forced}" if forced else None}


def env_with_cpu_kernels() -> dict | None:
    """This process's environment without ``OPENBLAS_CORETYPE``, for a run in which OpenBLAS
    chooses its kernels for the CPU; None when the environment does not set it (nothing to
    compare)."""
    if KERNELS_ENV not in os.environ:
        return None
    return {k: v for k, v in os.environ.items() if k != KERNELS_ENV}


def blas_name(info: dict | None = None) -> str:
    """One line for a caption, e.g. ``openblas 0.3.31, Haswell kernels (set by
    OPENBLAS_CORETYPE=Haswell)``."""
    info = blas_info() if info is None else info
    text = f"{info['library']} {info['version'] or ''}".rstrip()
    if info["kernels"]:
        text += f", {info['kernels']} kernels"
        text += f" (set by {info['forced_by']})" if info["forced_by"] else " (chosen for this CPU)"
    return text
