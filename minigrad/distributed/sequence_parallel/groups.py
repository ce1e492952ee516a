"""Which process groups sequence parallelism runs over when the caller names none.

Two groups matter:

* the **sequence group**: the N ranks that share one sequence (each holds L/N of its tokens); the
  attention modules and the split/gather helpers talk over it;
* the **gradient group**: the sequence × data group. Parameters are replicated on all of its ranks
  and every rank's loss is a part of the global loss, so parameter gradients are *summed* over it
  (``dist.make_allreduce_cb("sum", group=gradient_group())``), and the loss helper divides by the
  token count of the whole group.

Every public function of this package takes ``group=None`` and resolves it here, at call time, so
a model may be built before the process groups exist: the groups of the parallel context when
``dist.init_parallel`` was given tensor mode ``"sequence"`` (``"sequence"`` and ``"sequence_dp"``),
otherwise WORLD.
"""

from __future__ import annotations

from minigrad.distributed.comm.group import WORLD, Group, get_rank
from minigrad.distributed.mesh.parallel_context import get_parallel_context

__all__ = ["gradient_group", "position_in", "sequence_group"]


def _context_group(name: str) -> Group:
    """The context's group ``name`` when a sequence-parallel context exists, else WORLD."""
    ctx = get_parallel_context(required=False)
    return ctx.group(name) if ctx is not None and ctx.mode == "sequence" else WORLD


def sequence_group(group: Group | None = None) -> Group:
    """``group`` itself, or the default sequence group (the parallel context's ``"sequence"``
    group in tensor mode ``"sequence"``, else WORLD).

    Example::

        n = sequence_group().size      # ranks sharing one sequence
    """
    return group if group is not None else _context_group("sequence")


def gradient_group(group: Group | None = None) -> Group:
    """``group`` itself, or the default group gradients and losses are summed over (the parallel
    context's ``"sequence_dp"`` group in tensor mode ``"sequence"``, else WORLD).

    Example::

        cb = dist.make_allreduce_cb("sum", group=gradient_group())
    """
    return group if group is not None else _context_group("sequence_dp")


def position_in(op: str, group: Group) -> tuple[int, int]:
    """``(index, size)`` of this process in ``group``; a clear error when it is not a member."""
    index = group.rank
    if index < 0:
        raise ValueError(f"{op}: rank {get_rank()} is not a member of {group}")
    return index, group.size
