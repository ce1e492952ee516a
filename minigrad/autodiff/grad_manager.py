"""``GradManager``: MegEngine's tape.

``attach`` names the tensors that want gradients (held weakly) and per-tensor callbacks; ``record``
(or ``with gm:``) starts recording ops; ``backward`` walks the graph, calls each tensor's callbacks
as soon as its gradient is final, runs the after-backward callbacks (where the distributed
all-reduce flushes), accumulates into ``.grad`` and releases the recording.

Beyond MegEngine, for pipeline engines: ``backward(..., release=False)`` back-propagates one graph
and keeps recording, so several graphs (micro-batches) recorded in one ``with gm:`` are
back-propagated one by one, in any order; ``backward_input`` / ``backward_weight`` split one
backward into an input-gradient pass and a later weight-gradient pass (zero-bubble schedules).

Several managers (MegEngine's rules): a manager back-propagates only through what it recorded, and
it sees (records for higher-order gradients) the backward of the managers entered *after* it, not of
those entered before it; the managers of a group ``gm1 | gm2`` record together and do not see each
other's backward.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Callable

from minigrad.autodiff.autocast import autocast_off
from minigrad.autodiff.engine import (
    WeightPass,
    run_backward,
    run_backward_input,
    run_backward_weight,
)
from minigrad.autodiff.recording import EAGER_TAPE, STATE, Recording, recording_for
from minigrad.autodiff.tensor import Tensor, is_frozen, mark_attached
from minigrad.backend.dtypes import is_floating


class _WithRecords:
    """``with x:`` runs ``x.record()`` on entry and ``x.release()`` on exit."""

    def __enter__(self):
        self.record()
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


class GradManager(_WithRecords):
    """Records operations on attached tensors and computes their gradients.

    Example::

        gm = GradManager().attach(model.parameters(), callbacks=[allreduce_cb])
        with gm:
            loss = model(x).sum()
            gm.backward(loss)
    """

    def __init__(self):
        self._attached: dict[int, tuple[weakref.ref, list]] = {}
        self._recording: Recording | None = None
        self._backward_done = False
        self._after_backward: list[Callable[[], None]] = []
        self._extra_roots: list = []  # add_backward_root tensors not back-propagated yet
        self._offers_buffers = False  # some attached callback has ``grad_buffer``

    # -- attaching -------------------------------------------------------------------------------
    def attach(self, tensors, callbacks=None) -> "GradManager":
        """Attach float tensors (a Tensor or an iterable of them); callbacks are appended.

        A callback is ``cb(tensor, grad) -> grad``; a tensor's callbacks run in attach order as
        soon as its gradient is final, and what the last returns is accumulated into ``.grad``.
        The first function a tensor's gradient goes through (its first callback, else its first
        hook, see :func:`register_grad_hook`) may also have ``grad_buffer(tensor) -> array |
        None``: where the op producing the gradient may compute it (``Function.grad_buffer``).
        """
        if isinstance(tensors, Tensor):
            tensors = [tensors]
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        callbacks = list(callbacks)
        self._offers_buffers |= any(hasattr(cb, "grad_buffer") for cb in callbacks)
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"GradManager.attach: expected Tensors, got {type(t).__name__}")
            if not is_floating(t.dtype):
                raise TypeError(
                    f"GradManager.attach: only float tensors can have gradients, got dtype "
                    f"{t.dtype} (shape {t.shape})"
                )
            entry = self._attached.get(id(t))
            if entry is not None and entry[0]() is t:
                entry[1].extend(callbacks)
                continue
            key = id(t)
            ref = weakref.ref(t, lambda _r, key=key, att=self._attached: att.pop(key, None))
            self._attached[key] = (ref, list(callbacks))
            mark_attached(t)
        return self

    def attached_tensors(self) -> list:
        """The attached tensors that are still alive, in attach order."""
        return [t for t in (ref() for ref, _ in self._attached.values()) if t is not None]

    def detach(self, tensors) -> "GradManager":
        """Stop computing gradients for these tensors in this manager."""
        for t in [tensors] if isinstance(tensors, Tensor) else tensors:
            self._attached.pop(id(t), None)
        return self

    # -- recording -------------------------------------------------------------------------------
    def record(self) -> None:
        """Start recording the ops on attached tensors (``with gm:`` does this)."""
        self._start(STATE.next_level())

    def _start(self, level: int) -> None:
        if self._recording is not None:
            raise RuntimeError("GradManager.record: this manager is already recording")
        self._recording = Recording(self, level)
        self._backward_done = False
        self._extra_roots = []
        STATE.tape = STATE.tape + (self._recording,)
        STATE.recorders.append(self)

    def release(self) -> None:
        """Stop recording; every graph recorded only by this manager becomes dead (tensors from it
        are constants in later recordings)."""
        rec = self._recording
        if rec is None:
            return
        rec.active = False
        self._recording = None
        self._extra_roots = []
        self._after_backward = []
        STATE.tape = tuple(r for r in STATE.tape if r is not rec)
        STATE.recorders.remove(self)

    def __or__(self, other) -> "GradManagerGroup":
        if isinstance(other, (GradManager, GradManagerGroup)):
            return GradManagerGroup([self]) | other
        return NotImplemented

    @property
    def is_recording(self) -> bool:
        """Whether this manager is recording now."""
        return self._recording is not None

    def register_after_backward_callback(self, callback: Callable[[], None]) -> "GradManager":
        """Run ``callback()`` once, after the graph walk of the next ``backward`` (or
        ``backward_weight``), before gradients are accumulated into ``.grad`` (the distributed
        all-reduce flushes its buckets here)."""
        self._after_backward.append(callback)
        return self

    def add_backward_root(self, tensor: Tensor) -> None:
        """Make ``tensor`` (a recorded output) an extra root: its gradient (ones) is pulled back by
        the next ``backward()`` given no ``y``, or by the next backward that releases the
        recording. This is how ``dist.functional.remote_send`` gets the gradient of what it sent
        back from the receiving rank without the sender having a loss."""
        if self._recording is None:
            raise RuntimeError("GradManager.add_backward_root: the manager is not recording")
        self._extra_roots.append(tensor)

    # -- backward --------------------------------------------------------------------------------
    def backward(self, y=None, dy=None, *, release: bool = True) -> None:
        """Compute gradients of ``y`` (Tensor or list) w.r.t. the attached tensors; ``dy``
        defaults to ones. With no ``y`` the roots are the ``add_backward_root`` tensors (the
        recorded sends of a pipeline stage).

        ``release=True`` (MegEngine's behaviour) ends the recording: a second ``backward`` raises
        until the next ``record()``. ``release=False`` back-propagates only ``y``'s graph (and
        frees it) and keeps recording, so other graphs recorded in the same ``with gm:`` (e.g.
        other micro-batches) can be back-propagated later, in any order; gradients accumulate into
        ``.grad`` and callbacks fire on every backward. A graph can be back-propagated once.
        """
        rec = self._live_recording("backward")
        roots = self._roots(rec, "backward", y, dy, take_extra=release or y is None)
        try:
            offer = self._grad_buffer if self._offers_buffers or _offering_hooks else None
            self._leaf_pass(rec, lambda on_leaf: run_backward(roots, rec, on_leaf,
                                                              grad_buffer=offer))
        finally:
            if release:
                self._backward_done = True
                self.release()

    def backward_input(self, y=None, dy=None, inputs=()) -> "WeightGradHandle":
        """First half of a split backward (zero-bubble pipelines): the gradients of ``y`` with
        respect to ``inputs`` only, returned in ``handle.input_grads`` (one per input, None where
        none arrives; never accumulated into ``.grad``, no callbacks). Each op computes only the
        gradients on paths to ``inputs``; gradients do not flow through an input into what
        produced it. The rest of the graph stays alive for ``backward_weight(handle)``, which
        computes the attached tensors' gradients. Together they give bitwise the gradients of
        ``backward(y, dy)``. Neither releases the recording.

        Example::

            with gm:
                y = stage(x)                                   # x: the stage's input
                h = gm.backward_input(y, dy, inputs=[x])
                send(h.input_grads[0])                         # dx, to the previous stage
                gm.backward_weight(h)                          # later: the weights' .grad
        """
        rec = self._live_recording("backward_input")
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"GradManager.backward_input: inputs must be Tensors, got {type(t).__name__}"
                )
            if (t._node is None or t._node._tape is EAGER_TAPE) and not t._requires_grad:
                raise ValueError(
                    f"GradManager.backward_input: inputs[{i}] ({_describe(t)}) cannot receive a "
                    "gradient: it was neither attached to a GradManager nor computed by recorded "
                    "ops; attach it before computing with it"
                )
        roots = self._roots(rec, "backward_input", y, dy, take_extra=y is None)
        with self._backward_context(rec):
            grads, weight_pass = run_backward_input(roots, rec, inputs)
        return WeightGradHandle(self, rec, grads, weight_pass)

    def backward_weight(self, handle: "WeightGradHandle") -> None:
        """Second half of a split backward: the weight-gradient pass left by ``backward_input``.
        Fires the attached tensors' callbacks, runs the after-backward callbacks, accumulates into
        ``.grad`` and frees the rest of the graph. Runs once per handle; the recording that made
        the handle must still be active."""
        if not isinstance(handle, WeightGradHandle) or handle.manager is not self:
            raise ValueError(
                "GradManager.backward_weight: expected a handle returned by this manager's "
                "backward_input"
            )
        if handle.done:
            raise RuntimeError("GradManager.backward_weight: this handle's weight pass already ran")
        rec = handle._recording
        if rec is not self._recording:
            raise RuntimeError(
                "GradManager.backward_weight: the recording of this handle's backward_input has "
                "ended; run the weight pass before the recording ends"
            )
        handle.done = True
        self._leaf_pass(rec, lambda on_leaf: run_backward_weight(handle._weight_pass, on_leaf))

    def _live_recording(self, op: str) -> Recording:
        rec = self._recording
        if rec is None:
            if self._backward_done:
                raise RuntimeError(
                    f"GradManager.{op}: backward was already called in this recording; "
                    "record again (with gm: ...) for another backward, or pass release=False"
                )
            raise RuntimeError(f"GradManager.{op}: the manager is not recording (use `with gm:`)")
        return rec

    def _roots(self, rec: Recording, op: str, y, dy, take_extra: bool) -> list:
        """``((target, idx), grad)`` roots for the engine: ``y`` and, when ``take_extra``, the
        ``add_backward_root`` tensors. Raises for a ``y`` whose recording has ended or whose
        graph an earlier backward consumed; skips a ``y`` that depends on nothing this manager
        recorded."""
        ys = [] if y is None else ([y] if isinstance(y, Tensor) else list(y))
        if dy is None:
            dys = [None] * len(ys)
        else:
            dys = [dy] if isinstance(dy, Tensor) or not isinstance(dy, (list, tuple)) else list(dy)
            if len(dys) != len(ys):
                raise ValueError(f"GradManager.{op}: got {len(ys)} y but {len(dys)} dy")
        given = {id(t) for t in ys}
        if take_extra:
            extra = [t for t in self._extra_roots if id(t) not in given]
            ys, dys = ys + extra, dys + [None] * len(extra)
            self._extra_roots = []
        else:
            self._extra_roots = [t for t in self._extra_roots if id(t) not in given]
        if not ys:
            raise RuntimeError(
                f"GradManager.{op}: no y given and nothing recorded to start from "
                "(pass a loss, or record a remote_send)"
            )
        roots = []
        for t, g in zip(ys, dys):
            if not isinstance(t, Tensor):
                raise TypeError(f"GradManager.{op}: y must be Tensors, got {type(t).__name__}")
            g = t.backward_seed(None if g is None else _as_grad(g, t, op))
            node = t._node
            if node is not None and rec in node._tape:
                if node._edges is None or (rec.consumed is not None and node in rec.consumed):
                    raise RuntimeError(
                        f"GradManager.{op}: the graph of {_describe(t)} was already "
                        "back-propagated by an earlier backward (each graph can be back-propagated "
                        "once)"
                    )
                roots.append(((node, t._out_idx), g))
            elif node is not None and not node.is_live:
                raise RuntimeError(
                    f"GradManager.{op}: {_describe(t)} belongs to a graph whose recording has "
                    "ended; back-propagate inside the recording that computed it (with gm: ...)"
                )
            elif self._is_attached(t):
                roots.append(((t, 0), g))
            # else: y depends on nothing this manager recorded, so it contributes no gradients
        return roots

    def _is_attached(self, t: Tensor) -> bool:
        entry = self._attached.get(id(t))
        return entry is not None and entry[0]() is t

    def _grad_buffer(self, tensor):
        """The engine's ``grad_buffer``: the array that the first function ``tensor``'s gradient
        goes through (its first callback here, else its first hook) offers to hold it (its
        ``grad_buffer(tensor)``), or None."""
        entry = self._attached.get(id(tensor))
        if entry is None or entry[0]() is not tensor or is_frozen(tensor):
            return None
        first = entry[1][0] if entry[1] else None
        if first is None:
            hooks = _GRAD_HOOKS.get(id(tensor))
            if hooks is None or hooks[0]() is not tensor or not hooks[1]:
                return None
            first = hooks[1][0]
        offer = getattr(first, "grad_buffer", None)
        return None if offer is None else offer(tensor)

    def _leaf_pass(self, rec: Recording, run) -> None:
        """Run ``run(on_leaf)`` (a pass that reaches the attached tensors) inside this manager's
        backward context, then the after-backward callbacks, then accumulate into ``.grad``."""
        final: list = []

        def on_leaf(tensor, grad):
            entry = self._attached.get(id(tensor))
            if entry is None or entry[0]() is not tensor or is_frozen(tensor):
                return
            for cb in entry[1]:
                grad = cb(tensor, grad)
            hooks = _GRAD_HOOKS.get(id(tensor))
            if hooks is not None and hooks[0]() is tensor:
                for hook in hooks[1]:
                    grad = hook(tensor, grad)
            final.append((tensor, grad))

        with self._backward_context(rec):
            run(on_leaf)
            callbacks, self._after_backward = self._after_backward, []
            for cb in callbacks:
                cb()
            for tensor, grad in final:
                if not isinstance(grad, Tensor):
                    grad = Tensor._wrap(grad, tensor._device)
                tensor.grad = grad if tensor.grad is None else tensor.grad + grad

    @contextlib.contextmanager
    def _backward_context(self, rec: Recording):
        """While a pass runs: ``get_backwarding_grad_manager()`` is this manager, and ops are
        recorded only for the managers that see this backward (entered before it), and autocast
        is off (gradient ops run in the dtypes of the recorded forward)."""
        STATE.backwarding.append(self)
        try:
            with recording_for(tuple(r for r in STATE.tape if r.level < rec.level)), \
                    autocast_off():
                yield
        finally:
            STATE.backwarding.pop()

    def __repr__(self) -> str:
        names = []
        for _, callbacks in self._attached.values():
            for cb in callbacks:
                name = getattr(cb, "__qualname__", type(cb).__name__)
                if name not in names:
                    names.append(name)
        return (
            f"GradManager(attached={len(self.attached_tensors())}, "
            f"recording={self.is_recording}, callbacks={names})"
        )


class GradManagerGroup(_WithRecords):
    """Managers that record together as peers (MegEngine's ``gm1 | gm2``): entering the group
    records all of them at one visibility level, so none sees the others' backward.

    Example::

        with gm1 | gm2:
            y = F.cos(x)
            gm1.backward(y)  # each manager back-propagates the shared graph once
            gm2.backward(y)
    """

    def __init__(self, managers):
        self.managers = list(managers)

    def __or__(self, other) -> "GradManagerGroup":
        if isinstance(other, GradManager):
            return GradManagerGroup(self.managers + [other])
        if isinstance(other, GradManagerGroup):
            return GradManagerGroup(self.managers + other.managers)
        return NotImplemented

    def __ror__(self, other) -> "GradManagerGroup":
        if isinstance(other, GradManager):
            return GradManagerGroup([other] + self.managers)
        return NotImplemented

    def record(self) -> None:
        """Start recording with every manager of the group (at one shared visibility level)."""
        level = STATE.next_level()
        started = []
        try:
            for gm in self.managers:
                gm._start(level)
                started.append(gm)
        except BaseException:
            for gm in reversed(started):
                gm.release()
            raise

    def release(self) -> None:
        """Stop recording with every manager of the group."""
        for gm in reversed(self.managers):
            gm.release()

    def backward(self, y=None, dy=None) -> None:
        """``gm.backward(y, dy)`` for each manager in turn (each releases its recording)."""
        for gm in self.managers:
            gm.backward(y, dy)

    def __repr__(self) -> str:
        return f"GradManagerGroup({self.managers})"


class WeightGradHandle:
    """What ``GradManager.backward_input`` returns: ``input_grads`` (one Tensor or None per input)
    and the weight pass still to run with ``gm.backward_weight(handle)`` (``done`` once it ran)."""

    def __init__(self, manager: GradManager, recording: Recording, input_grads,
                 weight_pass: WeightPass):
        self.manager = manager
        self.input_grads = tuple(input_grads)
        self.done = False
        self._recording = recording
        self._weight_pass = weight_pass

    def __repr__(self) -> str:
        return f"WeightGradHandle(inputs={len(self.input_grads)}, done={self.done})"


def _describe(t: Tensor) -> str:
    """``tensor 'name' of shape (2, 3) and dtype float32``, for error messages."""
    named = f" {t.name!r}" if t.name else ""
    return f"tensor{named} of shape {t.shape} and dtype {t.dtype}"


def _as_grad(g, like: Tensor, op: str) -> Tensor:
    if not isinstance(g, Tensor):
        g = Tensor(g, dtype=like.dtype, device=like.device)
    if g.shape != like.shape:
        raise ValueError(f"GradManager.{op}: dy shape {g.shape} != y shape {like.shape}")
    return g


def get_backwarding_grad_manager():
    """The GradManager whose ``backward`` is running now (None outside backward)."""
    return STATE.backwarding[-1] if STATE.backwarding else None


_GRAD_HOOKS: dict[int, tuple[weakref.ref, list]] = {}
_offering_hooks = False  # True once a hook with ``grad_buffer`` was registered


class GradHookHandle:
    """Returned by ``register_grad_hook``; ``remove()`` unregisters the hook."""

    def __init__(self, key, hook):
        self._key, self._hook = key, hook

    def remove(self) -> None:
        """Stop calling the hook."""
        entry = _GRAD_HOOKS.get(self._key)
        if entry is not None and self._hook in entry[1]:
            entry[1].remove(self._hook)


def has_grad_hooks(tensor) -> bool:
    """Whether ``register_grad_hook`` hooks (not all removed) wait for ``tensor``'s gradient: a
    backward that cannot run them (eager autograd's) must refuse rather than skip them."""
    entry = _GRAD_HOOKS.get(id(tensor))
    return entry is not None and entry[0]() is tensor and bool(entry[1])


def register_grad_hook(tensor, hook: Callable) -> GradHookHandle:
    """Run ``hook(tensor, grad) -> grad`` whenever any GradManager finalises ``tensor``'s gradient,
    after that manager's own callbacks (how ``DistributedDataParallel`` syncs gradients without
    the user attaching a callback). Returns a handle with ``remove()``. A hook may offer where
    the gradient is computed, as a callback may (``grad_buffer``, see ``GradManager.attach``)."""
    global _offering_hooks
    _offering_hooks = _offering_hooks or hasattr(hook, "grad_buffer")
    key = id(tensor)
    entry = _GRAD_HOOKS.get(key)
    if entry is None or entry[0]() is not tensor:
        ref = weakref.ref(tensor, lambda _r, key=key: _GRAD_HOOKS.pop(key, None))
        entry = _GRAD_HOOKS[key] = (ref, [])
    entry[1].append(hook)
    return GradHookHandle(key, hook)
