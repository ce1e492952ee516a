"""The backward engine: iterative walks over a recorded graph.

A graph is made of nodes (``Function`` calls). Each node has one *edge* per input, pointing at the
node and output index that produced it, at a leaf tensor, or at nothing. A backward *pass* is one
walk over the part of the graph a pass wants:

1. Discover: from the roots, follow the wanted edges and count, for every node and leaf reached,
   how many gradients will be delivered to it.
2. Pop ready nodes newest-first from a heap. Nodes are numbered in creation order, so this is a
   valid reverse-topological order, and a deterministic one: every gradient is summed from the
   same contributions in the same order on every run. Run the node's ``backward`` with the mask of
   the inputs this pass wants (``Function.needs_input_grad``) and route each wanted input gradient
   along its edge. A broadcast input gets its gradient summed back to its shape here, in this one
   place.
3. When a leaf has received all its gradients it is *final*: ``on_leaf(tensor, grad)`` runs at once,
   which is what lets data-parallel all-reduce overlap with the rest of backward.
4. A backward goes only through nodes of the recording it back-propagates (``Recording``, see
   ``minigrad.autodiff.recording``); other edges are dead ends. Once a node has no work left in this
   backward it is released at once: its saved buffers are freed, unless another active recording
   still needs the node (then it is only marked consumed for this one). A freed or consumed node
   cannot be back-propagated again.

``run_backward`` is one pass over everything reachable. A *split* backward (zero-bubble pipelines)
makes two passes over the same graph, given the tensors whose gradients are wanted first (the
``inputs``, e.g. a pipeline stage's input activation):

- X is the set of nodes from which an input can be reached. Every consumer of an X node is itself in
  X, so the input pass (``run_backward_input``) walks X alone, each X node receiving its complete
  output gradient; the pass stops at the inputs (it never goes through an input into what produced
  it) and returns their gradients. Each X node computes only the gradients of its inputs that lead
  to an input.
- An X node with other inputs that want gradients (weights) keeps its output gradients: it is on the
  *frontier*. The weight pass (``run_backward_weight``) starts from the frontier, wanting exactly
  those other inputs, and from the roots outside X, and walks the rest of the graph to the leaves.

Both passes visit nodes in the same descending creation order as a single pass, and every gradient
slot receives the same contributions in the same order, so the input and weight passes together give
bitwise the gradients of ``run_backward`` (ops compute each input's gradient the same way whatever
the mask; ``backward`` must not modify the gradients it is given).

No recursion anywhere, so a chain of 50,000 ops is fine.
"""

from __future__ import annotations

import heapq

import numpy as np

from minigrad import seams
from minigrad.autodiff.recording import Recording
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.xp import get_array_module


class ConsumedGraphError(RuntimeError):
    """A backward reached a node that an earlier backward already consumed (raised while the walk
    discovers the graph, before any node's backward has run)."""


def run_backward(roots, rec: Recording, on_leaf, retain: bool = False,
                 grad_buffer=None) -> None:
    """One pass over everything of ``rec``'s graph reachable from ``roots``.

    ``roots``: ``((target, idx), grad)`` pairs (target a node or a leaf Tensor, grad a Tensor);
    ``on_leaf(tensor, grad)``: a leaf's gradient is final. ``retain=True`` keeps every node for
    another backward (PyTorch's ``retain_graph``) instead of releasing it. ``grad_buffer(leaf)``
    (optional): an array to compute the leaf's gradient into, or None; ops ask for it through
    ``Function.grad_buffer``, and get it only for the last contribution to that leaf's gradient
    (an earlier one written there would be overwritten by a later one before they are summed).
    """
    _Walk(rec, on_leaf=on_leaf, keep=_keep_all if retain else None,
          grad_buffer=grad_buffer).run(roots, [])


class WeightPass:
    """The second half of a split backward, returned by ``run_backward_input``: the frontier nodes
    with their output gradients and weight masks, and the roots left for the weight pass."""

    __slots__ = ("roots", "frontier", "masks", "rec")

    def __init__(self, roots, frontier, masks, rec):
        self.roots, self.frontier, self.masks, self.rec = roots, frontier, masks, rec


