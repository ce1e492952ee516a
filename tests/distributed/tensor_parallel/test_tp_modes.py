"""Every tensor-parallel mode against the single-device model, in float64.

One job per mode and size runs, on every rank: a two-layer MLP and a small transformer language
model (embeddings, a transformer block, LayerNorm, classifier, vocab-parallel cross-entropy) for 3
SGD steps, the collective log of each layer, and the parameter bytes. The parent process runs the
same code without a parallel context (the single-device model, built from the same seed) and
compares forward values, the loss and every gradient after reassembling the shards.
"""

from collections import Counter
from functools import lru_cache

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp
from minigrad.testing.distributed import run_workers

DIM, HEADS, VOCAB, BATCH, SEQ, STEPS = 16, 4, 16, 4, 3, 3
RTOL, ATOL = 1e-10, 1e-12

MODES = {
    "1d-2": (dict(tensor=dict(size=2, mode="1d")), 2),
    "1d-4": (dict(tensor=dict(size=4, mode="1d")), 4),
    "2d-4": (dict(tensor=dict(size=4, mode="2d")), 4),
    "2.5d-8": (dict(tensor=dict(size=8, mode="2.5d", depth=2)), 8),
    "3d-8": (dict(tensor=dict(size=8, mode="3d")), 8),
}


def _float64(model):
    for t in model.tensors():
        t._data = t._data.astype(np.float64)
    return model


def _data():
    rng = np.random.default_rng(7)
    return dict(
        x=rng.standard_normal((BATCH, SEQ, DIM)), dy=rng.standard_normal((BATCH, SEQ, DIM)),
        ids=rng.integers(0, VOCAB, (BATCH, SEQ)), labels=rng.integers(0, VOCAB, (BATCH, SEQ)),
    )


def _mlp():
    mg.random.seed(0)
    tp.reset_layout()
    return _float64(M.Sequential(tp.Linear(DIM, 4 * DIM), M.GELU(), tp.Linear(4 * DIM, DIM)))


def _lm():
    mg.random.seed(1)
    tp.reset_layout()
    return _float64(tp.TransformerLM(VOCAB, DIM, HEADS, depth=1, max_len=4))


def _train_mlp(model, data):
    """3 SGD steps of <mlp(x), dy>; per step the output, the input gradient and all gradients."""
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = mg.tensor(data["x"])
    gm = ad.GradManager().attach(list(model.parameters()) + [x])
    steps = []
    for _ in range(STEPS):
        with gm:
            y = tp.gather_output(model(tp.split_input(x)))
            gm.backward((y * mg.tensor(data["dy"])).sum())
        steps.append((y.numpy(), x.grad.numpy(), tp.full_grads(model)))
        x.grad = None
        opt.step().clear_grad()
    return steps


def _train_lm(model, data):
    """3 SGD steps of the LM; per step the loss, the whole logits and all gradients."""
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gm = ad.GradManager().attach(model.parameters())
    steps = []
    for _ in range(STEPS):
        with gm:
            logits = model(tp.split_input(data["ids"]))
            loss = tp.cross_entropy(logits, tp.split_input(data["labels"]))
            gm.backward(loss)
        steps.append((loss.item(), tp.gather_output(logits).numpy(), tp.full_grads(model)))
        opt.step().clear_grad()
    return steps


def _logged(forward, x, params):
    """Counts of (kind, group, phase) of one forward and backward of ``forward(x)``."""
    gm = ad.GradManager().attach(list(params) + ([x] if x.dtype.kind == "f" else []))
    with tp.log_collectives() as log:
        with gm:
            gm.backward(forward(x).sum())
    return log.counts()


