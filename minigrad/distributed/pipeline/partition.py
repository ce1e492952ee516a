"""Cutting a sequence of layers into contiguous pipeline parts: pure arithmetic on layer weights.

A partition of ``L`` layers into ``P`` parts is given by its *bounds* ``[b0, b1, ..., bP]`` with
``b0 = 0``, ``bP = L``: part ``p`` holds layers ``b[p] <= i < b[p + 1]``.

A pipeline stage needs at least one layer, so the partitions of a :class:`PipelineModule` never
have empty parts:

* :func:`partition_uniform_nonempty` — equal layer counts; the first ``L mod P`` parts take one
  extra (10 layers, 4 parts → ``[0, 3, 6, 8, 10]``).
* :func:`partition_balanced_nonempty` — given a weight per layer (its parameter count, or 1/0 for
  layers of a chosen type), the contiguous partition whose heaviest part is as light as possible.
  The optimum is found exactly: binary search on the bottleneck ``B`` (a greedy left-to-right fill
  tells whether parts of weight at most ``B`` suffice), then the greedy fill at the optimal ``B``
  fixes the bounds — each part takes as many layers as fit, leaving one for every later part.
  Among optimal partitions this is the one that fills early parts first.
* :func:`partition_layers` — a pipeline model's layers by a ``partition_method``: ``"uniform"``,
  ``"parameters"`` (weights: each layer's parameter count, see :mod:`.specs`), ``"type:REGEX"``
  (weights: 1 for layers whose class name matches) or explicit bounds.

DeepSpeed's own functions, :func:`partition_uniform` and :func:`partition_balanced` (its
``deepspeed.runtime.utils``), give DeepSpeed's results, which may end in empty parts: fewer items
than parts leaves the last parts empty, and the balanced fill takes as many items as fit in each
part without keeping one back for later parts (``partition_balanced([1, 1, 1, 1], 3) ==
[0, 2, 4, 4]``). Whenever DeepSpeed's balanced result has no empty part it is the non-empty one
above, so a ``PipelineModule`` places layers as DeepSpeed does except where DeepSpeed would leave a
stage empty.
"""

from __future__ import annotations

import re
from typing import Sequence

from minigrad.distributed.pipeline.specs import layer_name, layer_parameter_count

__all__ = [
    "check_bounds",
    "partition_balanced",
    "partition_balanced_nonempty",
    "partition_layers",
    "partition_uniform",
    "partition_uniform_nonempty",
]


def _check_counts(op: str, num_items: int, num_parts: int) -> None:
    if num_parts < 1:
        raise ValueError(f"{op}: the number of parts must be positive, got {num_parts}")
    if num_items < num_parts:
        raise ValueError(
            f"{op}: cannot cut {num_items} layers into {num_parts} non-empty parts; use at most "
            f"{num_items} parts (stages x chunks) or more layers"
        )


def partition_uniform_nonempty(num_items: int, num_parts: int) -> list[int]:
    """Bounds of ``num_parts`` non-empty parts of (nearly) equal size; the first
    ``num_items % num_parts`` parts are one larger. Example:
    ``partition_uniform_nonempty(10, 4) == [0, 3, 6, 8, 10]``."""
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


def partition_balanced_nonempty(weights: Sequence[int], num_parts: int) -> list[int]:
    """Bounds of the contiguous partition of ``weights`` (non-negative integers) into
    ``num_parts`` non-empty parts that minimises the largest part's total weight.

    Example: ``partition_balanced_nonempty([4, 1, 1, 1, 1, 4], 3) == [0, 1, 5, 6]`` (largest
    part 4).
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


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: (nearly) equal parts, the first ``num_items %
    num_parts`` one larger; with fewer items than parts, one item per part and the last parts
    empty. Examples: ``partition_uniform(10, 4) == [0, 3, 6, 8, 10]``,
    ``partition_uniform(2, 4) == [0, 1, 2, 2, 2]``."""
    if num_parts < 1 or num_items < 0:
        raise ValueError(f"partition_uniform: expected num_items >= 0 and num_parts >= 1, got "
                         f"{num_items} and {num_parts}")
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    return partition_uniform_nonempty(num_items, num_parts)


