"""numba, imported on first use, and the decorators every CPU kernel is compiled with.

Importing numba and initialising its compiler take about half a second, more than the rest of
minigrad together, so nothing here runs at ``import minigrad``: ``minigrad.backend.kernels``
imports the CPU kernels (and with them this module and numba) when the first kernel is called.

Compiled machine code is cached on disk (``cache=True``): next to the sources in
``__pycache__`` when that folder is writable (a source checkout or editable install), otherwise in
numba's user-wide cache (``~/.cache/numba``, or ``$NUMBA_CACHE_DIR``), which is what happens in a
read-only site-packages. Where no cache folder is writable at all numba refuses ``cache=True``;
the kernels are then compiled in memory in every process, after a one-time warning. A kernel
compiles (or loads from the cache) on its first call with each argument type, so a process only
pays for the kernels and dtypes it uses.

Flags:

* ``error_model="numpy"``: division by zero gives inf/NaN as in NumPy instead of raising, which
  also removes the per-division checks that would stop loops from vectorising;
* no ``fastmath`` in element-wise code: results keep IEEE semantics (NaN, inf, signed zeros);
* :func:`math_kernel` (the kernels that evaluate ``exp`` and normal-CDF polynomials: GELU, the
  softmax family, attention weights) adds only ``contract``: a multiply and the add after it may
  become one fused multiply-add, rounded once. That changes no special value and makes each step
  of a polynomial at least as accurate, and one instruction does the work of two in loops that
  are bound by their instruction count (float32 GELU over 512K values, with the formula of that
  time: 530 -> 340 us on the reference AMD EPYC); the float32 ``exp``'s range reduction stays
  exact with a fused multiply-add;
* :func:`scalar` helpers are inlined into their callers (and so compiled with the caller's
  flags, which are strict: no reduction calls them);
* :func:`reduction` helpers (sums) get ``fastmath={"reassoc", "nsz", "contract"}`` so that LLVM
  may spread one running sum over the SIMD lanes: the same freedom NumPy takes with its pairwise
  sums, and the only way such a loop vectorises. NaN and inf keep their meaning.

Tuning: on x86-64 the kernels use the host's instruction set (AVX-512 where it has it) but
LLVM's tuning for :data:`TUNING_CPU` (``x86-64-v3``: the Haswell cost model and scheduling),
whatever the host is. numba's default, tuning for the host's own model, made the same loops up
to 4.8x slower on an Intel Xeon (Emerald Rapids): ``max_pool2d`` at LeNet's shape took 365 us
tuned for that CPU and 76-86 us tuned for Haswell, GELU over 512K values 672 vs 529 us, and
LeNet's training step took 0.88x PyTorch's time with Haswell's tuning where the runs around it
with the host's took 1.05-1.25x; on an AMD EPYC (Zen 5) both
tunings give the same times. So the code no longer depends on which vendor's tuning LLVM picks.
It is numba's ``NUMBA_CPU_NAME``, set here before numba loads unless the user set it (their
value wins, and ``generic`` gives the most portable code); being an environment variable it
also reaches the rank processes and any other numba code in the process, which then compiles
with the same tuning.
"""

from __future__ import annotations

import os
import platform
import warnings

#: The CPU model whose tuning LLVM uses for the kernels on x86-64 (the instructions stay the
#: host's: numba passes the host's features), see the module docstring.
TUNING_CPU = "x86-64-v3"
_X86_64 = ("x86_64", "amd64")

if platform.machine().lower() in _X86_64:
    os.environ.setdefault("NUMBA_CPU_NAME", TUNING_CPU)

import numba  # noqa: E402  (after the tuning above, which numba reads when it loads)

_STRICT = {"error_model": "numpy", "nogil": True}
_MATH = {**_STRICT, "fastmath": {"contract"}}
_SUM = {**_STRICT, "fastmath": {"reassoc", "nsz", "contract"}}
_cache_warned = False


def _compile(fn, options: dict):
    global _cache_warned
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError as exc:  # "cannot cache function ...: no locator available"
        if not _cache_warned:
            _cache_warned = True
            warnings.warn(
                f"minigrad kernels: numba cannot cache compiled code ({exc}); compiling in "
                "memory instead (set NUMBA_CACHE_DIR to a writable folder to keep it)",
                RuntimeWarning,
                stacklevel=3,
            )
        return numba.njit(cache=False, **options)(fn)


def kernel(fn):
    """Compile ``fn`` as a strict (IEEE, NumPy error model) CPU kernel, cached on disk."""
    return _compile(fn, _STRICT)


def math_kernel(fn):
    """Compile ``fn`` as :func:`kernel` does, letting multiply-adds fuse (see the module
    docstring): for kernels whose loops evaluate polynomials."""
    return _compile(fn, _MATH)


def scalar(fn):
    """Compile a scalar helper (``exp``, the normal CDF) that is inlined into every kernel calling
    it, so that the kernel's loop still vectorises (a call per element would stop it)."""
    return _compile(fn, {**_STRICT, "inline": "always"})


def reduction(fn):
    """Compile a sum helper with the reassociation flags above; kernels call it as a function (it
    is not inlined), so the flags stay its own."""
    return _compile(fn, _SUM)
