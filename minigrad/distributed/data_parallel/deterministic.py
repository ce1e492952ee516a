"""Deterministic data parallelism: gradients that do not depend on how the batch was split.

A sum of floats depends on the order of its terms, so one device, DP 2, DP 4 and gradient
accumulation normally give gradients that differ in their last bits (the ring all-reduce adds
the ranks' partial sums in yet another order), and training runs drift apart. Here the global
batch is cut into a fixed number ``num_blocks`` of equal *logical blocks*; the gradient of each
block is computed on its own (the same shapes, hence the same bits, on any rank), and the block
gradients are added in one fixed pairwise tree over the logical block index:

    block:  0   1   2   3   4   5   6   7
             \\ /     \\ /     \\ /     \\ /
             0-1     2-3     4-5     6-7        a node (start, size) is the sum of its
                \\   /           \\   /          two halves, always ``left + right``
                0-3             4-7
                      \\       /
                         0-7                     gradient = (1 / num_blocks) * node 0-7

Each rank adds the blocks it owns into the nodes they complete (whatever order the blocks
arrive in: a node is merged with its sibling as soon as both exist), so a rank that owns an
aligned run of blocks ends with complete subtrees; :meth:`BlockGradients.reduce` all-gathers
every rank's nodes and finishes the same tree on every rank. The result is bitwise identical for
any number of ranks and micro-batches, on one device too. With ``num_blocks`` not a power of two
the top nodes left over are added left to right (still one fixed order).

Cost (docs in :func:`BlockGradients.reduce`): one forward/backward per block instead of one per
local batch (smaller matmuls, more Python per sample), about ``log2(num_blocks)`` live gradient
copies per rank, and an all-gather of every rank's subtree sums instead of an all-reduce.
Limits: the loss must be a mean over samples that are independent of each other (no BatchNorm
in training mode, no loss over the whole batch); layouts that split a reduction *inside* a sample
(tensor parallelism splits a matmul's inner dimension, sequence parallelism the attention sum)
are not covered.

Example::

    from minigrad.distributed.data_parallel import deterministic

    acc = deterministic.BlockGradients(model.parameters(), num_blocks=8)
    for x, y, first in my_micro_batches:            # this rank's part, any number of pieces
        acc.backward(lambda x, y: F.nn.square_loss(model(x), y), x, y, first_block=first)
    loss = acc.reduce()                              # p.grad: the global-batch mean gradient
    opt.step()
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import numpy as np

from minigrad.autodiff.grad_manager import GradManager
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import to_numpy
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import WORLD, is_distributed, resolve_group
from minigrad.distributed.data_parallel.fully_shard import piece_range, unsharded_gradients

__all__ = ["BlockGradients", "block_tree_sum", "current_blocks", "deterministic_reductions"]

_BLOCKS: list[int] = []  # the active deterministic_reductions() settings, innermost last


@contextlib.contextmanager
def deterministic_reductions(num_blocks: int = 8) -> Iterator[int]:
    """Switch deterministic data-parallel reductions on inside the ``with`` block: tools that
    train data-parallel layouts (``minigrad.testing.compare_layouts``) then use
    :class:`BlockGradients` with ``num_blocks`` logical blocks instead of the all-reduce, so every
    data-parallel layout gives the bits of one device.

    Example::

        with deterministic_reductions(8):
            report = compare_layouts(build, batches, layouts=[dict(data=2), dict(data=4)])
    """
    _check_blocks(num_blocks, "deterministic_reductions")
    _BLOCKS.append(int(num_blocks))
    try:
        yield int(num_blocks)
    finally:
        _BLOCKS.pop()


def current_blocks() -> int | None:
    """The ``num_blocks`` of the innermost active :func:`deterministic_reductions` (None: off)."""
    return _BLOCKS[-1] if _BLOCKS else None


def _check_blocks(num_blocks, op: str) -> None:
    if not isinstance(num_blocks, (int, np.integer)) or num_blocks < 1:
        raise ValueError(f"{op}: num_blocks must be a positive int, got {num_blocks!r}")


def _merge(nodes: dict, start: int, size: int, value: list) -> None:
    """Insert node ``(start, size)`` and merge it with its sibling while the sibling exists."""
    while True:
        if start % (2 * size) == 0:
            left, right = start, start + size
        else:
            left, right = start - size, start
        sibling = right if left == start else left
        other = nodes.pop((sibling, size), None)
        if other is None:
            nodes[(start, size)] = value
            return
        lv, rv = (value, other) if left == start else (other, value)
        value = [a + b for a, b in zip(lv, rv)]
        start, size = left, 2 * size


def block_tree_sum(values: Iterable[tuple[int, list]], num_blocks: int) -> list:
    """The fixed pairwise sum of ``(block index, [arrays])`` over blocks ``0..num_blocks-1`` (the
    tree of this module's docstring), whatever order they come in. A reference for tests."""
    nodes: dict = {}
    for index, value in values:
        _merge(nodes, index, 1, list(value))
    return _finish(nodes, num_blocks)


def _finish(nodes: dict, num_blocks: int) -> list:
    covered = sorted(nodes)
    total = sum(size for _, size in covered)
    if total != num_blocks or covered[0][0] != 0:
        raise RuntimeError(
            f"deterministic reduction: expected blocks 0..{num_blocks - 1} exactly once, got "
            f"{total} block(s) in nodes {[(s, s + n - 1) for s, n in covered]}"
        )
    result = nodes[covered[0]]
    for key in covered[1:]:  # top nodes of a non-power-of-two count: left to right
        result = [a + b for a, b in zip(result, nodes[key])]
    return result


class BlockGradients:
    """Accumulate per-block gradients of ``params`` and reduce them in the fixed pairwise order
    over logical block indices (see the module docstring), over ``group``.

    ``num_blocks``: how many equal logical blocks the *global* batch is cut into (the same for
    every layout you want bitwise equal; a power of two divisible by ranks x micro-batches keeps
    every rank's part a complete subtree).

    ``params`` may be the pieces of ``dist.fully_shard`` (ZeRO-2/3): their blocks' gradients are
    then taken in the full shape (the reduce-scatter is skipped, :func:`~.fully_shard.
    unsharded_gradients`), reduced by the same tree, and each piece keeps its part of the result:
    the bits of one device, sharded.
    """

    def __init__(self, params: Iterable[Tensor], num_blocks: int, group=WORLD):
        _check_blocks(num_blocks, "BlockGradients")
        self.params = list(params)
        self.num_blocks = int(num_blocks)
        self.group = resolve_group(group)
        self._gm = GradManager().attach(self.params)
        self._nodes: dict = {}
        # (full shape, start, stop) of fully_shard pieces, None for whole parameters
        self._ranges = [piece_range(p) for p in self.params]
        self._shapes = [tuple(p.shape) if r is None else r[0]
                        for p, r in zip(self.params, self._ranges)]
        self._sharded = any(r is not None for r in self._ranges)

    def backward(self, loss_fn: Callable, *arrays, first_block: int, block_size: int | None = None
                 ) -> list[float]:
        """Cut ``arrays`` (this rank's samples, axis 0) into blocks of ``block_size`` rows
        (default: all of them as one block), numbered from ``first_block``; for each, run
        ``loss_fn(*block_arrays)`` (the mean loss of the block) and its backward, and add its
        gradient to the tree. Returns the blocks' losses. Gradients already in ``.grad`` are
        left untouched."""
        n = len(arrays[0])
        size = n if block_size is None else int(block_size)
        if size < 1 or n % size:
            raise ValueError(
                f"BlockGradients.backward: {n} rows do not cut into blocks of {size} rows")
        saved = [p.grad for p in self.params]
        losses = []
        sharded = unsharded_gradients(self.params) if self._sharded else contextlib.nullcontext()
        try:
            with sharded as take:
                for k in range(n // size):
                    index = first_block + k
                    if not 0 <= index < self.num_blocks:
                        raise ValueError(
                            f"BlockGradients.backward: block index {index} is outside "
                            f"[0, {self.num_blocks})")
                    for p in self.params:
                        p.grad = None
                    part = [a[k * size:(k + 1) * size] for a in arrays]
                    with self._gm:
                        loss = loss_fn(*part)
                        self._gm.backward(loss)
                    grads = self._block_grads(take() if self._sharded else None)
                    loss_value = np.asarray(
                        to_numpy(loss.data if isinstance(loss, Tensor) else loss), np.float64)
                    losses.append(float(loss_value))
                    _merge(self._nodes, index, 1, grads + [loss_value.reshape(1)])
        finally:
            for p, g in zip(self.params, saved):
                p.grad = g
        return losses

    def _block_grads(self, full: list | None) -> list:
        """One block's gradients in the full shapes (zeros where none arrived): ``.grad`` of
        whole parameters, ``full`` (from ``unsharded_gradients``) for pieces."""
        out = []
        for k, (p, shape) in enumerate(zip(self.params, self._shapes)):
            g = full[k] if self._ranges[k] is not None else (
                None if p.grad is None else p.grad.data)
            out.append(np.zeros(shape, p.dtype) if g is None else np.array(to_numpy(g)))
        return out

    def reduce(self) -> float:
        """Finish the tree over every rank of the group and set each parameter's ``.grad`` to the
        mean gradient over the ``num_blocks`` blocks; returns the mean block loss (the same bits
        on every layout). Collective. Communication: one all-gather of each rank's subtree sums
        (with aligned blocks: one gradient copy per rank) and a small metadata all-gather,
        instead of an all-reduce."""
        nodes, self._nodes = self._nodes, {}
        if is_distributed() and self.group.size > 1:
            nodes = self._gather(nodes)
        total = _finish(nodes, self.num_blocks)
        scale = 1.0 / self.num_blocks
        for p, g, where in zip(self.params, total[:-1], self._ranges):
            g = (g * np.asarray(scale, g.dtype)).astype(p.dtype, copy=False)
            if where is not None:  # a fully_shard piece keeps its part of the full gradient
                g = g.reshape(-1)[where[1]:where[2]]
            p.grad = Tensor(g, device=p.device)
        return float(total[-1][0] * scale)

    def _gather(self, nodes: dict) -> dict:
        keys = sorted(nodes)
        meta = np.array([v for key in keys for v in key], np.int64)
        all_meta = comm.all_gather(meta, self.group)
        merged: dict = {}
        pieces = len(self.params) + 1
        # one all-gather per tensor, each rank sending its nodes' copies back to back
        gathered = []
        for i in range(pieces):
            local = [nodes[k][i].reshape(-1) for k in keys]
            dtype = self.params[i].dtype if i < len(self.params) else np.float64
            flat = np.concatenate(local) if local else np.zeros(0, dtype)
            gathered.append(comm.all_gather(flat, self.group))
        for r, m in enumerate(all_meta):
            rank_keys = [tuple(int(v) for v in m[j:j + 2]) for j in range(0, len(m), 2)]
            for j, (start, size) in enumerate(rank_keys):
                value = []
                for i in range(pieces):
                    shape = self._shapes[i] if i < len(self.params) else (1,)
                    count = int(np.prod(shape))
                    value.append(gathered[i][r][j * count:(j + 1) * count].reshape(shape))
                _merge(merged, start, size, value)
        return merged
