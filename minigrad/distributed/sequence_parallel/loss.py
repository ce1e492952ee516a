"""The loss of a sequence-parallel model: each rank's share of the global mean token loss.

With the sequence split over N ranks (and the batch over D data-parallel replicas), the mean token
cross-entropy of the whole batch is ``Σ_ranks (sum of the rank's token losses) / T`` with ``T`` the
global number of tokens. Each rank computes its term; summing the parameter gradients over the
sequence × data group (``dist.make_allreduce_cb("sum", group=gradient_group())``) then gives
exactly the gradient of the single-device mean loss.
"""

from __future__ import annotations

import minigrad.functional as F
from minigrad.autodiff.tensor import Tensor
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.groups import gradient_group, position_in

__all__ = ["sequence_cross_entropy"]


def sequence_cross_entropy(logits, labels, group: Group | None = None) -> Tensor:
    """This rank's share of the mean token cross-entropy: the sum of its token losses divided by the
    global token count (its token count × the size of ``group``, the sequence × data group over
    which the shares are summed; every rank holds the same number of tokens).

    ``logits`` are ``(..., V)`` and ``labels`` the matching integer ``(...)``. The shares sum to the
    global mean, so for logging all-reduce the detached value.

    Example::

        loss = sequence_cross_entropy(model(ids), labels)    # shards (B, L/N, V) and (B, L/N)
        gm.backward(loss)
    """
    if not isinstance(logits, Tensor) or logits.ndim < 2:
        raise ValueError(
            "sequence_cross_entropy: logits must be a Tensor of shape (..., V), got "
            f"{getattr(logits, 'shape', type(logits).__name__)}"
        )
    _, size = position_in("sequence_cross_entropy", gradient_group(group))
    vocab = logits.shape[-1]
    tokens = logits.size // vocab
    labels = labels if isinstance(labels, Tensor) else Tensor(labels, device=logits.device)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"sequence_cross_entropy: labels of shape {labels.shape} do not match logits "
            f"{logits.shape} (expected {logits.shape[:-1]})"
        )
    total = F.nn.cross_entropy(
        logits.reshape(tokens, vocab), labels.reshape(tokens), reduction="sum"
    )
    return total / (tokens * size)
