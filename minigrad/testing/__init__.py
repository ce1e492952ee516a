"""Test helpers: finite-difference gradient checks and a multi-process harness."""

from minigrad.testing.gradcheck import check_double_grad, check_grad, numeric_directional_derivative

__all__ = ["check_double_grad", "check_grad", "numeric_directional_derivative"]
