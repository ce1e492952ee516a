"""The PyTorch/OneFlow-style API on ``minigrad.distributed``: collectives in place on tensors and
arrays, sync and async, against NumPy; objects; messages; groups; helpers."""

from __future__ import annotations

import pytest
from collective_cases import check_rank, run_cases

from minigrad.testing.distributed import run_workers


@pytest.mark.parametrize("n", [2, 3])
def test_every_torch_style_collective_equals_numpy(n):
    res = run_workers(run_cases, n, timeout=120)
    assert all(check_rank(got, r, n) > 150 for r, got in enumerate(res))