def _layer_logs(data):
    """The collective log of each kind of layer (each starting a new layout chain)."""
    x = tp.split_input(mg.tensor(data["x"]))
    ids, labels = tp.split_input(data["ids"]), tp.split_input(data["labels"])
    logs = {}
    for name, build in [
        ("linear", lambda: tp.Linear(DIM, DIM)),
        ("mlp", _mlp),
        ("layer_norm", lambda: tp.LayerNorm(DIM)),
        ("embedding", lambda: tp.Embedding(VOCAB, DIM)),
        ("block", lambda: tp.TransformerBlock(DIM, HEADS)),
    ]:
        tp.reset_layout()
        layer = _float64(build())
        logs[name] = _logged(layer, ids if name == "embedding" else x, layer.parameters())
    tp.reset_layout()
    head = _float64(tp.Classifier(DIM, VOCAB))
    logs["loss"] = _logged(lambda t: tp.cross_entropy(t, labels), head(x), [])
    return logs


def _param_elements(model):
    """Elements of (Linear weights, everything else) this rank stores."""
    weights = sum(p.size for p in model.parameters() if p.ndim == 2)
    return weights, sum(p.size for p in model.parameters()) - weights


def _train_all(data):
    """What both sides compute: the MLP and LM runs and the parameter sizes."""
    mg.random.seed(1)
    tp.reset_layout()
    block = tp.TransformerBlock(DIM, HEADS)
    return dict(
        mlp=_train_mlp(_mlp(), data), lm=_train_lm(_lm(), data),
        elements=dict(mlp=_param_elements(_mlp()), block=_param_elements(block)),
    )


def _mode_job(parallel):
    dist.init_parallel(parallel)
    data = _data()
    return dict(_train_all(data), logs=_layer_logs(data))


@lru_cache(maxsize=None)
def _reference():
    return _train_all(_data())


@lru_cache(maxsize=None)
def _run_mode(name):
    parallel, world = MODES[name]
    return run_workers(_mode_job, world, parallel, timeout=240)


def _close(actual, expected, what):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=what)


def _same_grads(actual, expected, what):
    assert list(actual) == list(expected), f"{what}: keys {list(actual)} != {list(expected)}"
    for key in expected:
        _close(actual[key], expected[key], f"{what}: gradient of {key}")


@pytest.mark.parametrize("name", list(MODES))
def test_mlp_and_transformer_lm_equal_single_device_over_three_steps(name):
    ref = _reference()
    for rank, out in enumerate(_run_mode(name)):
        for step, ((y, dx, g), (ry, rdx, rg)) in enumerate(zip(out["mlp"], ref["mlp"])):
            what = f"{name} rank {rank} MLP step {step}"
            _close(y, ry, what + " output")
            _close(dx, rdx, what + " input gradient")
            _same_grads(g, rg, what)
        for step, ((loss, logits, g), (rloss, rlogits, rg)) in enumerate(zip(out["lm"], ref["lm"])):
            what = f"{name} rank {rank} LM step {step}"
            assert abs(loss - rloss) <= RTOL * abs(rloss), f"{what}: loss {loss} != {rloss}"
            _close(logits, rlogits, what + " logits")
            _same_grads(g, rg, what)
    losses = {out["lm"][-1][0] for out in _run_mode(name)}
    assert len(losses) == 1, f"{name}: ranks disagree on the loss: {losses}"


def _times(n, counts):
    return Counter({k: n * v for k, v in counts.items()})


