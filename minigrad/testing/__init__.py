"""Test helpers: finite-difference gradient checks, a multi-process harness, and
``compare_layouts`` (a user model's parallel layouts against one device, tensor by tensor)."""

from minigrad.testing.compare_layouts import compare_layouts
from minigrad.testing.gradcheck import check_double_grad, check_grad, numeric_directional_derivative

__all__ = ["check_double_grad", "check_grad", "compare_layouts", "numeric_directional_derivative"]
