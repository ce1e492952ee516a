"""SBP: how a global tensor's logical value is laid out over one dimension of its device mesh.

* ``split(dim)`` (S): the ranks along the mesh dimension hold consecutive blocks of axis ``dim``;
  the logical value is their concatenation. Sizes are balanced as in OneFlow: ``n`` rows over
  ``k`` ranks give the first ``n % k`` ranks one row more (10 over 4: 3, 3, 2, 2).
* ``broadcast`` (B): every rank holds the whole value.
* ``partial_sum`` (P): every rank holds a tensor of the full shape; the logical value is their sum.

A global tensor has one SBP per mesh dimension (an *nd-SBP*, a tuple). Pieces nest in mesh order:
mesh dimension 0 cuts the logical tensor, mesh dimension 1 cuts each of those pieces, and so on.

Gradients use the *adjoint* layouts: the gradient of a broadcast value is a partial sum (every
replica's share adds up) and the gradient of a partial sum is broadcast; split stays split.

Example::

    mg.sbp.split(0), mg.sbp.broadcast, mg.sbp.partial_sum
    balanced_sizes(10, 4)   # [3, 3, 2, 2]
"""

from __future__ import annotations

from typing import Sequence

__all__ = [
    "SBP",
    "Split",
    "adjoint",
    "as_nd_sbp",
    "balanced_sizes",
    "broadcast",
    "describe",
    "local_shape",
    "local_slices",
    "partial_sum",
    "split",
]


class SBP:
    """One mesh dimension's layout (``kind`` "S", "B" or "P"); compares by value."""

    __slots__ = ()

    kind = ""

    def __eq__(self, other) -> bool:
        return isinstance(other, SBP) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self.kind,)


class Split(SBP):
    """``split(dim)``: consecutive blocks of axis ``dim`` (balanced sizes)."""

    __slots__ = ("dim",)
    kind = "S"

    def __init__(self, dim: int):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ValueError(f"sbp.split: dim must be a non-negative int, got {dim!r}")
        self.dim = dim

    def _key(self) -> tuple:
        return ("S", self.dim)

    def __reduce__(self):
        return Split, (self.dim,)

    def __repr__(self) -> str:
        return f"split(dim={self.dim})"


class _Whole(SBP):
    """``broadcast`` and ``partial_sum``: layouts without a parameter, one instance each."""

    __slots__ = ("kind", "_name")

    def __init__(self, kind: str, name: str):
        self.kind, self._name = kind, name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self):
        return self._name  # pickled as this module's instance of that name


#: Every rank holds the whole value.
broadcast = _Whole("B", "broadcast")
#: Every rank holds a full-shape addend; the logical value is their sum.
partial_sum = _Whole("P", "partial_sum")


def split(dim: int) -> Split:
    """Blocks of axis ``dim`` (OneFlow's ``flow.sbp.split(dim)``).

    Example::

        x = mg.randn(10, 3, placement=mg.placement("cpu", [0, 1]), sbp=mg.sbp.split(0))
        x.to_local().shape   # (5, 3) on each rank
    """
    return Split(dim)


def describe(nd_sbp) -> str:
    """A short form for messages: ``(S(0), B)``."""
    return "(" + ", ".join(f"S({s.dim})" if s.kind == "S" else s.kind for s in nd_sbp) + ")"


def adjoint(sbp: SBP) -> SBP:
    """The layout of a gradient: S(d) -> S(d), B -> P, P -> B."""
    if sbp.kind == "B":
        return partial_sum
    if sbp.kind == "P":
        return broadcast
    return sbp


def as_nd_sbp(sbp, mesh_ndim: int, ndim: int | None = None, where: str = "sbp") -> tuple:
    """``sbp`` (one SBP, or a tuple/list of one per mesh dimension) as a tuple of ``mesh_ndim``
    SBPs, checked against the tensor rank ``ndim`` when given."""
    items = (sbp,) if isinstance(sbp, SBP) else sbp
    if not isinstance(items, (tuple, list)) or not all(isinstance(s, SBP) for s in items):
        raise TypeError(
            f"{where}: expected mg.sbp.split(dim), mg.sbp.broadcast or mg.sbp.partial_sum, or a "
            f"tuple of them (one per mesh dimension), got {sbp!r}"
        )
    items = tuple(items)
    if len(items) != mesh_ndim:
        raise ValueError(
            f"{where}: the placement's mesh has {mesh_ndim} dimension(s), so the sbp needs "
            f"{mesh_ndim} entries, got {len(items)}: {items}"
        )
    if ndim is not None:
        for s in items:
            if s.kind == "S" and s.dim >= max(ndim, 0):
                raise ValueError(
                    f"{where}: {s} is out of range for a tensor of rank {ndim}"
                )
    return items


def balanced_sizes(n: int, k: int) -> list:
    """``n`` items over ``k`` parts, the first ``n % k`` parts one larger (OneFlow's rule)."""
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def piece_bounds(n: int, k: int, i: int) -> tuple:
    """``(start, stop)`` of part ``i`` when ``n`` items are split over ``k`` parts."""
    sizes = balanced_sizes(n, k)
    start = sum(sizes[:i])
    return start, start + sizes[i]


def local_slices(shape: Sequence[int], nd_sbp: tuple, mesh_shape: Sequence[int],
                 coord: Sequence[int]) -> tuple:
    """The index (one slice per axis) of the piece at mesh coordinate ``coord`` in the logical
    array of ``shape``; splits nest in mesh order (broadcast and partial keep the whole axis)."""
    starts, stops = [0] * len(shape), list(shape)
    for s, k, i in zip(nd_sbp, mesh_shape, coord):
        if s.kind == "S":
            a, b = piece_bounds(stops[s.dim] - starts[s.dim], k, i)
            starts[s.dim], stops[s.dim] = starts[s.dim] + a, starts[s.dim] + b
    return tuple(slice(a, b) for a, b in zip(starts, stops))


def local_shape(shape: Sequence[int], nd_sbp: tuple, mesh_shape: Sequence[int],
                coord: Sequence[int]) -> tuple:
    """The shape of the piece at mesh coordinate ``coord``."""
    return tuple(s.stop - s.start for s in local_slices(shape, nd_sbp, mesh_shape, coord))
