"""The sequence-parallel transformer LM equals the single-device model in float64: logits, loss,
the gradient of the blocks' input and every parameter gradient (N = 2, 3, 4; ring and Ulysses;
causal or not; contiguous or zigzag); and 3 training steps with sequence 2 × data 2 equal one
process."""

import itertools

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.optimizer as optim
from minigrad.distributed import comm
from minigrad.distributed import sequence_parallel as sp
from minigrad.distributed.mesh.topology import ProcessTopology
from minigrad.testing.distributed import run_workers

VOCAB, DIM, LAYERS, MAX_LEN = 11, 12, 2, 16
CASES = list(itertools.product(("ring", "ulysses"), (False, True), (False, True)))


def _model(attention, causal, zigzag=False, heads=4, group=None):
    mg.random.seed(3)
    return sp.SequenceParallelLM(VOCAB, DIM, heads, LAYERS, MAX_LEN, attention=attention,
                                 causal=causal, zigzag=zigzag, group=group, mlp_ratio=2,
                                 dtype="float64")


def _reference(tokens, heads, causal):
    """Single device: dense attention, the mean token loss over the whole batch."""
    model = _model("dense", causal, heads=heads)
    b, length = tokens.shape[0], tokens.shape[1] - 1
    x_in = mg.Tensor(np.zeros((b, length, DIM)))
    params = list(model.parameters())
    gm = ad.GradManager().attach(params + [x_in])
    with gm:
        h = model.embed(mg.Tensor(tokens[:, :-1])) + x_in
        logits = model.head(model.ln_f(model.blocks(h)))
        loss = F.nn.cross_entropy(logits.reshape(-1, VOCAB), mg.Tensor(tokens[:, 1:].reshape(-1)))
        gm.backward(loss)
    return {"logits": logits.numpy(), "loss": loss.item(), "x_grad": x_in.grad.numpy(),
            "grads": [p.grad.numpy() for p in params]}


def _lm_body(tokens, heads):
    results = {}
    for attention, causal, zigzag in CASES:
        model = _model(attention, causal, zigzag, heads)
        ids, labels = sp.split_lm_batch(tokens, zigzag)
        x_in = mg.Tensor(np.zeros((tokens.shape[0], tokens.shape[1] - 1, DIM)))
        params = list(model.parameters())
        gm = ad.GradManager().attach(params, callbacks=[
            dist.make_allreduce_cb("sum", group=sp.gradient_group())])
        gm.attach([x_in])
        with gm:
            h = model.embed(mg.Tensor(ids)) + sp.split_sequence(x_in, 1, zigzag)
            logits = model.head(model.ln_f(model.blocks(h)))
            loss = sp.sequence_cross_entropy(logits, labels)
            gm.backward(loss)
        results[attention, causal, zigzag] = {
            "logits": sp.gather_sequence(logits.numpy(), 1, zigzag),
            "loss": float(comm.all_reduce(loss.numpy())),
            "x_grad": comm.all_reduce(x_in.grad.numpy()),
            "grads": [p.grad.numpy() for p in params],
        }
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_lm_equals_single_device(world):
    heads = {2: 4, 3: 3, 4: 4}[world]          # divisible by N for Ulysses, dividing DIM
    rng = np.random.default_rng(world)
    tokens = rng.integers(0, VOCAB, size=(2, 4 * world + 1))
    refs = {causal: _reference(tokens, heads, causal) for causal in (False, True)}
    res = run_workers(_lm_body, world, tokens, heads, timeout=180)
    for case in CASES:
        ref = refs[case[1]]
        for r, rank_res in enumerate(res):
            got, msg = rank_res[case], f"{case} rank {r}"
            np.testing.assert_allclose(got["logits"], ref["logits"], rtol=1e-10, atol=1e-12,
                                       err_msg=msg)
            assert got["loss"] == pytest.approx(ref["loss"], rel=1e-12), msg
            np.testing.assert_allclose(got["x_grad"], ref["x_grad"], rtol=1e-10, atol=1e-13,
                                       err_msg=msg)
            assert len(got["grads"]) == len(ref["grads"])
            for g, want in zip(got["grads"], ref["grads"]):
                np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-13, err_msg=msg)


STEPS, LR = 3, 0.1


def _train(model, batches, loss_fn, callbacks=()):
    params = list(model.parameters())
    gm = ad.GradManager().attach(params, callbacks=list(callbacks))
    opt = optim.SGD(params, lr=LR, momentum=0.9)  # linear in the gradients: no amplified rounding
    losses = []
    for ids, labels in batches:
        with gm:
            loss = loss_fn(model(mg.Tensor(ids)), labels)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss)
    return losses, [p.numpy() for p in params]


def _hybrid_body(tokens):
    """Sequence 2 × data 2: data rank d trains rows [2d, 2d + 2) of each batch, its sequence rank
    holds half of each sequence; gradients are summed over the sequence × data group."""
    topo = ProcessTopology(["data", "sequence"], [2, 2])
    seq_group, grad_group = topo.group("sequence"), topo.group("data", "sequence")
    d = topo.get_coord(dist.get_rank()).data
    out = {}
    for attention, zigzag in (("ring", True), ("ulysses", False)):
        model = _model(attention, True, zigzag, group=seq_group)
        batches = [sp.split_lm_batch(t[2 * d:2 * d + 2], zigzag, seq_group) for t in tokens]
        losses, params = _train(
            model, batches,
            lambda logits, labels: sp.sequence_cross_entropy(logits, labels, grad_group),
            [dist.make_allreduce_cb("sum", group=grad_group)])
        out[attention] = ([float(comm.all_reduce(x.numpy(), group=grad_group)) for x in losses],
                          params)
    return out


def test_three_steps_sequence2_data2_equal_one_process():
    rng = np.random.default_rng(7)
    tokens = [rng.integers(0, VOCAB, size=(4, 9)) for _ in range(STEPS)]
    ref_losses, ref_params = _train(
        _model("dense", True), [(t[:, :-1], t[:, 1:]) for t in tokens],
        lambda logits, labels: F.nn.cross_entropy(logits.reshape(-1, VOCAB),
                                                  mg.Tensor(labels.reshape(-1))))
    ref_losses = [x.item() for x in ref_losses]
    initial = [p.numpy() for p in _model("dense", True).parameters()]
    assert min(np.abs(p - q).max() for p, q in zip(ref_params, initial)) > 1e-3  # all trained
    res = run_workers(_hybrid_body, 4, tokens, timeout=180)
    for rank_res in res:
        for attention, (losses, params) in rank_res.items():
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-10, err_msg=attention)
            for p, want in zip(params, ref_params):
                np.testing.assert_allclose(p, want, rtol=1e-10, atol=1e-12, err_msg=attention)


def test_lm_arguments_are_checked():
    with pytest.raises(ValueError, match=r"must be one of \('ring', 'ulysses', 'dense'\)"):
        sp.SequenceParallelLM(VOCAB, DIM, 4, 1, MAX_LEN, attention="flash")
    model = _model("ring", True)
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_len 16"):
        model(np.zeros((1, 17), np.int64))
    assert all(p.dtype == np.float64 for p in model.parameters())
    with pytest.raises(ValueError, match=r"labels of shape \(1, 3\) do not match logits"):
        sp.sequence_cross_entropy(model(np.zeros((1, 4), np.int64)), np.zeros((1, 3), np.int64))
