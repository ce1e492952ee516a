"""``mg.config``: MegEngine's global switches (``mge.config.deterministic_kernel = True``).

MegEngine programs set these once at start-up. Here they are accepted with the same names and
values; what each means in minigrad:

* ``compute_mode`` (``"default"`` or ``"float32"``): the default of the ``compute_mode`` argument
  of ``F.matmul``, ``F.linear`` and the convolutions. ``"float32"`` computes float16 inputs in
  float32 and rounds the result back to float16, as MegEngine does.
* ``deterministic_kernel`` (bool): minigrad's kernels are always deterministic (the same inputs
  give the same bits, every run), so both values run the same code; the value is kept and read
  back.
* ``async_level`` (0, 1 or 2): minigrad runs every op synchronously, so an error is raised by the
  op that caused it, at every level (MegEngine's level 0); the value is checked and kept.
* ``benchmark_kernel``, ``benchmark_with_subprocess``, ``disable_memory_forwarding``,
  ``conv_format``, ``auto_format_convert``: MegEngine's kernel-selection and memory-layout tuning,
  which has no counterpart here. Setting one is accepted, kept and read back, and notes once
  (a ``UserWarning``) that it changes nothing.

``config._override(**knobs)`` sets knobs for the duration of a ``with`` block, as in MegEngine.

Example::

    import minigrad as mg
    mg.config.compute_mode = "float32"   # float16 matmuls accumulate in float32
    with mg.config._override(deterministic_kernel=True):
        ...
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from collections.abc import Iterator

__all__ = ["KNOBS", "NO_EFFECT", "default_compute_mode"]

#: knob -> its MegEngine default
KNOBS = {
    "compute_mode": "default",
    "deterministic_kernel": False,
    "async_level": 2,
    "benchmark_kernel": False,
    "benchmark_with_subprocess": False,
    "disable_memory_forwarding": False,
    "conv_format": "default",
    "auto_format_convert": False,
}
#: knobs that are accepted but change nothing here (a note says so, once per knob)
NO_EFFECT = ("benchmark_kernel", "benchmark_with_subprocess", "disable_memory_forwarding",
             "conv_format", "auto_format_convert")


def _check(name: str, value):
    """The value to store for knob ``name``, or an error naming the knob and the valid values."""
    if name == "compute_mode":
        mode = str(value).lower()
        if mode not in ("default", "float32"):
            raise ValueError(f"config.compute_mode must be 'default' or 'float32', got {value!r}")
        return mode
    if name == "async_level":
        if value not in (0, 1, 2) or isinstance(value, bool):
            raise ValueError(f"config.async_level must be 0, 1 or 2, got {value!r}")
        return int(value)
    if name == "conv_format":
        if not isinstance(value, str):
            raise TypeError(f"config.conv_format must be a str, got {type(value).__name__}")
        return value
    return bool(value)


class _ConfigModule(types.ModuleType):
    """This module's class: assigning a knob checks the value (and notes a knob without effect)."""

    def __setattr__(self, name: str, value) -> None:
        knob = name.lstrip("_")  # MegEngine also spells some with a leading underscore
        if knob in KNOBS:
            value = _check(knob, value)
            if knob in NO_EFFECT and knob not in _noted and value != KNOBS[knob]:
                _noted.add(knob)
                warnings.warn(f"mg.config.{knob} is accepted for MegEngine programs but has no "
                              "effect in minigrad (no kernel tuning or layout conversion here)",
                              UserWarning, stacklevel=2)
            _values[knob] = value
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str):
        knob = name.lstrip("_")
        if knob in KNOBS:
            return _values[knob]
        raise AttributeError(f"module 'minigrad.config' has no attribute {name!r}; the knobs are "
                             f"{', '.join(KNOBS)}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(KNOBS))


_values: dict = dict(KNOBS)
_noted: set[str] = set()


def default_compute_mode() -> str:
    """What ``compute_mode="default"`` means for matmul, linear and convolution right now."""
    return _values["compute_mode"]


@contextlib.contextmanager
def _override(**knobs) -> Iterator[None]:
    """Set ``knobs`` for the duration of the ``with`` block, then restore the previous values."""
    module = sys.modules[__name__]
    unknown = sorted(k for k in knobs if k.lstrip("_") not in KNOBS)
    if unknown:
        raise AttributeError(f"config._override: unknown knobs {unknown}; the knobs are "
                             f"{', '.join(KNOBS)}")
    saved = dict(_values)
    try:
        for name, value in knobs.items():
            setattr(module, name, value)
        yield
    finally:
        _values.clear()
        _values.update(saved)


sys.modules[__name__].__class__ = _ConfigModule
