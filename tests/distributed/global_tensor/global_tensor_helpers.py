"""Shared by the global-tensor tests: building a global tensor of a known logical value in any
layout (random addends for partial sums), putting a logical value back together from the pieces
the ranks return (without the library's boxing), and counting collectives."""

from __future__ import annotations

import collections
import itertools

import numpy as np

import minigrad as mg
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.global_tensor.sbp import local_slices

SBP_NAMES = ("S0", "S1", "B", "P")
# the array-level collectives boxing runs (the ``*_along`` ones call these), counted under the
# names of OneFlow's boxing table (dist.functional's)
COLLECTIVES = {"all_reduce": "all_reduce_sum", "all_gather": "all_gather",
               "reduce_scatter": "reduce_scatter_sum", "all_to_all": "all_to_all",
               "broadcast": "broadcast"}


def sbp_of(name: str):
    """``"S0"`` -> split(0), ``"B"`` -> broadcast, ``"P"`` -> partial_sum; tuples for N-d."""
    if isinstance(name, tuple):
        return tuple(sbp_of(n) for n in name)
    return {"B": mg.sbp.broadcast, "P": mg.sbp.partial_sum}.get(name) or mg.sbp.split(int(name[1:]))


def coords(mesh_shape):
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def piece(x: np.ndarray, names: tuple, mesh, coord) -> np.ndarray:
    """The piece at ``coord`` of logical ``x`` in layout ``names``; partial mesh dimensions split
    the value into unequal addends (weights 1, 2, 3... normalised along the dimension)."""
    mesh = np.asarray(mesh)
    sbp = sbp_of(names)
    out = np.array(x[local_slices(x.shape, sbp, mesh.shape, coord)])
    for d, name in enumerate(names):
        if name == "P":
            k = mesh.shape[d]
            out = out * ((coord[d] + 1) / (k * (k + 1) / 2))
    return out


def make_global(x: np.ndarray, names: tuple, placement, dtype="float64"):
    """A global tensor of logical value ``x`` in layout ``names`` (built from this rank's piece,
    partial sums as unequal addends)."""
    rank = mg.distributed.get_rank()
    p = piece(x, names, placement.ranks, placement.coord(rank)) if rank in placement else x
    return mg.tensor(p, dtype=dtype).to_global(placement, sbp_of(names))


def assemble(pieces: dict, names: tuple, mesh, shape) -> np.ndarray:
    """The logical value from ``{rank: piece}`` of layout ``names`` on the rank ``mesh``: split
    pieces placed, partial ones summed, broadcast ones checked equal (independent of boxing)."""
    mesh = np.asarray(mesh)
    sbp = sbp_of(names)
    out = np.zeros(shape)
    first = {}
    for c in coords(mesh.shape):
        p = np.asarray(pieces[int(mesh[c])])
        key = tuple(0 if n == "B" else i for n, i in zip(names, c))
        if key != c:  # a broadcast copy: must equal the copy at coordinate 0 of that dimension
            np.testing.assert_array_equal(p, first[key])
            continue
        first[c] = p
        out[local_slices(shape, sbp, mesh.shape, c)] += p
    return out


class CallCounter:
    """Counts calls of the array-level collectives and of comm.send while installed."""

    def __init__(self):
        self.counts = collections.Counter()
        self._saved = []

    def __enter__(self):
        for name, label in COLLECTIVES.items():
            self._wrap(comm, name, label)
        self._wrap(comm, "send")
        return self

    def _wrap(self, module, name, label=None):
        orig = getattr(module, name)

        def counted(*args, **kwargs):
            self.counts[label or name] += 1
            return orig(*args, **kwargs)

        self._saved.append((module, name, orig))
        setattr(module, name, counted)

    def __exit__(self, *exc):
        for module, name, orig in self._saved:
            setattr(module, name, orig)
        return False

    def take(self) -> dict:
        out = dict(self.counts)
        self.counts.clear()
        return out
