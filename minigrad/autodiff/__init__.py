"""Automatic differentiation: ``Function`` (the op API), the backward engine, ``GradManager`` and
``checkpoint``.

Module order (imports go one way): ``recording`` (which GradManagers record now) -> ``tensor``
(array + device + grad + graph node) -> ``function`` -> ``engine`` -> ``grad_manager`` -> ``eager``
(``loss.backward()`` outside GradManagers) -> ``checkpointing`` (which also restores the backend's
random generators).
"""

from minigrad.autodiff import eager  # noqa: F401  (binds loss.backward() outside GradManagers)
from minigrad.autodiff.checkpointing import checkpoint
from minigrad.autodiff.function import Function
from minigrad.autodiff.grad_manager import (
    GradHookHandle,
    GradManager,
    GradManagerGroup,
    WeightGradHandle,
    get_backwarding_grad_manager,
    register_grad_hook,
)
from minigrad.autodiff.recording import enable_grad, is_recording, no_grad

__all__ = [
    "Function",
    "GradHookHandle",
    "GradManager",
    "GradManagerGroup",
    "WeightGradHandle",
    "checkpoint",
    "enable_grad",
    "get_backwarding_grad_manager",
    "is_recording",
    "no_grad",
    "register_grad_hook",
]
