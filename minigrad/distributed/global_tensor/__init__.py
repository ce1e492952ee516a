"""Global tensors (OneFlow's global view): the cluster as one device.

A *placement* (``mg.placement("cpu", [0, 1])``, or a nested list for an N-d device mesh) says which
ranks hold a tensor; an *SBP* per mesh dimension says how: ``mg.sbp.split(dim)`` (blocks of axis
``dim``, balanced: 10 rows over 4 ranks are 3, 3, 2, 2), ``mg.sbp.broadcast`` (every rank holds
the whole value) or ``mg.sbp.partial_sum`` (the value is the sum of the ranks' tensors). A global
tensor's ``shape`` is the logical shape; ``to_local()`` is this rank's piece.

Example (two ranks)::

    P = mg.placement("cpu", [0, 1])
    x = mg.randn(4, 5, placement=P, sbp=mg.sbp.split(0))       # (2, 5) on each rank
    w = mg.randn(5, 3, placement=P, sbp=mg.sbp.broadcast)
    y = x @ w                                                   # sbp (split(dim=0),)
    y.to_global(sbp=mg.sbp.broadcast).to_local()                # the whole (4, 3) everywhere

Every functional op accepts global tensors: ``Function.__call__`` hands a call with a global input
to :func:`.tensor.dispatch`, which boxes (redistributes, :mod:`.boxing`) the inputs as the op's
rule asks and runs the op on the local pieces. Mismatched inputs are boxed automatically (``x``
split(0) + ``y`` split(1) works). Autodiff, ``GradManager`` and the optimizers work unchanged: a
global parameter's ``.grad`` is a global tensor with the parameter's placement and SBP. Every rank
must run the same global ops in the same order (ranks outside an op's placement skip its
computation); :mod:`.lockstep` turns a divergence into an error on every rank.

Output SBP of each op, per mesh dimension (inputs are first boxed to the SBPs on the left; ``B``
broadcast, ``P`` partial_sum, ``S(i)`` split(i))::

    op                                  inputs                          output
    ----------------------------------  ------------------------------  ----------------------
    elementwise (add, mul, div, relu,   one input S(i) on a full-size    S(i)
      exp, where, comparisons, astype,    axis: every full-size operand
      gelu, ...; broadcasting)            S(that axis), size-1 ones B
    add, sub                            a P operand, all tensors: all P  P  (B -> P is free)
    mul / div                           one P operand (the numerator),   P
                                          the others B
    neg, float astype, copy             P                                P
    other elementwise                   otherwise all B                  B
    matmul(a, b)                        (S(rows), B)                     S(rows)
                                        (B, S(cols))                     S(cols)
                                        (S(k), S(k)), k contracted       P
                                        a batch axis S on both/one       S(batch)
                                        (P, B) / (B, P)                  P
                                        else (B, B)                      B
    linear(x, w, b)  (x @ w.T + b)      (S(0), B, B)                     S(0)   data parallel
                                        (B, S(0), S(0))                  S(1)   column parallel
                                        (S(1), S(1), P)                  P      row parallel
                                        (P, B, P)                        P
                                        else (B, B, B)                   B
    sum / mean over axes                S(i), i reduced                  P
                                        S(i), i kept                     S(i')
                                        P / B                            P / B
    prod, argmax, argmin                S(i), i kept                     S(i'), else B
    softmax, logsoftmax (axis)          S(i), i != axis                  S(i), else B
    layer_norm (normalised axes)        S(i), i not normalised           S(i), else B
    cross_entropy (N, C) logits         (S(0), S(0))                     S(0) with reduction
                                                                         "none", else P
                                        else (B, B)                      B
    reshape, flatten                    S(i), the axes up to i kept      S(i), else B; P -> P
    transpose                           S(i)                             S(perm.index(i)); P->P
    broadcast_to / sum_to               S(i) on a kept axis              S(i'); summed: P
    getitem (basic index)               S(i), index[i] == ':'            S(i'), else B; P -> P
    concat / split (axis)               S(i), i != axis                  S(i), else B; P -> P
    any other op                        all B                            B  (always correct)

Partial sums only survive linear ops; any other op boxes a partial input to broadcast first.

The pieces:

* :mod:`.sbp`, :mod:`.placement` — the layout vocabulary;
* :mod:`.boxing` — the one redistribution routine (all-reduce, reduce-scatter, all-gather,
  all-to-all, local slices, transfers between placements) and its adjoint;
* :mod:`.rules` — the per-op rules of the table above;
* :mod:`.tensor` — ``GlobalTensor``, ``to_global``/``to_local`` and the dispatch;
* :mod:`.lockstep` — fingerprints of the global ops, compared across ranks;
* :mod:`.checkpoint` — logical checkpoints (``mg.save(..., global_dst_rank=0)``);
* :mod:`.graph` — ``mg.Graph``, OneFlow's ``nn.Graph`` with pipeline stages;
* :mod:`.graph_zero` — ``graph.config.enable_zero(True, stage=1|2|3)``: the optimizer state,
  gradients and parameters of data-parallel graphs sharded as ``split(0)``.
"""

from minigrad import seams
from minigrad.distributed.global_tensor import sbp
from minigrad.distributed.global_tensor.checkpoint import GlobalIO
from minigrad.distributed.global_tensor.graph import Graph, GraphConfig
from minigrad.distributed.global_tensor.lockstep import (
    LockstepError,
    is_lockstep_check_enabled,
    set_lockstep_check,
)
from minigrad.distributed.global_tensor.placement import Placement, placement
from minigrad.distributed.global_tensor.sbp import broadcast, partial_sum, split
from minigrad.distributed.global_tensor.tensor import GlobalParameter, GlobalTensor

seams.GLOBAL_IO.install(GlobalIO())  # mg.save/mg.load of global tensors

__all__ = [
    "GlobalParameter",
    "GlobalTensor",
    "Graph",
    "GraphConfig",
    "LockstepError",
    "Placement",
    "broadcast",
    "is_lockstep_check_enabled",
    "partial_sum",
    "placement",
    "sbp",
    "set_lockstep_check",
    "split",
]
