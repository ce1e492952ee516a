"""``GradManager``: MegEngine's tape.

``attach`` names the tensors that want gradients (held weakly) and per-tensor callbacks; ``record``
(or ``with gm:``) starts recording ops; ``backward`` walks the graph, calls each tensor's callbacks
as soon as its gradient is final, runs the after-backward callbacks (where the distributed
all-reduce flushes), accumulates into ``.grad`` and releases the recording.
"""

from __future__ import annotations

import weakref
from typing import Callable

from minigrad.autodiff.engine import run_backward
from minigrad.autodiff.state import STATE


class GradManager:
    """Records operations on attached tensors and computes their gradients.

    Example::

        gm = GradManager().attach(model.parameters(), callbacks=[allreduce_cb])
        with gm:
            loss = model(x).sum()
            gm.backward(loss)
    """

    def __init__(self):
        self._attached: dict[int, tuple[weakref.ref, list]] = {}
        self._recording = False
        self._backward_done = False
        self._after_backward: list[Callable[[], None]] = []
        self._roots: list = []  # extra roots registered while recording (remote_send tokens)

    # -- attaching -------------------------------------------------------------------------------
    def attach(self, tensors, callbacks=None) -> "GradManager":
        """Attach float tensors (a Tensor or an iterable of them); callbacks are appended."""
        from minigrad.tensor import Tensor  # noqa: PLC0415

        if isinstance(tensors, Tensor):
            tensors = [tensors]
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        callbacks = list(callbacks)
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"GradManager.attach: expected Tensors, got {type(t).__name__}")
            if t.dtype.kind != "f":
                raise TypeError(
                    "GradManager.attach: only float tensors can have gradients, got dtype "
                    f"{t.dtype} "
                    f"(shape {t.shape})"
                )
            entry = self._attached.get(id(t))
            if entry is not None and entry[0]() is t:
                entry[1].extend(callbacks)
                continue
            key = id(t)
            ref = weakref.ref(t, lambda _r, key=key, att=self._attached: att.pop(key, None))
            self._attached[key] = (ref, list(callbacks))
            t._requires_grad = True
        return self

    def attached_tensors(self) -> list:
        """The attached tensors that are still alive, in attach order."""
        return [t for t in (ref() for ref, _ in self._attached.values()) if t is not None]

    def detach(self, tensors) -> "GradManager":
        """Stop computing gradients for these tensors in this manager."""
        from minigrad.tensor import Tensor  # noqa: PLC0415

        for t in [tensors] if isinstance(tensors, Tensor) else tensors:
            self._attached.pop(id(t), None)
        return self

    # -- recording -------------------------------------------------------------------------------
    def record(self) -> None:
        if self._recording:
            raise RuntimeError("GradManager.record: this manager is already recording")
        self._recording = True
        self._backward_done = False
        self._roots = []
        STATE.recording += 1
        STATE.recorders.append(self)

    def release(self) -> None:
        if not self._recording:
            return
        self._recording = False
        self._roots = []
        self._after_backward = []
        STATE.recording -= 1
        STATE.recorders.remove(self)
        if STATE.recording == 0:
            STATE.epoch += 1  # every node recorded so far is now dead

    def __enter__(self) -> "GradManager":
        self.record()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    @property
    def is_recording(self) -> bool:
        return self._recording

    def register_after_backward_callback(self, callback: Callable[[], None]) -> "GradManager":
        """Run ``callback()`` once after the graph walk of the current ``backward``, before grads
        are accumulated into ``.grad`` (the distributed all-reduce flushes its buckets here)."""
        self._after_backward.append(callback)
        return self

    def _add_root(self, tensor) -> None:
        """Make ``tensor`` an extra root of the next backward (used by ``remote_send``)."""
        self._roots.append(tensor)

    # -- backward --------------------------------------------------------------------------------
    def backward(self, y=None, dy=None) -> None:
        """Compute gradients of ``y`` (Tensor or list) w.r.t. the attached tensors.

        ``dy`` defaults to ones. With no ``y`` the roots are the recorded sends (pipeline stages).
        """
        from minigrad.tensor import Tensor  # noqa: PLC0415

        if not self._recording:
            if self._backward_done:
                raise RuntimeError(
                    "GradManager.backward: backward was already called in this recording; "
                    "record again (with gm: ...) for another backward"
                )
            raise RuntimeError(
                "GradManager.backward: the manager is not recording (use `with gm:`)"
            )
        ys = [] if y is None else ([y] if isinstance(y, Tensor) else list(y))
        if dy is None:
            dys = [None] * len(ys)
        else:
            dys = [dy] if isinstance(dy, Tensor) or not isinstance(dy, (list, tuple)) else list(dy)
            if len(dys) != len(ys):
                raise ValueError(f"GradManager.backward: got {len(ys)} y but {len(dys)} dy")
        ys += self._roots
        dys += [None] * len(self._roots)
        if not ys:
            raise RuntimeError(
                "GradManager.backward: no y given and nothing recorded to start from "
                "(pass a loss, or record a remote_send)"
            )

        roots, root_grads = [], []
        for t, g in zip(ys, dys):
            g = t._ones_like() if g is None else _as_grad(g, t)
            node = t._node
            if node is not None and node._epoch == STATE.epoch:
                roots.append((node, t._out_idx))
            elif id(t) in self._attached:
                roots.append((t, 0))
            else:
                continue  # y does not depend on anything recorded: no gradients
            root_grads.append(g)

        final: list = []

        def on_leaf(tensor, grad):
            entry = self._attached.get(id(tensor))
            if entry is None or entry[0]() is not tensor:
                return
            for cb in entry[1]:
                grad = cb(tensor, grad)
            hooks = _GRAD_HOOKS.get(id(tensor))
            if hooks is not None and hooks[0]() is tensor:
                for hook in hooks[1]:
                    grad = hook(tensor, grad)
            final.append((tensor, grad))

        keep_graph = STATE.recording > 1  # an outer manager still needs this graph
        prev_enabled = STATE.enabled
        STATE.enabled = keep_graph  # record backward ops only for an outer manager (2nd order)
        STATE.backwarding.append(self)
        try:
            run_backward(roots, root_grads, on_leaf, keep_graph)
            for cb in self._after_backward:
                cb()
            for tensor, grad in final:
                if not isinstance(grad, Tensor):
                    grad = Tensor._wrap(grad, tensor._device)
                tensor.grad = grad if tensor.grad is None else tensor.grad + grad
        finally:
            STATE.backwarding.pop()
            STATE.enabled = prev_enabled
            self._backward_done = True
            self.release()