def run_backward_input(roots, rec: Recording, inputs, keep_weight_pass: bool = True):
    """The input pass of a split backward: the gradients of ``roots`` with respect to ``inputs``
    (Tensors; a list with None where no gradient arrives) and the ``WeightPass`` still to run.
    With ``keep_weight_pass=False`` nothing is kept for a weight pass (every node is released at
    once): a plain gradient computation, as ``checkpoint`` needs."""
    stops = {_input_key(t): i for i, t in enumerate(inputs)}
    x_nodes = _nodes_reaching(roots, rec, stops)

    def leads_to_input(edge):
        return edge is not None and (_key(edge) in stops or id(edge[0]) in x_nodes)

    first, later = [], []
    for root in roots:
        edge = root[0]
        (first if leads_to_input(edge) else later).append(root)
    frontier, masks = [], {}

    def keep(node, grads, mask):
        """Keep an X node with weight work, and its output gradients, for the weight pass."""
        weight_mask = [w and not i for w, i in zip(_followed(node, rec), mask)]
        if any(weight_mask) and not _all_none(grads):
            frontier.append((node, grads))
            masks[id(node)] = weight_mask
            return True
        return False

    def follow(node):
        return [leads_to_input(e) for e in node._edges]

    walk = _Walk(rec, follow, keep=keep if keep_weight_pass else None, stops=stops,
                 n_stops=len(inputs))
    collected = walk.run(first, [])
    return collected, WeightPass(later, frontier, masks, rec)


def run_backward_weight(weight_pass: WeightPass, on_leaf) -> None:
    """The weight pass of a split backward (see ``run_backward_input``)."""
    masks, rec = weight_pass.masks, weight_pass.rec

    def follow(node):
        mask = masks.get(id(node))
        return mask if mask is not None else _followed(node, rec)

    ready, weight_pass.frontier = weight_pass.frontier, []
    roots, weight_pass.roots = weight_pass.roots, []
    _Walk(rec, follow, on_leaf).run(roots, ready)


# -------------------------------------------------------------------------------------------------
# the walk


