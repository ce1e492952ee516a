"""Automatic differentiation: ``Function`` (the op API), the backward engine and ``GradManager``."""

from minigrad.autodiff.function import Function
from minigrad.autodiff.grad_manager import (
    GradManager,
    get_backwarding_grad_manager,
    register_grad_hook,
)
from minigrad.autodiff.state import enable_grad, is_recording, no_grad

__all__ = [
    "Function",
    "GradManager",
    "enable_grad",
    "get_backwarding_grad_manager",
    "is_recording",
    "no_grad",
    "register_grad_hook",
]
