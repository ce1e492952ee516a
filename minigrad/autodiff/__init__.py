"""Automatic differentiation: ``Function`` (the op API), the backward engine, ``GradManager`` and
``checkpoint``.

Module order (imports go one way): ``state`` (recording state, imports nothing) ->
``minigrad.tensor`` -> ``function`` -> ``engine`` -> ``grad_manager``; ``checkpointing`` also uses
``minigrad.random`` (which imports only backend and tensor).
"""

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
from minigrad.recording import enable_grad, is_recording, no_grad

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
