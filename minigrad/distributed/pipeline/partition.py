"""Cutting a sequence of layers into contiguous pipeline parts: pure arithmetic on layer weights.

A partition of ``L`` layers into ``P`` parts is given by its *bounds* ``[b0, b1, ..., bP]`` with
``b0 = 0``, ``bP = L``: part ``p`` holds layers ``b[p] <= i < b[p + 1]``. Every part gets at
least one layer.

* :func:`partition_uniform` — equal layer counts; the first ``L mod P`` parts take one extra
  (10 layers, 4 parts → ``[0, 3, 6, 8, 10]``).
* :func:`partition_balanced` — given a weight per layer (its parameter count, or 1/0 for layers
  of a chosen type), the contiguous partition whose heaviest part is as light as possible. The
  optimum is found exactly: binary search on the bottleneck ``B`` (a greedy left-to-right fill
  tells whether parts of weight at most ``B`` suffice), then the greedy fill at the optimal ``B``
  fixes the bounds — each part takes as many layers as fit, leaving one for every later part.
  Among optimal partitions this is the one that fills early parts first.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["check_bounds", "partition_balanced", "partition_uniform"]


def _check_counts(op: str, num_items: int, num_parts: int) -> None:
    if num_parts < 1:
        raise ValueError(f"{op}: the number of parts must be positive, got {num_parts}")
    if num_items < num_parts:
        raise ValueError(
            f"{op}: cannot cut {num_items} layers into {num_parts} non-empty parts; use at most "
            f"{num_items} parts (stages x chunks) or more layers"
        )


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Bounds of ``num_parts`` parts of (nearly) equal size; the first ``num_items % num_parts``
    parts are one larger. Example: ``partition_uniform(10, 4) == [0, 3, 6, 8, 10]``."""
    _check_counts("partition_uniform", num_items, num_parts)
    size, extra = divmod(num_items, num_parts)
    bounds = [0]
    for p in range(num_parts):
        bounds.append(bounds[-1] + size + (1 if p < extra else 0))
    return bounds


def _greedy_bounds(weights: Sequence[int], num_parts: int, cap: int) -> list[int] | None:
    """Fill parts left to right with as many layers as keep each part's weight <= ``cap``, always
    leaving one layer per remaining part; the bounds, or None when ``num_parts`` do not suffice."""
    n = len(weights)
    bounds = [0]
    start = 0
    for p in range(num_parts):
        remaining_parts = num_parts - p - 1
        end, total = start, 0
        while end < n - remaining_parts and total + weights[end] <= cap:
            total += weights[end]
            end += 1
        if end == start:         # even one layer exceeds the cap
            return None
        bounds.append(end)
        start = end
    return bounds if start == n else None


def partition_balanced(weights: Sequence[int], num_parts: int) -> list[int]:
    """Bounds of the contiguous partition of ``weights`` (non-negative integers) into
    ``num_parts`` non-empty parts that minimises the largest part's total weight.

    Example: ``partition_balanced([4, 1, 1, 1, 1, 4], 3) == [0, 1, 5, 6]`` (largest part 4).
    """
    _check_counts("partition_balanced", len(weights), num_parts)
    if any(w < 0 for w in weights):
        raise ValueError(f"partition_balanced: weights must be non-negative, got {list(weights)}")
    low, high = max(weights), sum(weights)
    while low < high:                         # the smallest feasible cap
        mid = (low + high) // 2
        if _greedy_bounds(weights, num_parts, mid) is None:
            low = mid + 1
        else:
            high = mid
    bounds = _greedy_bounds(weights, num_parts, low)
    assert bounds is not None  # the total weight is always a feasible cap
    return bounds


def check_bounds(bounds: Sequence[int], num_items: int, num_parts: int) -> list[int]:
    """Validate explicit bounds (``num_parts + 1`` strictly increasing integers from 0 to
    ``num_items``) and return them as a list."""
    bounds = list(bounds)
    ok = (
        len(bounds) == num_parts + 1
        and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        and bounds[0] == 0 and bounds[-1] == num_items
        and all(a < b for a, b in zip(bounds, bounds[1:]))
    )
    if not ok:
        raise ValueError(
            f"partition bounds {bounds} are invalid: expected {num_parts + 1} strictly increasing "
            f"integers from 0 to {num_items} (one non-empty part per stage and chunk)"
        )
    return bounds