class _Walk:
    """One walk over a recorded graph, the textbook loop::

        count the deliveries every node and leaf will receive     (discover)
        deliver the roots' gradients                              (deliver)
        while a node is ready, newest first:                      (the heap)
            call its backward                                     (call_backward)
            release it, unless a later pass keeps it              (release)
            send each wanted input gradient along its edge        (send_input_grads)

    ``follow(node)`` gives the node's mask of wanted edges (None: ``_followed``, every edge to a
    leaf or to a node of ``rec``). Gradients reaching an edge listed in ``stops`` (edge key ->
    index) are summed into ``collected`` instead of going further. A leaf whose gradient is
    complete goes to ``on_leaf(tensor, grad)``. After each node's backward, ``keep(node, grads,
    mask)`` may claim the node for a later pass; otherwise it is released.
    """

    __slots__ = ("rec", "follow", "stops", "keep", "on_leaf", "grad_buffer", "waiting", "masks",
                 "heap", "collected")

    def __init__(self, rec: Recording, follow=None, on_leaf=None, keep=None, stops=None,
                 n_stops: int = 0, grad_buffer=None):
        self.rec, self.follow, self.on_leaf, self.keep = rec, follow, on_leaf, keep
        self.stops, self.grad_buffer = stops, grad_buffer
        # node or leaf id -> [deliveries still to come, its gradients summed so far (or None)]
        self.waiting: dict[int, list] = {}
        self.masks: dict[int, list] = {}     # node id -> its wanted edges
        self.heap: list = []                 # ready nodes, (-creation number, id, node, grads)
        self.collected = [None] * n_stops

    def run(self, roots, ready) -> list:
        """Deliver ``roots`` (``((target, idx), grad)`` pairs), then run nodes newest-first until
        the graph (as far as ``follow`` goes) is done. ``ready`` holds ``(node, grads)`` pairs whose
        output gradients are already complete. Returns the gradients collected at the stops."""
        self.discover(roots, ready)
        heap, deliver = self.heap, self.deliver
        for node, grads in ready:
            heapq.heappush(heap, (-node._seq, id(node), node, grads))
        for (target, idx), g in roots:
            deliver(target, idx, g)
        call_backward, send_input_grads = self.call_backward, self.send_input_grads
        keep, rec, masks = self.keep, self.rec, self.masks
        offer = None if self.grad_buffer is None else self.offer_buffer
        while heap:
            _, key, node, grads = heapq.heappop(heap)
            mask = masks[key]
            edges, in_meta = node._edges, node._in_meta  # read before release frees them
            if offer is None:
                in_grads = call_backward(node, edges, grads, mask)
            else:
                node._offer = offer
                in_grads = call_backward(node, edges, grads, mask)
                node._offer = None
            if keep is None or not keep(node, grads, mask):
                _release(node, rec)
            send_input_grads(node, edges, in_meta, in_grads, mask)
        return self.collected

    def discover(self, roots, ready) -> None:
        """Count, for every node and leaf the walk reaches, the gradients it will receive, and
        record each node's mask of wanted edges."""
        waiting, masks, stops, follow = self.waiting, self.masks, self.stops, self.follow
        rec = self.rec
        consumed = rec.consumed
        stack = [node for node, _ in ready]
        for (target, idx), _ in roots:
            if not (stops and _key((target, idx)) in stops):
                _expect_one_more(waiting, id(target))
                if not isinstance(target, Tensor):
                    stack.append(target)
        while stack:
            node = stack.pop()
            if id(node) in masks:
                continue
            edges = node._edges
            if edges is None or (consumed is not None and node in consumed):
                raise ConsumedGraphError(
                    f"backward through a {type(node).__name__} node that an earlier backward "
                    "already consumed (each recorded graph can be back-propagated once)"
                )
            if follow is None:  # an ordinary pass: ``_followed``, written out (the hot path)
                mask = masks[id(node)] = []
                for edge in edges:
                    if edge is None:
                        mask.append(False)
                        continue
                    target = edge[0]
                    if isinstance(target, Tensor):
                        mask.append(True)
                    elif rec in target._tape:
                        mask.append(True)
                        stack.append(target)
                    else:
                        mask.append(False)
                        continue
                    entry = waiting.get(id(target))
                    if entry is None:
                        waiting[id(target)] = [1, None]
                    else:
                        entry[0] += 1
                continue
            mask = masks[id(node)] = follow(node)
            for edge, wanted in zip(edges, mask):
                if wanted and not (stops and _key(edge) in stops):
                    target = edge[0]
                    entry = waiting.get(id(target))
                    if entry is None:
                        waiting[id(target)] = [1, None]
                    else:
                        entry[0] += 1
                    if not isinstance(target, Tensor):
                        stack.append(target)

    def offer_buffer(self, node, i: int):
        """``Function.grad_buffer``'s source during this walk: ``grad_buffer(leaf)`` when input
        ``i`` of ``node`` is a leaf Tensor awaiting one last gradient contribution (this node's),
        else None."""
        edge = node._edges[i]
        if edge is None or not isinstance(edge[0], Tensor):
            return None
        entry = self.waiting.get(id(edge[0]))
        return None if entry is None or entry[0] != 1 else self.grad_buffer(edge[0])

    def deliver(self, target, idx: int, grad) -> None:
        """Add ``grad`` (or nothing, when None) to an edge target; once the target has all its
        gradients, a leaf goes to ``on_leaf`` and a node onto the heap."""
        stops = self.stops
        if stops:
            i = stops.get(_key((target, idx)))
            if i is not None:
                if grad is not None:
                    collected = self.collected
                    collected[i] = grad if collected[i] is None else collected[i] + grad
                return
        key = id(target)
        entry = self.waiting[key]
        slot = entry[1]
        if slot is None:
            slot = entry[1] = [None] * (1 if isinstance(target, Tensor) else target._n_out)
        if grad is not None:
            slot[idx] = grad if slot[idx] is None else slot[idx] + grad
        entry[0] -= 1
        if entry[0] > 0:
            return
        del self.waiting[key]
        if isinstance(target, Tensor):
            if slot[0] is not None:
                self.on_leaf(target, slot[0])
        else:
            heapq.heappush(self.heap, (-target._seq, key, target, slot))

    @staticmethod
    def call_backward(node, edges, grads, mask) -> list:
        """The gradients of ``node``'s inputs (one per edge of ``edges``) from its output
        gradients ``grads`` (``mask``: the inputs this pass wants), computed on the op's device;
        all None when nothing flowed in."""
        if grads[0] is None and _all_none(grads):  # nothing flowed in: nothing flows out
            return [None] * len(edges)
        node._wanted = mask
        g = grads[0]
        device = g._device if g is not None else _device_of(grads)
        if device.kind == "cpu":
            in_grads = node.backward(*grads)
        else:
            with device.context():  # the op's GPU is current while its backward launches
                in_grads = node.backward(*grads)
        if not isinstance(in_grads, (tuple, list)):
            in_grads = (in_grads,)
        if len(in_grads) != len(edges):
            raise RuntimeError(
                f"{type(node).__name__}.backward returned {len(in_grads)} gradient(s) for "
                f"{len(edges)} input(s)"
            )
        return in_grads

    def send_input_grads(self, node, edges, in_meta, in_grads, mask) -> None:
        """Deliver each wanted input gradient along its edge, summed back to the input's shape
        (broadcasting) and cast to its dtype (``in_meta``: each input's shape, dtype, device)."""
        deliver = self.deliver
        for edge, m, g, wanted in zip(edges, in_meta, in_grads, mask):
            if g is None:
                if wanted:
                    deliver(edge[0], edge[1], None)
                continue
            if g.__class__ is not Tensor and not isinstance(g, Tensor):
                if not _is_array(g):  # (checked for every input, wanted or not)
                    raise _not_a_gradient(node, in_grads, g)
                if not wanted:
                    continue
                g = Tensor._wrap(g, m[2])  # a raw array from a fast backward path
            elif not wanted:
                continue
            data = g._data
            if data.shape != m[0]:
                g = g.sum_to(m[0])
                data = g._data
            if data.dtype != m[1]:
                g = g.astype(m[1])
            deliver(edge[0], edge[1], g)


