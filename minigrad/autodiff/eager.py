"""Eager autograd: PyTorch's and OneFlow's ``loss.backward()`` without a GradManager.

minigrad records gradients the MegEngine way: ops are recorded while a ``GradManager`` records
(``with gm:``) and ``gm.backward(loss)`` ends the recording. PyTorch and OneFlow programs record
without being asked and call ``loss.backward()``. This module is that second mode, built next to
the first without changing it:

1. What is recorded. Outside every GradManager (``STATE.tape`` empty) and outside ``no_grad``, an
   op is recorded when one of its tensor inputs has ``_eager_grad``: a Parameter (trainable by
   default; ``requires_grad_(False)`` freezes it), a tensor given ``requires_grad=True``, or the
   float output of an op recorded this way. ``Function.__call__`` finds out with one attribute
   read per tensor input, so ops on tensors that need no gradient pay (almost) nothing. Such a node
   belongs to one permanent recording, ``recording.EAGER`` (``node._tape is EAGER_TAPE``), which no
   GradManager ever sees: inside ``with gm:`` the rule is not even consulted, and tensors from an
   eager graph are constants there, as any tensor computed outside the recording always was.
2. Lifetime: the graph hangs off its outputs. No tape or list holds the nodes: an output holds the
   node that produced it, a node holds its inputs' nodes and what its op saved for backward
   (PyTorch's ``grad_fn`` chain). A graph dies with its last output, freed by reference counting
   (no cycles), so an inference loop that never calls backward and never says ``no_grad`` does not
   grow; ``no_grad`` saves the recording's cost.
3. Backward. ``loss.backward(gradient)`` starts from ``gradient`` (ones for a one-element tensor;
   any other shape must give it, as in PyTorch) and runs the engine's ordinary walk
   (``run_backward``) over the ``EAGER`` graph reachable from the loss, with recording off (the
   backward builds no graph of its own) and autocast off (gradient ops run in the dtypes of the
   forward). Once the walk is done, each leaf's gradient is added to its ``.grad`` (PyTorch's
   accumulation: gradients of successive backwards sum until ``zero_grad`` / ``clear_grad``).
4. Freeing. The walk frees each node as it leaves it (its saved buffers go), as a GradManager's
   does, unless ``retain_graph=True``. A later backward that reaches a freed node raises PyTorch's
   "backward through the graph a second time" error while the walk is still discovering the graph,
   before any gradient is computed or accumulated.
5. Same engine, same numbers. The walk, the op backwards and the order in which contributions are
   summed are those of ``GradManager.backward``, so on the same model both modes give bitwise the
   same gradients.

Not covered: ``create_graph=True`` (higher-order gradients: nested GradManagers do those); global
tensors (their ops are not recorded eagerly, so ``loss.backward()`` raises). The callbacks of
``GradManager.attach`` and ``register_grad_hook`` hooks (``DistributedDataParallel``'s gradient
all-reduce) run only in a GradManager's backward: a leaf with such hooks makes the eager backward
raise before any ``.grad`` changes, instead of leaving the ranks' gradients unsynchronised.

Example::

    model = M.Linear(4, 2)                # parameters require gradients by default
    loss = model(x).sum()                 # recorded, no GradManager
    loss.backward()                       # model.weight.grad, model.bias.grad
"""

from __future__ import annotations

from minigrad.autodiff.autocast import autocast_off
from minigrad.autodiff.engine import ConsumedGraphError, run_backward
from minigrad.autodiff.grad_manager import has_grad_hooks
from minigrad.autodiff.recording import EAGER, recording_for
from minigrad.autodiff.tensor import Tensor

#: PyTorch's words for a backward through a freed graph, so that its users recognise it.
SECOND_BACKWARD = (
    "Tensor.backward: trying to backward through the graph a second time (its saved tensors were "
    "freed by the first backward); specify retain_graph=True in the first backward if you need "
    "to backward through the graph a second time"
)


class EagerAutograd:
    """The backward of graphs recorded outside GradManagers: the manager bound to
    ``recording.EAGER``, which ``Tensor.backward`` calls for an eagerly recorded tensor."""

    def backward(self, y: Tensor, gradient=None, retain_graph=None,
                 create_graph: bool = False) -> None:
        """Accumulate the gradients of ``y`` (seeded with ``gradient``, default ones for a
        one-element ``y``) into the ``.grad`` of the leaves it depends on; frees the graph unless
        ``retain_graph``."""
        if create_graph:
            raise NotImplementedError(
                "Tensor.backward: create_graph=True is not supported outside GradManagers; for "
                "higher-order gradients record with nested GradManagers (with gm1, gm2: ...)"
            )
        seed = y.backward_seed(_seed(y, gradient))
        node = y._node
        if node is None:
            root = (y, 0)  # a leaf: its gradient is the seed
        elif node._edges is None:
            raise RuntimeError(SECOND_BACKWARD)
        else:
            root = (node, y._out_idx)
        final: list = []
        try:
            with recording_for(()), autocast_off():
                run_backward([(root, seed)], EAGER, lambda t, g: final.append((t, g)),
                             retain=bool(retain_graph))
        except ConsumedGraphError:
            raise RuntimeError(SECOND_BACKWARD) from None
        for tensor, _ in final:
            if tensor._eager_grad and has_grad_hooks(tensor):
                raise RuntimeError(
                    f"Tensor.backward: a tensor of shape {tensor.shape} has gradient hooks "
                    "(register_grad_hook, e.g. DistributedDataParallel's all-reduce) that run only "
                    "in a GradManager's backward; record the step with a GradManager (with gm: "
                    "... gm.backward(loss))"
                )
        with recording_for(()):
            for tensor, grad in final:
                if not tensor._eager_grad:  # frozen since the graph was recorded
                    continue
                if not isinstance(grad, Tensor):
                    grad = Tensor._wrap(grad, tensor._device)
                tensor.grad = grad if tensor.grad is None else tensor.grad + grad


def _seed(y: Tensor, gradient):
    """The checked gradient a backward from ``y`` starts with (None: ones, ``y`` one element)."""
    if gradient is None:
        if y.size != 1:
            raise RuntimeError(
                f"Tensor.backward: grad can be implicitly created only for scalar outputs; this "
                f"tensor has shape {y.shape}, so pass gradient= (a tensor of that shape)"
            )
        return None
    if not isinstance(gradient, Tensor):
        gradient = Tensor(gradient, dtype=y.dtype, device=y.device)
    if gradient.shape != y.shape:
        raise RuntimeError(
            f"Tensor.backward: gradient has shape {gradient.shape} but the tensor has shape "
            f"{y.shape}"
        )
    return gradient


#: The one instance; ``EAGER`` holds it weakly, this module strongly.
AUTOGRAD = EagerAutograd()
EAGER.bind(AUTOGRAD)