def _expected_logs(name):
    """The communication table of each mode (kind, group, phase) -> count, written from the
    layouts in PARALLELISM.md, not from the implementation's output."""
    mode = name.split("-")[0]
    if mode == "1d":
        col = Counter({("all_reduce", "1d", "backward"): 1})  # the column layer's dX
        row = Counter({("all_reduce", "1d", "forward"): 1})  # the row layer's sum
        return dict(
            linear=col, mlp=col + row, layer_norm=Counter(), embedding=row,
            block=_times(2, col + row), loss=Counter({("all_reduce", "1d", "forward"): 3}),
        )
    if mode in ("2d", "2.5d"):
        q = 2
        p = mode
        batch = "2d_col" if mode == "2d" else "2.5d_col_x_dep"
        linear = Counter({
            ("broadcast", f"{p}_row", "forward"): q, ("broadcast", f"{p}_col", "forward"): q,
            ("broadcast", f"{p}_row", "backward"): q, ("broadcast", f"{p}_col", "backward"): q,
            ("reduce", f"{p}_row", "backward"): q, ("reduce", f"{p}_col", "backward"): q,
            ("all_gather", batch, "forward"): 1, ("reduce_scatter", batch, "backward"): 1,
        })
        if mode == "2.5d":
            linear[("all_reduce", "2.5d_dep", "backward")] = 1  # the depth sum of dW
        norm = Counter({
            ("all_reduce", f"{p}_row", "forward"): 2, ("all_reduce", f"{p}_row", "backward"): 2,
            ("all_gather", batch, "forward"): 2, ("reduce_scatter", batch, "backward"): 2,
        })
        embedding = Counter({("all_gather", batch, "forward"): 1,
                             ("reduce_scatter", batch, "backward"): 1})
        loss = Counter({("all_reduce", f"{p}_row", "forward"): 3,
                        ("all_reduce", batch, "forward"): 1})
        return dict(linear=linear, mlp=_times(2, linear), layer_norm=norm, embedding=embedding,
                    block=_times(4, linear) + _times(2, norm), loss=loss)
    assert mode == "3d"

    def linear3d(src, dst):  # input layout: batch cut by src, features by dst
        vec = f"3d_{dst}_x_weight"  # the output layout's batch group holds the bias blocks
        return Counter({
            ("all_gather", f"3d_{src}", "forward"): 1, ("all_gather", "3d_weight", "forward"): 1,
            ("reduce_scatter", f"3d_{dst}", "forward"): 1, ("all_gather", vec, "forward"): 1,
            ("all_gather", f"3d_{dst}", "backward"): 1,
            ("reduce_scatter", f"3d_{src}", "backward"): 1,
            ("reduce_scatter", "3d_weight", "backward"): 1,
            ("reduce_scatter", vec, "backward"): 1,
        })

    a_to_b, b_to_a = linear3d("input", "output"), linear3d("output", "input")
    norm = Counter({
        ("all_reduce", "3d_output", "forward"): 2, ("all_reduce", "3d_output", "backward"): 2,
        ("all_gather", "3d_input_x_weight", "forward"): 2,
        ("reduce_scatter", "3d_input_x_weight", "backward"): 2,
    })
    embedding = Counter({("all_gather", "3d_input_x_weight", "forward"): 1,
                         ("reduce_scatter", "3d_input_x_weight", "backward"): 1})
    loss = Counter({("all_gather", "3d_input_x_weight", "forward"): 1,  # labels from A to B
                    ("all_reduce", "3d_input", "forward"): 3,
                    ("all_reduce", "3d_output_x_weight", "forward"): 1})
    return dict(linear=a_to_b, mlp=a_to_b + b_to_a, layer_norm=norm, embedding=embedding,
                block=_times(2, a_to_b + b_to_a) + _times(2, norm), loss=loss)


@pytest.mark.parametrize("name", list(MODES))
def test_collective_log_of_each_layer_equals_the_table_of_the_mode(name):
    expected = _expected_logs(name)
    for rank, out in enumerate(_run_mode(name)):
        for layer, want in expected.items():
            got = out["logs"][layer]
            assert got == want, f"{name} rank {rank} {layer}:\n got {dict(got)}\n want {dict(want)}"


@pytest.mark.parametrize("name", list(MODES))
def test_parameter_bytes_per_rank_are_one_over_p(name):
    mode, size = name.split("-")
    size = int(size)
    weight_share = 4 if mode == "2.5d" else size  # 2.5D weights are replicated over the depth
    ref = _reference()["elements"]
    for rank, out in enumerate(_run_mode(name)):
        for model in ("mlp", "block"):
            (weights, others), (ref_weights, ref_others) = out["elements"][model], ref[model]
            assert weights * weight_share == ref_weights, (name, rank, model, weights, ref_weights)
            if mode != "1d":  # biases and LayerNorms too: 1/P (2.5D: cut over all 8 ranks)
                assert others * size == ref_others, (name, rank, model, others, ref_others)
