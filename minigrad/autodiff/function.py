"""``Function``: the one op API. Every differentiable op (built-in or user-defined) subclasses it.

``forward`` receives the inputs as given (Tensors and Python constants) and returns backend arrays
or Tensors (a tuple of them for several outputs); it never records. ``backward`` receives one
gradient per output (``None`` for an output that received none) and returns one gradient per input:
a Tensor, a backend array or ``None``. Because backward is written with Tensor ops, it is itself
recorded when a manager that sees this backward is recording: that is how second-order gradients
work. Whatever an op stores on ``self`` for backward is dropped once the graph is done with it.

Devices: an op runs on the device of its Tensor inputs (all the same one). On a GPU, ``forward``
runs with that GPU made CUDA's current device (CuPy launches every kernel and allocates every array
on the current device), and the backward engine does the same for ``backward``; on the CPU this
costs one comparison. Array outputs are placed on that device; a Tensor returned by ``forward``
keeps its own device (``Copy``'s output lives on the target device).

Calling a Function records a graph node when a GradManager is recording and some input needs a
gradient (or, for a ``records_always`` op, whenever a GradManager is recording): the node keeps one
*edge* per input (the producing node and output index, the attached leaf tensor, or None), the
shape, dtype and device of each input that has an edge (None for the others), a creation number
``_seq`` (a topological order) and the tape of recordings it belongs to (see
``minigrad.autodiff.recording``). ``call_pair(x, y)`` is the same call for two Tensors with the
input loop unrolled, which the binary arithmetic operators take.

Outside every GradManager (recording enabled, ``STATE.tape`` empty), a call whose inputs include
a tensor with ``_eager_grad`` (a trainable parameter, a tensor given ``requires_grad=True``, the
output of such a call) is recorded for ``EAGER_TAPE`` instead (eager autograd, see
``minigrad.autodiff.eager``): its edges go to the inputs' eager nodes and ``_eager_grad`` leaves,
and its float outputs get ``_eager_grad``. Only the outputs hold such a node, so the graph lives as
long as they do. Finding out costs one attribute read per tensor input.

Dispatch seam (global tensors): a tensor class may set a class-level ``__minigrad_dispatch__``
(``None`` on ``Tensor``). When an input carries one, the call is handed to it,
``dispatch(function, inputs)``, which runs the op its own way (``minigrad.distributed.
global_tensor`` boxes the inputs and calls the function again on this rank's plain local pieces).
The hot path pays one attribute check per tensor input; this layer never imports the dispatcher.
"""

from __future__ import annotations

from minigrad import seams
from minigrad.autodiff.recording import EAGER_TAPE, STATE, shares_recording
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device import get_default_device_obj
from minigrad.backend.dtypes import is_floating


