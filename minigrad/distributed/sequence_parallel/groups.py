"""Which process groups sequence parallelism runs over when the caller names none.

Two groups matter:

* the **sequence group**: the N ranks that share one sequence (each holds L/N of its tokens); the
  attention modules and the split/gather helpers talk over it;
* the **gradient group**: the sequence × data group. Parameters are replicated on all of its ranks
  and every rank's loss is a part of the global loss, so parameter gradients are *summed* over it
  (``dist.make_allreduce_cb("sum", group=gradient_group())``), and the loss helper divides by the
  token count of the whole group.

Every public function of this package takes ``group=None`` and resolves it here, at call time, so
a model may be built before the process groups exist.
"""

from __future__ import annotations

from minigrad.distributed.group import WORLD, Group, get_rank

__all__ = ["gradient_group", "position_in", "sequence_group"]


def sequence_group(group: Group | None = None) -> Group:
    """``group`` itself, or the default sequence group: WORLD.

    Example::

        n = sequence_group().size      # ranks sharing one sequence
    """
    if group is not None:
        return group
    # INTEGRATION POINT (parallel context): once dist.init_parallel exists, return
    # ctx.group("sequence") here when it was initialised with tensor mode "sequence".
    return WORLD


def gradient_group(group: Group | None = None) -> Group:
    """``group`` itself, or the default group gradients and losses are summed over: WORLD.

    Example::

        cb = dist.make_allreduce_cb("sum", group=gradient_group())
    """
    if group is not None:
        return group
    # INTEGRATION POINT (parallel context): once dist.init_parallel exists, return
    # ctx.group("sequence_dp") here when it was initialised with tensor mode "sequence".
    return WORLD


def position_in(op: str, group: Group) -> tuple[int, int]:
    """``(index, size)`` of this process in ``group``; a clear error when it is not a member."""
    index = group.rank
    if index < 0:
        raise ValueError(f"{op}: rank {get_rank()} is not a member of {group}")
    return index, group.size
