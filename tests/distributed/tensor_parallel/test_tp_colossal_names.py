"""Colossal-AI's 1D layer names and arguments, 2.5D/3D biases that only the tensor depth divides,
and the tensor-parallel loss reading its layout from the logits (issue 27). Each parallel model
equals the single-device model built from the same seed, in float64."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
from minigrad.distributed import tensor_parallel as tp
from minigrad.testing.distributed import run_workers

RNG = np.random.default_rng(0)
IDS = RNG.integers(0, 16, size=(4, 3))
LABELS = RNG.integers(0, 10, size=(4, 3))
X = RNG.standard_normal((4, 4))
DY = RNG.standard_normal((4, 12))
TOL = dict(rtol=1e-10, atol=1e-12)


def _float64(model):
    for t in model.tensors():
        t._data = t._data.astype(np.float64)
    return model


def _grads(model, parallel):
    if parallel:
        return tp.full_grads(model)
    return {name: p.grad.numpy() for name, p in model.named_parameters()}


def _run_1d(parallel):
    mg.random.seed(0)
    if parallel:
        dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
        tp.reset_layout()
        model = M.Sequential(tp.Embedding1D(16, 8), tp.Linear1D_Col(8, 12), M.GELU(),
                             tp.Linear1D_Row(12, 8), tp.Classifier1D(8, 10))
    else:
        model = M.Sequential(M.Embedding(16, 8), M.Linear(8, 12), M.GELU(), M.Linear(12, 8),
                             M.Linear(8, 10))
    model = _float64(model)
    gm = ad.GradManager().attach(model.parameters())
    with gm:
        logits = model(mg.tensor(IDS))
        loss = (tp.cross_entropy(logits, LABELS) if parallel else
                F.nn.cross_entropy(logits.reshape(12, 10), mg.tensor(LABELS.reshape(12))))
        gm.backward(loss)
    return logits.numpy(), loss.item(), _grads(model, parallel)


def test_colossal_1d_layers_equal_one_device():
    ref_logits, ref_loss, ref_grads = _run_1d(False)
    for logits, loss, grads in run_workers(_run_1d, 2, True, timeout=60):
        np.testing.assert_allclose(logits, ref_logits, **TOL)  # whole logits on every rank
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        assert grads.keys() == ref_grads.keys()
        for name in ref_grads:
            np.testing.assert_allclose(grads[name], ref_grads[name], **TOL)


def _options_1d():
    mg.random.seed(1)
    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    tp.reset_layout()
    out = {}
    x = mg.tensor(RNG.standard_normal((2, 8)))
    col = tp.Linear1D_Col(8, 6, gather_output=True, skip_bias_add=True)
    y, b = col(x)
    col.skip_bias_add = False
    np.testing.assert_allclose((y + b).numpy(), col(x).numpy(), **TOL)
    row = tp.Linear1D_Row(6, 4, parallel_input=False, stream_chunk_num=2)
    try:
        row(y)
    except RuntimeError as exc:
        out["training"] = str(exc)
    row.eval()
    streamed = row(y).numpy()
    row.stream_chunk_num = 1
    np.testing.assert_allclose(streamed, row(y).numpy(), **TOL)
    emb = tp.VocabParallelEmbedding1D(16, 8)
    head = tp.VocabParallelClassifier1D(8, 16, weight=emb.weight, bias=False)
    out["tied"] = head.weight is emb.weight and len(list(M.Sequential(emb, head).parameters()))
    vanilla = tp.VanillaClassifier(8, 5, dtype=np.float16)
    out["vanilla"] = (vanilla(mg.tensor(np.ones((1, 8), np.float16))).shape,
                      str(vanilla.weight.dtype))
    try:
        tp.Linear1D_Row(6, 4, stream_chunk_num=3)
    except ValueError as exc:
        out["chunks"] = str(exc)
    return out


def test_colossal_1d_options():
    for out in run_workers(_options_1d, 2, timeout=60):
        assert "stream_chunk_num > 1 is for inference" in out["training"]
        assert out["tied"] == 1  # one shared parameter
        assert out["vanilla"] == ((1, 5), "float16")
        assert "stream_chunk_num must be a positive divisor of out_features 4, got 3" in out[
            "chunks"]


def _loss_with_head_built_first(parallel):
    """The classifier is built before the embedding: construction order would say the logits are
    whole, the tensor says they are split by vocabulary."""
    mg.random.seed(2)
    if parallel:
        dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
        tp.reset_layout()
        head = tp.VocabParallelClassifier1D(8, 16, bias=False)
        emb = tp.VocabParallelEmbedding1D(16, 8)
    else:
        head, emb = M.Linear(8, 16, bias=False), M.Embedding(16, 8)
    labels = (IDS + 5) % 16  # labels up to 15: half of them outside rank 0's block
    logits = head(emb(mg.tensor(IDS)))
    if parallel:
        return tp.cross_entropy(logits, labels).item()
    return F.nn.cross_entropy(logits.reshape(12, 16), mg.tensor(labels.reshape(12))).item()


def test_cross_entropy_reads_the_layout_from_the_logits():
    ref = _loss_with_head_built_first(False)
    for loss in run_workers(_loss_with_head_built_first, 2, True, timeout=60):
        assert loss == pytest.approx(ref, rel=1e-6)


def _run_blocked(mode_cfg, parallel):
    mg.random.seed(3)
    if parallel:
        dist.init_parallel(dict(tensor=mode_cfg))
        tp.reset_layout()
        model = tp.Linear(4, 12)  # bias (12,): the tensor depth 2 divides it, 8 ranks do not
    else:
        model = M.Linear(4, 12)
    model = _float64(model)
    x = mg.tensor(X)
    gm = ad.GradManager().attach(list(model.parameters()) + [x])
    with gm:
        y = model(tp.split_input(x)) if parallel else model(x)
        y = tp.gather_output(y) if parallel else y
        gm.backward((y * mg.tensor(DY)).sum())
    return y.numpy(), x.grad.numpy(), _grads(model, parallel)


@pytest.mark.parametrize("mode_cfg", [dict(size=8, mode="3d"),
                                      dict(size=8, mode="2.5d", depth=2)], ids=["3d", "2.5d"])
def test_bias_needs_only_the_tensor_depth_to_divide_it(mode_cfg):
    ref_y, ref_dx, ref_grads = _run_blocked(mode_cfg, False)
    for y, dx, grads in run_workers(_run_blocked, 8, mode_cfg, True, timeout=120):
        np.testing.assert_allclose(y, ref_y, **TOL)
        np.testing.assert_allclose(dx, ref_dx, **TOL)
        for name in ref_grads:
            np.testing.assert_allclose(grads[name], ref_grads[name], **TOL)
