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
* :func:`partition_layers` — a pipeline model's layers by a ``partition_method``: ``"uniform"``,
  ``"parameters"`` (weights: each layer's parameter count, see :mod:`.specs`), ``"type:REGEX"``
  (weights: 1 for layers whose class name matches) or explicit bounds.
"""

from __future__ import annotations

import re
from typing import Sequence

from minigrad.distributed.pipeline.specs import layer_name, layer_parameter_count

__all__ = ["check_bounds", "partition_balanced", "partition_layers", "partition_uniform"]


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
        return partition_uniform(len(specs), num_parts)
    if method == "parameters":
        counts = [layer_parameter_count(s) for s in specs]
        unknown = [i for i, c in enumerate(counts) if c is None]
        if unknown:
            i = unknown[0]
            raise ValueError(
                f"PipelineModule: partition_method='parameters' needs the parameter count of "
                f"layer {i} ({specs[i]!r}) without building it (a LayerSpec is built only on the "
                f"stage that owns it): give {specs[i].typename.__name__} a classmethod "
                f"parameter_count(*args, **kwargs), or use partition_method='uniform', "
                f"'type:REGEX' or explicit bounds"
            )
        return partition_balanced(counts, num_parts)
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
        return partition_balanced(weights, num_parts)
    raise ValueError(
        f"PipelineModule: unknown partition_method {method!r}; expected 'parameters', "
        f"'uniform', 'type:REGEX' or a list of bounds"
    )
