"""``estimate_zero_memory``: bytes of model state per rank for data parallelism and ZeRO 1–3.

What each stage keeps on a rank of ``n`` (``P`` = parameter bytes, ``k`` = optimizer-state arrays
per parameter element: 2 for Adam/AdamW/LAMB/Adadelta, 1 for SGD with momentum and Adagrad):

======= ====================== ============= ===================================================
stage   parameters (at rest)   gradients     optimizer state
======= ====================== ============= ===================================================
0 (DDP) P                      P             k P
1       P                      P             k P / n   (``ZeroRedundancyOptimizer``)
2       P / n                  P / n         k P / n   (``fully_shard(reshard_after_forward=
                                                       False)``: the whole model is gathered
                                                       from forward until backward ends)
3       P / n                  P / n         k P / n   (``fully_shard``: one wrapped module's
                                                       parameters gathered at a time)
======= ====================== ============= ===================================================

Shards are padded to a multiple of ``n`` per layout, so a rank may hold up to ``n - 1`` elements
more per wrapped module; the estimate leaves that out (it is below 1% for real models). The
working set (parameters gathered during forward/backward) is reported separately: all of ``P``
for stages 0–2, the largest wrapped module's parameters for stage 3 (by default the largest
direct sub-module). Activations depend on the batch and the model's code and are not included.
"""

from __future__ import annotations

from minigrad.module.module import Module

#: optimizer-state arrays of the parameter's size that each optimizer keeps per parameter
STATE_ARRAYS = {
    "adam": 2, "adamw": 2, "lamb": 2, "adadelta": 2, "adagrad": 1, "sgd": 1, "sgd_momentum": 1,
    "sgd_plain": 0,
}


def _param_bytes(module: Module) -> int:
    return int(sum(p.size * p.dtype.itemsize for p in module.parameters()))


def estimate_zero_memory(model: Module, stage: int, world_size: int, optimizer: str = "adam",
                         largest_module_bytes: int | None = None, verbose: bool = True) -> dict:
    """Bytes per rank of parameters, gradients and optimizer state for ZeRO ``stage`` (0 = plain
    data parallelism) on ``world_size`` ranks, for ``model`` before it is sharded; prints them
    (``verbose``) and returns ``{"params", "grads", "optimizer_state", "total",
    "working_set"}``. ``optimizer``: a name of :data:`STATE_ARRAYS` ("sgd" means with momentum).
    ``largest_module_bytes``: the parameter bytes of the largest wrapped module (stage 3's
    working set; default: the largest direct sub-module of ``model``). Activations are left out.

    Example::

        dist.estimate_zero_memory(net, stage=3, world_size=8)
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"estimate_zero_memory: stage must be 0, 1, 2 or 3, got {stage!r}")
    if world_size < 1:
        raise ValueError(f"estimate_zero_memory: world_size must be >= 1, got {world_size}")
    name = str(optimizer).lower()
    if name not in STATE_ARRAYS:
        raise ValueError(
            f"estimate_zero_memory: unknown optimizer {optimizer!r}, expected one of "
            f"{sorted(STATE_ARRAYS)}"
        )
    p = _param_bytes(model)
    n, k = world_size, STATE_ARRAYS[name]
    params = p if stage < 2 else p / n
    grads = p if stage < 2 else p / n
    state = k * p if stage == 0 else k * p / n
    if stage < 3:
        working = p
    elif largest_module_bytes is not None:
        working = largest_module_bytes
    else:
        children = [_param_bytes(c) for c in model.children()]
        working = max(children) if children else p
    out = {"params": int(params), "grads": int(grads), "optimizer_state": int(state),
           "total": int(params + grads + state), "working_set": int(working)}
    if verbose:
        print(
            f"ZeRO stage {stage}, {n} rank(s), {name}: per rank params {out['params']:,} B, "
            f"grads {out['grads']:,} B, optimizer state {out['optimizer_state']:,} B, total "
            f"{out['total']:,} B; gathered working set {out['working_set']:,} B; activations "
            "not included"
        )
    return out
