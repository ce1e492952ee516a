"""Compile CUDA C++ with NVRTC, the runtime compiler CuPy uses, on a machine without a GPU.

NVRTC needs neither a GPU nor a driver: ``libnvrtc`` from the ``nvidia-cuda-nvrtc`` wheel (in
the ``test`` extra) turns a source into PTX for any architecture, so CI can compile every CUDA
kernel minigrad ships. This module finds the library in the installed wheel (the ``nvidia``
namespace package: ``nvidia/cu13/lib`` for CUDA 13, ``nvidia/cuda_nvrtc/lib`` for CUDA 12),
loads it with ctypes and compiles one source at a time. Test-only: not part of the wheel.

(Imported by name; pytest puts the test file's folder on ``sys.path``.)
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re

ARCH = "sm_90"
# What CuPy adds to every kernel it compiles (``assemble_cupy_compiler_options`` and
# ``_compile_with_cache_cuda`` in CuPy 13/14): C++17, and flush-to-zero of float32 denormals.
CUPY_OPTIONS = ("--std=c++17", "-ftz=true")


class CompileError(Exception):
    """NVRTC refused a source; the message is its log (the line and the error)."""


def library_path() -> str | None:
    """The path of ``libnvrtc.so.N`` in the installed ``nvidia-cuda-nvrtc`` wheel, the newest
    if several CUDA versions are installed; None without the wheel (or on a platform it has no
    shared library for)."""
    try:
        import nvidia
    except ImportError:
        return None
    found = []
    for root in getattr(nvidia, "__path__", ()):
        found += glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*"))
    if not found:
        return None
    return max(found, key=lambda p: int(re.search(r"\.so\.(\d+)", p).group(1)))


def skip_reason() -> str | None:
    """Why NVRTC cannot be used here (a sentence for ``pytest.skip``), or None when it can."""
    path = library_path()
    if path is None:
        return ("NVRTC not installed: `pip install nvidia-cuda-nvrtc` (in the test extra; "
                "Linux wheels only)")
    try:
        _library()
    except OSError as exc:
        return f"NVRTC at {path} does not load: {exc}"
    return None


@functools.cache
def _library() -> ctypes.CDLL:
    path = library_path()
    if path is None:
        raise OSError("libnvrtc not found: pip install nvidia-cuda-nvrtc")
    lib = ctypes.CDLL(path)
    program = ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int)] * 2,
        "nvrtcCreateProgram": [program, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_void_p],
        "nvrtcCompileProgram": [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        "nvrtcGetProgramLogSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
        "nvrtcGetProgramLog": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
        "nvrtcGetPTX": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcDestroyProgram": [program],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version, e.g. ``(13, 5)``."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(result: int, call: str) -> None:
    if result != 0:
        message = _library().nvrtcGetErrorString(result).decode()
        raise RuntimeError(f"{call} failed: {message} ({result})")


def _text(lib, program, size_fn, text_fn) -> str:
    size = ctypes.c_size_t()
    _check(size_fn(program, ctypes.byref(size)), size_fn.__name__)
    buffer = ctypes.create_string_buffer(size.value)
    _check(text_fn(program, buffer), text_fn.__name__)
    return buffer.value.decode(errors="replace")


def compile_to_ptx(source: str, filename: str = "kernel.cu", arch: str = ARCH,
                   options: tuple[str, ...] = CUPY_OPTIONS) -> str:
    """Compile ``source`` for ``arch`` with ``options`` and return the PTX.

    Raises :class:`CompileError` with NVRTC's log (``filename(line): error: ...``) when the
    source does not compile; warnings alone do not fail."""
    lib = _library()
    program = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), filename.encode(), 0,
                                  None, None), "nvrtcCreateProgram")
    try:
        flags = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
        argv = (ctypes.c_char_p * len(flags))(*flags)
        result = lib.nvrtcCompileProgram(program, len(flags), argv)
        log = _text(lib, program, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog)
        if result != 0:
            raise CompileError(f"{filename} does not compile for {arch}:\n{log}")
        return _text(lib, program, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def ptx_entries(ptx: str) -> set[str]:
    """The kernel (``.entry``) names a PTX text defines."""
    return set(re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)", ptx))