# -------------------------------------------------------------------------------------------------
# helpers


_untraced_backward = _Walk.call_backward


def _traced_backward(node, edges, grads, mask) -> list:
    return seams.TRACER.value.backward(node, lambda: _untraced_backward(node, edges, grads, mask))


def _use_tracer(tracer) -> None:
    """While the profiler runs, each node's backward is timed (swapped in, so free otherwise)."""
    _Walk.call_backward = staticmethod(_untraced_backward if tracer is None else _traced_backward)


seams.TRACER.watch(_use_tracer)


def _keep_all(node, grads, mask) -> bool:
    """``keep`` of a retaining walk: every node stays, nothing is released."""
    return True


def _expect_one_more(waiting: dict, key: int) -> None:
    """Count one more delivery to the node or leaf ``key`` (see ``_Walk.waiting``)."""
    entry = waiting.get(key)
    if entry is None:
        waiting[key] = [1, None]
    else:
        entry[0] += 1


def _followed(node, rec: Recording) -> list:
    """The edges an ordinary pass follows: every edge to a leaf or to a node ``rec`` recorded."""
    return [e is not None and (isinstance(e[0], Tensor) or rec in e[0]._tape) for e in node._edges]


def _release(node, rec: Recording) -> None:
    """``rec``'s backward is done with ``node``: free its buffers, unless another active recording
    still needs it (then only remember that ``rec`` consumed it)."""
    tape = node._tape
    if len(tape) > 1 and any(r.active and r is not rec for r in tape):
        rec.mark_consumed(node)
    else:
        node._free()


def _not_a_gradient(node, in_grads, g) -> TypeError:
    """The error for something other than a Tensor, an array or None returned by ``backward``."""
    i = next(i for i, x in enumerate(in_grads) if x is g)
    return TypeError(
        f"{type(node).__name__}.backward must return a Tensor, an array or None for each "
        f"input; got {type(g).__name__} for input {i}"
    )


def _device_of(grads):
    """The device of a node's output gradients (the first that is not None): its op's device."""
    for g in grads:
        if g is not None:
            return g._device
    raise AssertionError("a node runs backward only when a gradient reached it")


def _all_none(grads) -> bool:
    for g in grads:  # (not list.count: Tensor == is elementwise)
        if g is not None:
            return False
    return True


def _key(edge) -> tuple:
    return id(edge[0]), edge[1]


def _input_key(t: Tensor) -> tuple:
    """The edge through which gradients reach ``t``: its producing node's output, or the leaf."""
    return (id(t._node), t._out_idx) if t._node is not None else (id(t), 0)


def _nodes_reaching(roots, rec: Recording, stops) -> set:
    """Ids of ``rec``'s nodes reachable from ``roots`` (not through a stop) from which a stop can be
    reached. Inputs of a node are older than the node, so one sweep in creation order does it."""
    nodes, seen = [], set()
    stack = [edge[0] for edge, _ in roots if not isinstance(edge[0], Tensor)]
    while stack:
        node = stack.pop()
        if id(node) in seen or rec not in node._tape:
            continue
        seen.add(id(node))
        nodes.append(node)
        for e in node._edges or ():
            if e is not None and not isinstance(e[0], Tensor) and _key(e) not in stops:
                stack.append(e[0])
    x_nodes = set()
    for node in sorted(nodes, key=lambda n: n._seq):
        for e in node._edges or ():
            if e is not None and (_key(e) in stops or id(e[0]) in x_nodes):
                x_nodes.add(id(node))
                break
    return x_nodes


def _is_array(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic)) or get_array_module(value) is not np
