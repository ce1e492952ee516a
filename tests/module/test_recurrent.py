"""RNNCell, LSTMCell, RNN and LSTM against a NumPy reference written from the documented
equations (gates i, f, g, o; h' = o * tanh(c')), in float64; shapes of MegEngine's layouts;
gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from module_test_helpers import layer_check_grad, to_float64

import minigrad as mg
import minigrad.module as M


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _np(t):
    return np.asarray(t.numpy(), np.float64)


def ref_rnn_cell(cell, x, h, act=np.tanh):
    z = x @ _np(cell.weight_ih).T + _np(cell.bias_ih) + h @ _np(cell.weight_hh).T
    return act(z + _np(cell.bias_hh))


def ref_lstm_cell(cell, x, h, c):
    z = (x @ _np(cell.weight_ih).T + _np(cell.bias_ih) + h @ _np(cell.weight_hh).T
         + _np(cell.bias_hh))
    i, f, g, o = np.split(z, 4, axis=1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c_new), c_new


def test_cells_match_the_equations():
    rng = np.random.default_rng(0)
    x, h, c = rng.normal(size=(3, 5)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    cell = M.RNNCell(5, 4, nonlinearity="relu")
    to_float64(cell)
    assert cell.weight_ih.shape == (4, 5) and cell.weight_hh.shape == (4, 4)
    np.testing.assert_allclose(cell(mg.tensor(x), mg.tensor(h)).numpy(),
                               ref_rnn_cell(cell, x, h, lambda z: np.maximum(z, 0)), rtol=1e-12)
    lstm = M.LSTMCell(5, 4)
    to_float64(lstm)
    assert lstm.weight_ih.shape == (16, 5) and lstm.bias_hh.shape == (16,)
    h1, c1 = lstm(mg.tensor(x), (mg.tensor(h), mg.tensor(c)))
    rh, rc = ref_lstm_cell(lstm, x, h, c)
    np.testing.assert_allclose(h1.numpy(), rh, rtol=1e-12)
    np.testing.assert_allclose(c1.numpy(), rc, rtol=1e-12)
    # no state means zeros
    h0, c0 = lstm(mg.tensor(x))
    np.testing.assert_allclose(h0.numpy(), ref_lstm_cell(lstm, x, 0 * h, 0 * c)[0], rtol=1e-12)


def test_initialisation_is_uniform_in_inverse_sqrt_hidden():
    mg.random.seed(0)
    cell = M.LSTMCell(30, 25)
    w = cell.weight_ih.numpy()
    assert np.abs(w).max() <= 1 / 5 and np.abs(w).max() > 0.19


@pytest.mark.parametrize("batch_first", [False, True])
def test_bidirectional_two_layer_lstm_matches_unrolled_reference(batch_first):
    rng = np.random.default_rng(1)
    T, N, I, H = 4, 2, 3, 5
    lstm = M.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=batch_first)
    to_float64(lstm)
    x = rng.normal(size=(T, N, I))
    h0, c0 = rng.normal(size=(4, N, H)), rng.normal(size=(4, N, H))
    inp = x.transpose(1, 0, 2) if batch_first else x
    out, (hn, cn) = lstm(mg.tensor(inp), (mg.tensor(h0), mg.tensor(c0)))
    # reference: layer by layer, forward then reverse direction, outputs concatenated
    seq, finals_h, finals_c = list(x), [], []
    for layer in range(2):
        per_dir = []
        for d in range(2):
            k = 2 * layer + d
            cell, h, c = lstm.cells[k], h0[k], c0[k]
            outs = [None] * T
            for t in (range(T - 1, -1, -1) if d else range(T)):
                h, c = ref_lstm_cell(cell, seq[t], h, c)
                outs[t] = h
            per_dir.append(outs)
            finals_h.append(h)
            finals_c.append(c)
        seq = [np.concatenate([a, b], axis=-1) for a, b in zip(*per_dir)]
    ref = np.stack(seq)
    if batch_first:
        ref = ref.transpose(1, 0, 2)
    assert out.shape == ((N, T, 2 * H) if batch_first else (T, N, 2 * H))
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(hn.numpy(), np.stack(finals_h), rtol=1e-12)
    np.testing.assert_allclose(cn.numpy(), np.stack(finals_c), rtol=1e-12)


def test_rnn_stack_shapes_and_state():
    rng = np.random.default_rng(2)
    rnn = M.RNN(3, 4, num_layers=2)
    to_float64(rnn)
    x = rng.normal(size=(5, 2, 3))
    out, hn = rnn(mg.tensor(x))
    assert out.shape == (5, 2, 4) and hn.shape == (2, 2, 4)
    h = np.zeros((2, 4))
    for t in range(5):
        h = ref_rnn_cell(rnn.cells[0], x[t], h)
    np.testing.assert_allclose(hn.numpy()[0], h, rtol=1e-12)
    np.testing.assert_allclose(out.numpy()[-1], hn.numpy()[1], rtol=1e-12)
    assert len(list(rnn.parameters())) == 8


def test_lstm_gradients_match_finite_differences():
    rng = np.random.default_rng(3)
    lstm = M.LSTM(3, 2)
    to_float64(lstm)
    x = rng.normal(size=(3, 2, 3))
    layer_check_grad(lstm, x, call=lambda m, v: m(v)[0])
    # the weight gradient, entry by entry, against central differences of the summed output
    w = lstm.cells[0].weight_ih
    gm = mg.autodiff.GradManager().attach([w])
    with gm:
        gm.backward(lstm(mg.tensor(x))[0].sum())
    grad, base, eps = w.grad.numpy(), w.numpy().copy(), 1e-6
    for idx in [(0, 0), (3, 1), (5, 2), (7, 0)]:
        loss = []
        for sign in (1, -1):
            pert = base.copy()
            pert[idx] += sign * eps
            w.set_value(pert)
            loss.append(float(lstm(mg.tensor(x))[0].sum().numpy()))
        w.set_value(base)
        assert abs((loss[0] - loss[1]) / (2 * eps) - grad[idx]) < 1e-7


def test_errors_name_the_layer():
    with pytest.raises(ValueError, match="LSTM: expected input of shape"):
        M.LSTM(3, 2)(mg.tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match="nonlinearity"):
        M.RNN(3, 2, nonlinearity="gelu")
