"""Recurrent layers: ``RNNCell``, ``LSTMCell`` (one time step) and ``RNN``, ``LSTM`` (a stack of
layers run over a whole sequence, optionally in both directions).

The layouts are MegEngine's (and PyTorch's): a cell holds ``weight_ih`` ``(gates * hidden,
input)``, ``weight_hh`` ``(gates * hidden, hidden)`` and the biases ``bias_ih``, ``bias_hh``
``(gates * hidden,)``; LSTM gates are stacked in the order input, forget, cell, output. Every
weight starts uniform in ``±1/sqrt(hidden_size)``. The loops are plain tensor ops, so gradients
(and second-order gradients) come from the autodiff engine.

Example::

    lstm = M.LSTM(input_size=10, hidden_size=20, num_layers=2)
    out, (h_n, c_n) = lstm(x)          # x: (seq_len, batch, 10); out: (seq_len, batch, 20)
"""

from __future__ import annotations

import math

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.module import init
from minigrad.module.module import Module

_NONLINEARITIES = {"tanh": F.tanh, "relu": F.relu}


class _CellBase(Module):
    """The weights of one recurrent cell with ``gates`` stacked gates, and their initialisation."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.bias = bool(bias)
        rows = self.gates * self.hidden_size
        self.weight_ih = Parameter(np.zeros((rows, self.input_size), np.float32))
        self.weight_hh = Parameter(np.zeros((rows, self.hidden_size), np.float32))
        if self.bias:
            self.bias_ih = Parameter(np.zeros(rows, np.float32))
            self.bias_hh = Parameter(np.zeros(rows, np.float32))
        else:
            self.bias_ih = self.bias_hh = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias uniform in ``±1/sqrt(hidden_size)`` (MegEngine's and PyTorch's
        scheme)."""
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size else 0.0
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            if p is not None:
                init.uniform_(p, -bound, bound)

    def _gates(self, x: Tensor, h: Tensor) -> Tensor:
        """``x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh``: all gates' pre-activations."""
        return F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh,
                                                                    self.bias_hh)

    def _zeros(self, x: Tensor) -> Tensor:
        return F.zeros((x.shape[0], self.hidden_size), dtype=x.dtype, device=x.device)

    def _check_input(self, x: Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.input_size:
            raise ValueError(f"{type(self).__name__}: expected input of shape (batch, "
                             f"{self.input_size}), got {tuple(x.shape)}")

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class RNNCell(_CellBase):
    """One step of an Elman RNN: ``h' = nonlinearity(x W_ih^T + b_ih + h W_hh^T + b_hh)``,
    ``nonlinearity`` ``"tanh"`` (default) or ``"relu"``. ``cell(x, h)`` takes ``x`` ``(batch,
    input_size)`` and ``h`` ``(batch, hidden_size)`` (zeros when None) and returns ``h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", **kwargs):
        if nonlinearity not in _NONLINEARITIES:
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got "
                             f"{nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        self._check_input(input)
        h = self._zeros(input) if hx is None else hx
        return _NONLINEARITIES[self.nonlinearity](self._gates(input, h))


class LSTMCell(_CellBase):
    """One step of an LSTM. ``cell(x, (h, c))`` (zeros when ``hx`` is None) returns ``(h', c')``
    with gates ``i, f, g, o`` from one product: ``c' = sigmoid(f) * c + sigmoid(i) * tanh(g)``,
    ``h' = sigmoid(o) * tanh(c')``."""

    gates = 4

    def forward(self, input: Tensor, hx=None):  # noqa: A002
        self._check_input(input)
        if hx is None:
            h = c = self._zeros(input)
        else:
            h, c = hx
        z = self._gates(input, h)
        n = self.hidden_size
        i, f = F.sigmoid(z[:, :n]), F.sigmoid(z[:, n:2 * n])
        g, o = F.tanh(z[:, 2 * n:3 * n]), F.sigmoid(z[:, 3 * n:])
        c_new = f * c + i * g
        return o * F.tanh(c_new), c_new


class _RecurrentBase(Module):
    """``num_layers`` stacked cells per direction run over a sequence. Input ``(seq_len, batch,
    input_size)`` (``(batch, seq_len, input_size)`` with ``batch_first``); the output holds the
    last layer's hidden state at every step, both directions concatenated on the last axis.
    ``dropout`` applies to every layer's output but the last, in training mode."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, name: str | None = None):
        super().__init__(name=name)
        if proj_size:
            raise ValueError(f"{type(self).__name__}: proj_size is not supported, got "
                             f"{proj_size}")
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.num_directions = 2 if self.bidirectional else 1
        self.proj_size = 0
        self.cells = [
            self._make_cell(self.input_size if layer == 0
                            else self.hidden_size * self.num_directions)
            for layer in range(self.num_layers) for _ in range(self.num_directions)
        ]

    def _make_cell(self, input_size: int) -> Module:
        raise NotImplementedError

    def _initial_state(self, x: Tensor, hx):
        raise NotImplementedError

    def _run_direction(self, cell, xs: list, state, reverse: bool):
        """Outputs (in time order) and final state of one cell over the steps ``xs``."""
        outs = [None] * len(xs)
        steps = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
        for t in steps:
            state = cell(xs[t], state)
            outs[t] = state[0] if isinstance(state, tuple) else state
        return outs, state

    def forward(self, input: Tensor, hx=None):  # noqa: A002
        x = input
        if x.ndim != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"{type(self).__name__}: expected input of shape (seq_len, batch, "
                             f"{self.input_size}) (batch first: {self.batch_first}), got "
                             f"{tuple(x.shape)}")
        if self.batch_first:
            x = F.transpose(x, (1, 0, 2))
        states = self._initial_state(x, hx)
        xs = [x[t] for t in range(x.shape[0])]
        finals = []
        for layer in range(self.num_layers):
            outs_per_direction = []
            for direction in range(self.num_directions):
                k = layer * self.num_directions + direction
                outs, final = self._run_direction(self.cells[k], xs, states[k], direction == 1)
                outs_per_direction.append(outs)
                finals.append(final)
            xs = [F.concat(step, axis=-1) if len(step) > 1 else step[0]
                  for step in zip(*outs_per_direction)]
            if self.dropout and self.training and layer < self.num_layers - 1:
                xs = [F.dropout(step, self.dropout) for step in xs]
        output = F.stack(xs, axis=0)
        if self.batch_first:
            output = F.transpose(output, (1, 0, 2))
        return output, self._final_state(finals)

    def _final_state(self, finals: list):
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, bidirectional={self.bidirectional}")