class Function:
    """Base class of differentiable ops: subclass it, write ``forward`` and ``backward``, call an
    instance on the inputs (one instance per call).

    Example::

        class Square(ad.Function):
            def forward(self, x):
                self.x = x          # saved for backward, freed after it
                return x * x
            def backward(self, dy):
                return 2 * self.x * dy

        y = Square()(x)
    """

    # Bookkeeping lives in slots; everything an op saves for backward lives in __dict__, which the
    # engine clears once no backward pass needs the node any more (that frees the buffers).
    __slots__ = ("_edges", "_in_meta", "_seq", "_tape", "_n_out", "_wanted", "_offer",
                 "__dict__", "__weakref__")

    #: False for the few functions that take a dispatching tensor itself as an input and work on
    #: its local data (the global-tensor layer's own view op): their calls are never dispatched.
    dispatches = True

    #: True for ops every rank must see in backward even where no input of this rank needs a
    #: gradient (the differentiable collectives): recorded whenever a GradManager is recording.
    records_always = False

    def forward(self, *inputs):
        """Compute the outputs from the inputs (arrays or Tensors; a tuple for several outputs)."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def backward(self, *grads):
        """Gradients of the inputs (one per input, None where there is none) given one gradient
        per output (None for an output that received no gradient). Must not modify ``grads``
        in place: a split backward hands the same gradients to this node twice."""
        raise NotImplementedError(f"{type(self).__name__}.backward is not implemented")

    def needs_input_grad(self, i: int) -> bool:
        """Inside ``backward``: whether the running backward pass wants the gradient of input
        ``i``, so an op can skip products nobody uses (the input gradient of a network's first
        layer; the weight gradients during ``GradManager.backward_input``)."""
        wanted = getattr(self, "_wanted", None)
        if wanted is not None:
            return wanted[i]
        edges = self._edges
        return edges is None or edges[i] is not None

    def grad_buffer(self, i: int, shape, dtype):
        """Inside ``backward``: an array of ``shape`` and ``dtype`` to compute the gradient of
        input ``i`` into (``out=``), or None. The engine offers one when input ``i`` is a leaf
        awaiting its last gradient contribution and the first function its gradient goes through
        (a GradManager callback, else a gradient hook) keeps gradients in a buffer of its own
        (data parallelism's gradient bucket, see ``make_allreduce_cb``): the product then lands
        where the all-reduce reads it instead of being copied there. Writing the gradient
        elsewhere is always correct."""
        offer = getattr(self, "_offer", None)
        if offer is None or not self.needs_input_grad(i):
            return None
        out = offer(self, i)
        if out is None or out.shape != tuple(shape) or out.dtype != dtype:
            return None
        return out

    @property
    def is_live(self) -> bool:
        """Whether a recording this node belongs to is still active (its graph can be used)."""
        return any(r.active for r in self._tape)

    def __call__(self, *inputs):
        state = STATE
        tape = state.tape
        may_record = state.enabled and tape
        record = may_record and self.records_always
        edges = [] if may_record else None  # built in the same pass, used if this call records
        meta = [] if may_record else None
        device = None
        eager = False  # some input wants eager autograd (read only when no GradManager records)
        for x in inputs:
            if isinstance(x, Tensor):
                if x.__minigrad_dispatch__ is not None and self.dispatches:
                    return x.__minigrad_dispatch__(self, inputs)
                x_device = x._device
                if device is None:
                    device = x_device
                elif x_device is not device and x_device != device:
                    raise self._device_mismatch(inputs)
                if may_record:
                    edge = _edge(x, tape)
                    edges.append(edge)
                    if edge is None:  # a constant: no metadata (only edges use it)
                        meta.append(None)
                    else:
                        record = True
                        meta.append((x._data.shape, x._data.dtype, x_device))
                    continue
                if x._eager_grad:
                    eager = True
            if may_record:
                edges.append(None)
                meta.append(None)
        if eager and state.enabled:
            tape = EAGER_TAPE
            edges, meta = _eager_edges(inputs)
            may_record = record = True
        if device is None:
            device = get_default_device_obj()
        if device.kind != "cpu":
            out = self._forward_on(device, inputs, may_record)
        elif may_record:  # a user-defined forward written with Tensor ops must not record itself
            state.enabled = False
            try:
                out = self.forward(*inputs)
            finally:
                state.enabled = True
        else:
            out = self.forward(*inputs)
        return self._outputs(out, device, edges, meta, tape if record else None)

    def call_pair(self, x: Tensor, y: Tensor):
        """``self(x, y)`` for two Tensors on one device (the caller checked ``x._device is
        y._device``): the same outputs and node. A GradManager recording on the CPU without
        dispatching tensors is handled here with the input loop of :meth:`__call__` unrolled for
        two inputs; every other case goes to ``self(x, y)``. The binary arithmetic operators call
        it: a recorded ``a + b`` of 4-element tensors takes 1.33-1.40 instead of 1.59-1.66 us
        (AMD EPYC, Python 3.11; NumPy's own add 0.2 us of it)."""
        state = STATE
        tape = state.tape
        device = x._device
        if (not (state.enabled and tape) or device.kind != "cpu"
                or x.__minigrad_dispatch__ is not None or y.__minigrad_dispatch__ is not None):
            return self(x, y)
        ex, ey = _edge(x, tape), _edge(y, tape)
        edges = [ex, ey]
        meta = [None if ex is None else (x._data.shape, x._data.dtype, device),
                None if ey is None else (y._data.shape, y._data.dtype, device)]
        state.enabled = False  # a forward written with Tensor ops must not record itself
        try:
            out = self.forward(x, y)
        finally:
            state.enabled = True
        record = ex is not None or ey is not None or self.records_always
        return self._outputs(out, device, edges, meta, tape if record else None)

    def _outputs(self, out, device, edges, meta, tape):
        """The Tensors of what ``forward`` returned (one, or a tuple), on ``device`` except
        Tensors that say otherwise (``Copy``'s), made outputs of this node when ``tape`` is not
        None (the float ones: only they get gradients)."""
        if type(out) is not tuple:
            y = _wrap(out._data, out._device) if isinstance(out, Tensor) else _wrap(out, device)
            if tape is not None:
                self._record(edges, meta, tape, 1)
                if y._data.dtype.kind == "f" or is_floating(y._data.dtype):
                    y._node, y._eager_grad = self, tape is EAGER_TAPE  # _out_idx is 0 (_wrap)
            return y
        outs = tuple(_wrap(o._data, o._device) if isinstance(o, Tensor)
                     else _wrap(o, device) for o in out)
        if tape is not None:
            self._record(edges, meta, tape, len(outs))
            for i, t in enumerate(outs):
                if t._data.dtype.kind == "f" or is_floating(t._data.dtype):
                    t._node, t._out_idx, t._eager_grad = self, i, tape is EAGER_TAPE
        return outs

    def _device_mismatch(self, inputs) -> RuntimeError:
        """The error for inputs on different devices, naming the first two that differ."""
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        first = tensors[0]
        other = next(t for t in tensors if t._device != first._device)
        return RuntimeError(
            f"{type(self).__name__}: inputs are on different devices: {first.shape} "
            f"{first.dtype} on {first._device} and {other.shape} {other.dtype} on "
            f"{other._device}; move them with .to(device) first"
        )

    def _forward_on(self, device, inputs, may_record):
        """``forward`` with ``device`` (a GPU) made current, so that every kernel it launches and
        every array it allocates is on the inputs' GPU (CuPy works on the current device)."""
        with device.context():
            if not may_record:
                return self.forward(*inputs)
            STATE.enabled = False
            try:
                return self.forward(*inputs)
            finally:
                STATE.enabled = True

    def _record(self, edges, meta, tape, n_out: int):
        """Make this call a node of the graph recorded for ``tape`` (``STATE.tape``, or
        ``EAGER_TAPE``), with the inputs' edges and metadata that ``__call__`` collected and
        ``n_out`` outputs (which ``__call__`` then points at this node: its float ones)."""
        state = STATE
        self._edges = edges
        self._in_meta = meta
        self._seq = state.seq = state.seq + 1
        self._tape = tape
        self._n_out = n_out

    def _free(self):
        """Drop everything saved for backward and the edges into the graph."""
        self.__dict__.clear()
        self._edges = None


_wrap = Tensor._wrap  # looked up once


def _edge(x: Tensor, tape: tuple):
    """The edge of input ``x`` of a call recorded for ``tape`` (see :meth:`Function.__call__`):
    its producing node and output index while that node belongs to a graph ``tape`` records,
    else ``(x, 0)`` for a tensor attached to a GradManager, else None (a constant, a non-float
    tensor: only float inputs get gradients, bfloat16 being kind "V", hence the second test)."""
    dtype = x._data.dtype
    if dtype.kind != "f" and not is_floating(dtype):
        return None
    node = x._node
    if node is not None and (node._tape is tape or shares_recording(node._tape, tape)):
        return (node, x._out_idx)
    return (x, 0) if x._requires_grad else None


def _eager_edges(inputs) -> tuple[list, list]:
    """The edges and input metadata of a call recorded for ``EAGER_TAPE``: an input produced by an
    eagerly recorded op leads to that node, a leaf with ``_eager_grad`` to itself, anything else
    nowhere (a constant)."""
    edges, meta = [], []
    for x in inputs:
        if isinstance(x, Tensor):
            data = x._data
            if data.dtype.kind == "f" or is_floating(data.dtype):
                node = x._node
                if node is not None and node._tape is EAGER_TAPE:
                    edges.append((node, x._out_idx))
                elif x._eager_grad and node is None:
                    edges.append((x, 0))
                else:
                    edges.append(None)
                    meta.append(None)
                    continue
                meta.append((data.shape, data.dtype, x._device))
                continue
        edges.append(None)
        meta.append(None)
    return edges, meta


def dispatches(operands) -> bool:
    """Whether an operand runs ops its own way (a global tensor, see ``Function.__call__``): the
    ops without a gradient then go through a Function; otherwise they skip that machinery."""
    for x in operands:
        if isinstance(x, Tensor) and x.__minigrad_dispatch__ is not None:
            return True
    return False


# -- tracing (the profiler): a traced ``__call__`` is swapped in only while a tracer is set, so an
# untraced op pays nothing for it
_untraced_call = Function.__call__


def _traced_call(self, *inputs):
    return seams.TRACER.value.op(self, inputs, _untraced_call)


def _use_tracer(tracer) -> None:
    Function.__call__ = _untraced_call if tracer is None else _traced_call


seams.TRACER.watch(_use_tracer)
