"""``Function``: the one op API. Every differentiable op (built-in or user-defined) subclasses it.

``forward`` receives the inputs as given (Tensors and Python constants) and returns backend arrays
or Tensors; it never records. ``backward`` receives one gradient Tensor per output and returns one
gradient (Tensor, array or None) per input. Because backward is written with Tensor ops, it is
itself recorded when an outer GradManager is still recording: that is how second-order gradients
work. Whatever an op stores on ``self`` for backward is dropped as soon as backward has run.

Example::

    class Square(ad.Function):
        def forward(self, x):
            self.x = x
            return x * x
        def backward(self, dy):
            return 2 * self.x * dy
"""

from __future__ import annotations

from minigrad.autodiff.state import STATE


class Function:
    # Bookkeeping lives in slots; everything an op saves for backward lives in __dict__, which the
    # engine clears after running backward (that is what frees intermediate buffers).
    __slots__ = ("_edges", "_in_meta", "_seq", "_epoch", "_n_out", "__dict__", "__weakref__")

    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented")

    def backward(self, *grads):
        raise NotImplementedError(f"{type(self).__name__}.backward is not implemented")

    def needs_input_grad(self, i: int) -> bool:
        """Inside ``backward``: whether input ``i`` leads to anything that wants a gradient, so an
        op can skip products nobody uses (e.g. the input gradient of a network's first layer)."""
        edges = self._edges
        return edges is None or edges[i] is not None

    def __call__(self, *inputs):
        Tensor = _tensor_class()
        state = STATE
        may_record = state.recording > 0 and state.enabled
        record = False
        device = first = None
        for x in inputs:
            if isinstance(x, Tensor):
                if device is None:
                    device, first = x._device, x
                elif x._device is not device and x._device != device:
                    raise RuntimeError(
                        f"{type(self).__name__}: inputs are on different devices: {first.shape} "
                        f"{first.dtype} on {device} and {x.shape} {x.dtype} on {x._device}; "
                        "move them with .to(device) first"
                    )
                if may_record and not record:
                    node = x._node
                    record = x._requires_grad or (node is not None and node._epoch == state.epoch)
        if device is None:
            from minigrad.backend.device import get_default_device_obj  # noqa: PLC0415

            device = get_default_device_obj()
        if may_record:  # a user-defined forward written with Tensor ops must not record itself
            state.enabled = False
            try:
                out = self.forward(*inputs)
            finally:
                state.enabled = True
        else:
            out = self.forward(*inputs)
        if type(out) is tuple:
            outs = tuple(Tensor._wrap(o._data if isinstance(o, Tensor) else o, device) for o in out)
            if record:
                self._record(inputs, outs)
            return outs
        y = Tensor._wrap(out._data if isinstance(out, Tensor) else out, device)
        if record:
            self._record(inputs, (y,))
        return y

    def _record(self, inputs, outputs):
        Tensor = _tensor_class()
        state = STATE
        epoch = state.epoch
        edges = []
        meta = []
        for x in inputs:
            if isinstance(x, Tensor) and x._data.dtype.kind == "f":
                node = x._node
                if node is not None and node._epoch == epoch:
                    edges.append((node, x._out_idx))
                else:
                    edges.append((x, 0) if x._requires_grad else None)
                meta.append((x._data.shape, x._data.dtype, x._device))
            else:
                edges.append(None)
                meta.append(None)
        self._edges = edges
        self._in_meta = meta
        state.seq += 1
        self._seq = state.seq
        self._epoch = epoch
        self._n_out = len(outputs)
        if len(outputs) > 1:  # the engine fills a missing output gradient with zeros of this meta
            self._out_meta = [(t._data.shape, t._data.dtype, t._device) for t in outputs]
        for i, t in enumerate(outputs):
            if t._data.dtype.kind == "f":
                t._node = self
                t._out_idx = i

    def _free(self):
        """Drop everything saved for backward and the edges into the graph."""
        self.__dict__.clear()
        self._edges = None


_TENSOR = []


def _tensor_class():
    """``minigrad.tensor.Tensor``, imported on first use (tensor.py imports this package)."""
    if not _TENSOR:
        from minigrad.tensor import Tensor  # noqa: PLC0415

        _TENSOR.append(Tensor)
    return _TENSOR[0]