def _split_hidden(h: Tensor, count: int, op: str) -> list:
    """``h`` of shape ``(count, batch, hidden)`` as ``count`` tensors ``(batch, hidden)``."""
    if h.ndim != 3 or h.shape[0] != count:
        raise ValueError(f"{op}: expected an initial state of shape (num_layers * "
                         f"num_directions = {count}, batch, hidden_size), got {tuple(h.shape)}")
    return [h[k] for k in range(count)]


class RNN(_RecurrentBase):
    """A multi-layer Elman RNN (:class:`RNNCell` per layer and direction). ``rnn(x, h_0)`` returns
    ``(output, h_n)``; ``h_0`` and ``h_n`` have shape ``(num_layers * num_directions, batch,
    hidden_size)`` (zeros when ``h_0`` is None). ``nonlinearity`` is ``"tanh"`` or ``"relu"``."""

    def __init__(self, *args, nonlinearity: str = "tanh", **kwargs):
        if nonlinearity not in _NONLINEARITIES:
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self._nonlinearity = nonlinearity  # read by _make_cell during the base constructor
        super().__init__(*args, **kwargs)
        self.nonlinearity = nonlinearity

    def _make_cell(self, input_size: int) -> Module:
        return RNNCell(input_size, self.hidden_size, self.bias, self._nonlinearity)

    def _initial_state(self, x: Tensor, hx):
        count = self.num_layers * self.num_directions
        if hx is None:
            return [None] * count
        return _split_hidden(hx, count, "RNN")

    def _final_state(self, finals: list):
        return F.stack(finals, axis=0)


class LSTM(_RecurrentBase):
    """A multi-layer LSTM (:class:`LSTMCell` per layer and direction). ``lstm(x, (h_0, c_0))``
    returns ``(output, (h_n, c_n))``; the states have shape ``(num_layers * num_directions,
    batch, hidden_size)`` (zeros when ``hx`` is None)."""

    def _make_cell(self, input_size: int) -> Module:
        return LSTMCell(input_size, self.hidden_size, self.bias)

    def _initial_state(self, x: Tensor, hx):
        count = self.num_layers * self.num_directions
        if hx is None:
            return [None] * count
        h0, c0 = hx
        return list(zip(_split_hidden(h0, count, "LSTM"), _split_hidden(c0, count, "LSTM")))

    def _final_state(self, finals: list):
        return F.stack([h for h, _ in finals], axis=0), F.stack([c for _, c in finals], axis=0)
