"""Activation checkpointing: trade compute for memory.

``checkpoint(fn, *args)`` runs ``fn`` now but keeps none of its intermediate results: in the
recorded graph one node stands for the whole call, holding only the arguments. When a backward
reaches that node, ``fn`` runs again on the same arguments, with every random generator minigrad
ops draw from (``minigrad.backend.rng``, used by dropout) put back in the state it had before
the first run, so the recomputation is bitwise the first run. Its graph is recorded privately
and the node's output gradients are back-propagated through it to the arguments and to the tensors
``fn`` used that need gradients (the parameters of the layers it calls). Works in every backward
mode:
``release=False`` and the split backward (each pass recomputes and computes only the gradients it
wants).

How the node learns which parameters ``fn`` uses: the first run is recorded like any other code,
then the recorded nodes are walked to find the leaves they reach and freed at once, so their memory
is held only while ``fn`` runs.
"""

from __future__ import annotations

import contextlib

import numpy as np

from minigrad.autodiff.engine import run_backward_input
from minigrad.autodiff.function import Function
from minigrad.autodiff.recording import STATE, Recording, is_recording, recording_for
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.rng import get_rng


def checkpoint(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` without keeping its intermediate tensors for backward: they are
    recomputed when the backward needs them. ``args`` may hold Tensors (differentiated) and other
    values; ``kwargs`` are passed unchanged. ``fn`` returns a Tensor or a tuple/list of Tensors;
    tensors it uses from outside that need gradients must be arguments or leaves (parameters).
    ``fn`` must not communicate (it runs again during backward).

    Gradients are bitwise those of ``fn(*args)`` without checkpointing when each argument and
    parameter is used only inside ``fn`` (otherwise equal up to the order of one sum).

    Example::

        h = checkpoint(block, h)  # block's activations are recomputed during backward
    """
    if not is_recording():
        return fn(*args, **kwargs)
    rng_state = _rng_state(args)
    seq0 = STATE.seq
    stand_ins = [_stand_in(a) for a in args]
    result = fn(*stand_ins, **kwargs)
    outputs = _as_output_list(result, fn)
    leaves = _free_recorded(outputs, seq0, fn)
    params = [t for t in leaves if not any(t is s for s in stand_ins)]
    node = _Checkpoint()
    node.fn, node.kwargs, node.n_args, node.params = fn, kwargs, len(args), params
    node.rng_state = rng_state
    node.outputs = tuple(o._data for o in outputs)
    wrapped = node(*args, *params)
    if isinstance(result, Tensor):
        return wrapped[0]
    return type(result)(wrapped)


class _Checkpoint(Function):
    """The node standing for one ``checkpoint`` call: its inputs are the arguments followed by the
    parameters ``fn`` used; its outputs are ``fn``'s."""

    def forward(self, *inputs):
        self.args = inputs[: self.n_args]
        outputs, self.outputs = self.outputs, None  # computed by checkpoint(); hand them over
        return outputs

    def backward(self, *grads):
        if is_recording():
            raise NotImplementedError(
                f"checkpoint({getattr(self.fn, '__name__', self.fn)!r}): higher-order gradients "
                "through a checkpointed function are not supported (a GradManager entered before "
                "the one running backward is recording it)"
            )
        wanted = [self.needs_input_grad(i) for i in range(self.n_args + len(self.params))]
        stand_ins = [_stand_in(a) for a in self.args]
        rec = Recording(None, level=0)
        with _rng_restored(self.rng_state), recording_for((rec,)):
            outputs = _as_output_list(self.fn(*stand_ins, **self.kwargs), self.fn)
        roots = []
        for out, g in zip(outputs, grads):
            if g is None:
                continue
            if out._node is not None and rec in out._node._tape:
                roots.append(((out._node, out._out_idx), g))
            elif out._requires_grad:  # fn returned an argument or a parameter as it is
                roots.append(((out, 0), g))
        targets = [t for t, w in zip(stand_ins + self.params, wanted) if w]
        try:
            found = iter(run_backward_input(roots, rec, targets, keep_weight_pass=False)[0])
        finally:
            rec.active = False
        return tuple(next(found) if w else None for w in wanted)


def _stand_in(arg):
    """A fresh leaf sharing a float argument's data, so that ``fn``'s use of it is recorded and
    its gradient collected there; other arguments pass as they are."""
    if not isinstance(arg, Tensor) or arg.dtype.kind != "f":
        return arg
    leaf = Tensor._wrap(arg._data, arg._device)
    leaf._requires_grad = True
    return leaf


def _as_output_list(result, fn) -> list:
    outputs = [result] if isinstance(result, Tensor) else result
    if not isinstance(outputs, (tuple, list)) or not all(isinstance(o, Tensor) for o in outputs):
        raise TypeError(
            f"checkpoint: {getattr(fn, '__name__', fn)!r} must return a Tensor or a tuple/list of "
            f"Tensors, got {type(result).__name__}"
        )
    return list(outputs)


def _free_recorded(outputs, seq0: int, fn) -> list:
    """Walk the nodes recorded while ``fn`` ran (numbered after ``seq0``) from its outputs, free
    them, and return the leaf tensors they reach (stand-ins and parameters), in a fixed order."""
    leaves, nodes, seen = {}, [], set()
    stack = []

    def reach(target):
        if isinstance(target, Tensor):
            if target._requires_grad:
                leaves.setdefault(id(target), target)
        elif target._seq > seq0:
            stack.append(target)
        elif target.is_live:
            raise ValueError(
                f"checkpoint: {getattr(fn, '__name__', fn)!r} uses a tensor computed outside it "
                "that needs a gradient; pass that tensor as an argument"
            )

    for out in outputs:
        reach(out._node if out._node is not None else out)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        for edge in node._edges:
            if edge is not None:
                reach(edge[0])
    for node in nodes:
        node._free()
    return list(leaves.values())


# -------------------------------------------------------------------------------------------------
# random generator state


def _rng_state(args) -> list:
    """``(generator, state)`` for the CPU generator and the generator of every GPU an argument
    lives on."""
    devices = {"cpu0"} | {str(a.device) for a in args if isinstance(a, Tensor)}
    generators = {id(g): g for g in (get_rng(d) for d in sorted(devices))}
    return [(g, _get_state(g)) for g in generators.values()]


@contextlib.contextmanager
def _rng_restored(saved):
    """Run a block with the generators in the ``saved`` state, then put back the state they had."""
    now = [(g, _get_state(g)) for g, _ in saved]
    for g, state in saved:
        _set_state(g, state)
    try:
        yield
    finally:
        for g, state in now:
            _set_state(g, state)


def _get_state(generator):
    bits = generator.bit_generator
    if isinstance(generator, np.random.Generator):
        return bits.state
    with bits._state.device:  # CuPy keeps a cuRAND generator's whole state in one device array
        return bits._state.copy()  # (copied on its own GPU: copy() copies to the current one)


def _set_state(generator, state) -> None:
    bits = generator.bit_generator
    if isinstance(generator, np.random.Generator):
        bits.state = state
    else:
        with bits._state.device:
            bits._state[...] = state
