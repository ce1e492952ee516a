"""The backward engine: an iterative walk over the recorded graph.

1. Count, for every node and leaf reachable from the roots, how many edges point at it.
2. Pop ready nodes newest-first from a heap (a valid reverse-topological order, deterministic),
   run their ``backward``, and route each input gradient along its edge. A broadcast input gets its
   gradient summed back to its shape here, in this one place.
3. When a leaf has received all its gradients it is *final*: ``on_leaf(tensor, grad)`` runs at once,
   which is what lets data-parallel all-reduce overlap with the rest of backward.
4. A node's saved buffers are freed right after its backward unless the graph must be kept.

No recursion anywhere, so a chain of 50,000 ops is fine.
"""

from __future__ import annotations

import heapq


def run_backward(roots, root_grads, on_leaf, keep_graph: bool) -> None:
    """Propagate ``root_grads`` (Tensors) from ``roots`` (``(node_or_leaf, out_idx)`` pairs)."""
    from minigrad.functional.shape import sum_to  # noqa: PLC0415
    from minigrad.tensor import Tensor  # noqa: PLC0415

    deps: dict[int, int] = {}
    seen = set()
    stack = [target for target, _ in roots]
    while stack:  # count incoming edges of everything reachable
        target = stack.pop()
        if id(target) in seen:
            continue
        seen.add(id(target))
        if isinstance(target, Tensor):
            continue
        if target._edges is None:
            raise RuntimeError(
                f"backward through {type(target).__name__} whose buffers were already freed "
                "(a recorded graph can be used for one backward only)"
            )
        for edge in target._edges:
            if edge is not None:
                k = id(edge[0])
                deps[k] = deps.get(k, 0) + 1
                stack.append(edge[0])

    pending: dict[int, list] = {}
    heap: list = []

    def deliver(target, idx, grad):
        """Add ``grad`` (or nothing, when None) to an edge target; schedule it once complete."""
        key = id(target)
        slot = pending.get(key)
        if slot is None:
            slot = pending[key] = [None] * (1 if isinstance(target, Tensor) else target._n_out)
        if grad is not None:
            slot[idx] = grad if slot[idx] is None else slot[idx] + grad
        deps[key] -= 1
        if deps[key] > 0:
            return
        del pending[key]
        if isinstance(target, Tensor):
            if slot[0] is not None:
                on_leaf(target, slot[0])
        else:
            heapq.heappush(heap, (-target._seq, key, target, slot))

    for target, _ in roots:
        deps[id(target)] = deps.get(id(target), 0) + 1
    for (target, idx), g in zip(roots, root_grads):
        deliver(target, idx, g)

    while heap:
        _, _, node, grads = heapq.heappop(heap)
        edges, meta = node._edges, node._in_meta
        missing = [i for i, g in enumerate(grads) if g is None]
        if len(missing) == len(grads):  # nothing flowed in: nothing flows out
            in_grads = [None] * len(edges)
        else:
            for i in missing:
                grads[i] = Tensor._zeros_for(node, i)
            in_grads = node.backward(*grads)
            if not isinstance(in_grads, (tuple, list)):
                in_grads = (in_grads,)
            if len(in_grads) != len(edges):
                raise RuntimeError(
                    f"{type(node).__name__}.backward returned {len(in_grads)} gradient(s) for "
                    f"{len(edges)} input(s)"
                )
        if not keep_graph:
            node._free()
        for edge, m, g in zip(edges, meta, in_grads):
            if edge is None:
                continue
            if g is not None:
                if not isinstance(g, Tensor):  # a raw array from a fast backward path
                    g = Tensor._wrap(g, m[2])
                if g._data.shape != m[0]:
                    g = sum_to(g, m[0])
                if g._data.dtype != m[1]:
                    g = g.astype(m[1])
            deliver(edge[0], edge[1], g)