def _as_grad(g, like):
    from minigrad.tensor import Tensor  # noqa: PLC0415

    if isinstance(g, Tensor):
        if g.shape != like.shape:
            raise ValueError(f"GradManager.backward: dy shape {g.shape} != y shape {like.shape}")
        return g
    return Tensor(g, dtype=like.dtype, device=like.device)


def get_backwarding_grad_manager():
    """The GradManager whose ``backward`` is running now (None outside backward)."""
    return STATE.backwarding[-1] if STATE.backwarding else None


_GRAD_HOOKS: dict[int, tuple[weakref.ref, list]] = {}


class _HookHandle:
    def __init__(self, key, hook):
        self._key, self._hook = key, hook

    def remove(self) -> None:
        entry = _GRAD_HOOKS.get(self._key)
        if entry is not None and self._hook in entry[1]:
            entry[1].remove(self._hook)


def register_grad_hook(tensor, hook: Callable) -> _HookHandle:
    """Run ``hook(tensor, grad) -> grad`` whenever any GradManager finalises ``tensor``'s gradient,
    after that manager's own callbacks (how ``DistributedDataParallel`` syncs gradients without
    the user attaching a callback). Returns a handle with ``remove()``."""
    key = id(tensor)
    entry = _GRAD_HOOKS.get(key)
    if entry is None or entry[0]() is not tensor:
        ref = weakref.ref(tensor, lambda _r, key=key: _GRAD_HOOKS.pop(key, None))
        entry = _GRAD_HOOKS[key] = (ref, [])
    entry[1].append(hook)
    return _HookHandle(key, hook)