def _fill(weights: Sequence[int], num_parts: int, cap: int) -> list[int] | None:
    """Each part, left to right, takes as many items as keep its weight <= ``cap`` (parts after
    the items run out are empty); the bounds, or None when ``num_parts`` parts do not suffice."""
    n, bounds, start = len(weights), [0], 0
    for _ in range(num_parts):
        end, total = start, 0
        while end < n and total + weights[end] <= cap:
            total += weights[end]
            end += 1
        bounds.append(end)
        start = end
    return bounds if start == n else None


def partition_balanced(weights: Sequence[int], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: the smallest bottleneck ``B`` for which filling parts
    left to right, each with as many items as keep its weight <= ``B``, places every item; the
    bounds of that fill, whose last parts may be empty. With no more items than parts it is
    :func:`partition_uniform`. Example: ``partition_balanced([1, 1, 1, 1], 3) == [0, 2, 4, 4]``.
    Weights are non-negative numbers (parameter counts; float weights search the sums of
    contiguous runs, the only values a bottleneck can take)."""
    if num_parts < 1:
        raise ValueError(f"partition_balanced: num_parts must be positive, got {num_parts}")
    if any(w < 0 for w in weights):
        raise ValueError(f"partition_balanced: weights must be non-negative, got {list(weights)}")
    if len(weights) <= num_parts:
        return partition_uniform(len(weights), num_parts)
    if all(float(w).is_integer() for w in weights):
        low, high = max(weights), sum(weights)
        while low < high:                     # the smallest cap whose fill places every item
            mid = (low + high) // 2
            if _fill(weights, num_parts, mid) is None:
                low = mid + 1
            else:
                high = mid
        return _fill(weights, num_parts, low)
    caps = sorted({sum(weights[a:b]) for a in range(len(weights))
                   for b in range(a + 1, len(weights) + 1)})
    low, high = 0, len(caps) - 1              # the whole sum (the last cap) always works
    while low < high:
        mid = (low + high) // 2
        if _fill(weights, num_parts, caps[mid]) is None:
            low = mid + 1
        else:
            high = mid
    return _fill(weights, num_parts, caps[low])


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


def partition_layers(specs: Sequence, num_parts: int, method) -> list[int]:
    """The bounds of ``num_parts`` parts of a pipeline model's layers ``specs`` by ``method``
    (see the module docstring); errors name the ``PipelineModule`` argument at fault."""
    if len(specs) < num_parts:
        raise ValueError(
            f"PipelineModule: {len(specs)} layers cannot fill {num_parts} pipeline parts "
            f"(stages x chunks); every part needs at least one layer"
        )
    if not isinstance(method, str):
        return check_bounds(method, len(specs), num_parts)
    if method == "uniform":
        return partition_uniform_nonempty(len(specs), num_parts)
    if method == "parameters":
        return partition_balanced_nonempty([layer_parameter_count(s) for s in specs], num_parts)
    if method.lower().startswith("type:"):
        pattern = method[len("type:"):]
        regex = re.compile(pattern, re.IGNORECASE)
        weights = [1 if regex.search(layer_name(s)) else 0 for s in specs]
        if not any(weights):
            names = sorted({layer_name(s) for s in specs})
            raise ValueError(
                f"PipelineModule: partition_method {method!r}: the regex {pattern!r} matches no "
                f"layer class (the layers are {names})"
            )
        return partition_balanced_nonempty(weights, num_parts)
    raise ValueError(
        f"PipelineModule: unknown partition_method {method!r}; expected 'parameters', "
        f"'uniform', 'type:REGEX' or a list of bounds"
    )
