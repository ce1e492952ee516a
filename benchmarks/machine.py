"""The machine a benchmark ran on, described the same way by every script in ``benchmarks/``:
results are only comparable on the same CPU, so each table names it."""

from __future__ import annotations

import os
import platform

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
