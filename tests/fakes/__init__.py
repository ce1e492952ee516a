"""Test doubles that stand in for what the tests cannot have here (a CUDA GPU: :mod:`fake_cupy`).
They live with the tests, not in the ``minigrad`` package, and reach minigrad only through its
public hooks (``minigrad.backend.xp.use_cupy``, ``minigrad.backend.kernels.register_kernels``)."""
