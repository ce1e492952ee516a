"""Logical checkpoints across sizes and modes, data × tensor and pipeline × tensor parallelism, and
the dropout streams."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed import tensor_parallel as tp
from minigrad.testing.distributed import run_workers

VOCAB, DIM, HEADS, BATCH, SEQ = 16, 16, 4, 4, 3


def _float64(model):
    for t in model.tensors():
        t._data = t._data.astype(np.float64)
    return model


def _lm(seed):
    mg.random.seed(seed)
    tp.reset_layout()
    return _float64(tp.TransformerLM(VOCAB, DIM, HEADS, depth=1, max_len=4))


def _batch(seed=3, batch=BATCH):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (batch, SEQ)), rng.integers(0, VOCAB, (batch, SEQ))


def _step(model, ids, labels, gm, opt):
    with gm:
        loss = tp.cross_entropy(model(tp.split_input(ids)), tp.split_input(labels))
        gm.backward(loss)
    opt.step().clear_grad()
    return loss.item()


def _logits(model, ids):
    return tp.gather_output(model(tp.split_input(ids))).numpy()


# -- checkpoints --------------------------------------------------------------------------------

def _train_and_save(path):
    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    model = _lm(seed=1)
    ids, labels = _batch()
    _step(model, ids, labels, ad.GradManager().attach(model.parameters()),
          optim.SGD(model.parameters(), lr=0.5))
    state = model.state_dict()
    if dist.get_rank() == 0:
        mg.save(state, path)
    dist.group_barrier()
    return {k: v.shape for k, v in state.items()}, _logits(model, _batch(seed=4)[0])


def _load_2d(path):
    dist.init_parallel(dict(tensor=dict(size=4, mode="2d")))
    model = _lm(seed=99)  # different initial weights: everything must come from the file
    model.load_state_dict(mg.load(path))
    state = model.state_dict()
    return state, _logits(model, _batch(seed=4)[0])


def test_state_dict_saved_at_1d_size_2_loads_into_2d_size_4_and_one_process(tmp_path):
    path = str(tmp_path / "lm.mgz")
    shapes, logits = run_workers(_train_and_save, 2, path)[0]
    single = _lm(seed=7)
    assert shapes == {k: v.shape for k, v in single.state_dict().items()}  # single-device layout
    saved = mg.load(path)
    single.load_state_dict(saved)
    np.testing.assert_allclose(single(mg.tensor(_batch(seed=4)[0])).numpy(), logits, rtol=1e-12)
    for rank, (state, logits_2d) in enumerate(run_workers(_load_2d, 4, path)):
        np.testing.assert_allclose(logits_2d, logits, rtol=1e-12, err_msg=f"rank {rank}")
        for key, value in saved.items():
            np.testing.assert_array_equal(state[key], value, err_msg=f"rank {rank} {key}")


def _load_wrong_shape():
    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    model = _lm(seed=1)
    state = model.state_dict()
    state["head.weight"] = state["head.weight"][:, :8]
    try:
        model.load_state_dict(state)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_loading_a_tensor_of_the_wrong_full_shape_names_it():
    for message in run_workers(_load_wrong_shape, 2):
        assert "'head.weight' has shape (16, 8), expected the full shape (16, 16)" in message


# -- hybrid -------------------------------------------------------------------------------------

def _data_x_tensor(parallel):
    ctx = dist.init_parallel(parallel)
    assert ctx.size("data") == 2
    model = _lm(seed=1)
    ids, labels = _batch(batch=2 * BATCH)
    mine = slice(ctx.rank("data") * BATCH, (ctx.rank("data") + 1) * BATCH)
    gm = ad.GradManager().attach(
        model.parameters(), callbacks=[dist.make_allreduce_cb("mean", group=ctx.group("data"))]
    )
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for _ in range(3):
        _step(model, ids[mine], labels[mine], gm, opt)
    return model.state_dict()


def test_data_times_tensor_equals_one_process_with_the_global_batch():
    model = _lm(seed=1)
    ids, labels = _batch(batch=2 * BATCH)
    gm = ad.GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for _ in range(3):
        _step(model, ids, labels, gm, opt)
    expected = model.state_dict()
    states = run_workers(_data_x_tensor, 4, dict(tensor=dict(size=2, mode="1d")))  # data 2
    for rank, state in enumerate(states):
        for key, value in expected.items():
            np.testing.assert_allclose(state[key], value, rtol=1e-10, atol=1e-12,
                                       err_msg=f"rank {rank} {key}")


def _mlp_half(first: bool):
    mg.random.seed(5)
    tp.reset_layout()
    layers = [tp.Linear(DIM, 2 * DIM), M.GELU(), tp.Linear(2 * DIM, DIM)]
    return _float64(M.Sequential(*(layers if first else [M.GELU()] + layers)))


def _pipeline_x_tensor():
    """Two pipeline stages, each a 1D tensor-parallel pair; activations go to the same tensor
    rank of the next stage."""
    ctx = dist.init_parallel(dict(pipeline=2, tensor=dict(size=2, mode="1d")))
    stage = ctx.rank("pipeline")
    peers = ctx.group("pipeline").ranks
    model = _mlp_half(stage == 0)
    x = mg.tensor(np.random.default_rng(0).standard_normal((BATCH, DIM)))
    gm = ad.GradManager().attach(model.parameters())
    with gm:
        if stage == 0:
            dist.functional.remote_send(model(x), peers[1])
            gm.backward()
            return tp.full_grads(model)
        h = dist.functional.remote_recv(peers[0])
        loss = (model(h) ** 2).sum()
        gm.backward(loss)
    return tp.full_grads(model)


def test_pipeline_stages_of_tensor_parallel_layers_equal_one_process():
    first, second = _mlp_half(True), _mlp_half(False)
    x = mg.tensor(np.random.default_rng(0).standard_normal((BATCH, DIM)))
    gm = ad.GradManager().attach(list(first.parameters()) + list(second.parameters()))
    with gm:
        gm.backward((second(first(x)) ** 2).sum())
    for rank, grads in enumerate(run_workers(_pipeline_x_tensor, 4)):
        ref = first if rank < 2 else second
        for name, p in ref.named_parameters():
            np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-10,
                                       err_msg=f"rank {rank} {name}")


# -- dropout ------------------------------------------------------------------------------------

def _masks(parallel):
    dist.init_parallel(parallel)
    tp.reset_layout()
    ones = mg.tensor(np.ones((4, 64)))
    masks = {}
    if parallel["tensor"]["mode"] == "1d":
        tp.Linear(8, 8)  # column-parallel: what follows is split
        masks["split"] = tp.Dropout(0.5)(ones).numpy()
        tp.Linear(8, 8)  # row-parallel: what follows is whole
        masks["whole"] = tp.Dropout(0.5)(ones).numpy()
        mg.random.seed(2)
        tp.reset_layout()
        block = tp.TransformerBlock(DIM, HEADS, dropout=0.3)
        x = mg.tensor(np.random.default_rng(0).standard_normal((2, SEQ, DIM)))
        masks["block"] = block(x).numpy()
    else:
        masks["split"] = tp.Dropout(0.5)(ones).numpy()
    return masks


def test_dropout_masks_equal_where_replicated_and_differ_where_split():
    one_d = run_workers(_masks, 2, dict(tensor=dict(size=2, mode="1d")))
    assert (one_d[0]["whole"] == 0).any() and (one_d[0]["whole"] != 0).any()
    np.testing.assert_array_equal(one_d[0]["whole"], one_d[1]["whole"])
    assert not np.array_equal(one_d[0]["split"], one_d[1]["split"])
    # replicated activations of a block stay identical on both ranks with dropout on
    np.testing.assert_array_equal(one_d[0]["block"], one_d[1]["block"])
    two_d = [m["split"] for m in run_workers(_masks, 4, dict(tensor=dict(size=4, mode="2d")))]
    assert len({m.tobytes() for m in two_d}) == 4
    assert np.array_equal(run_workers(_masks, 2, dict(tensor=dict(size=2, mode="1d")))[0]["split"],
                          one_d[0]["split"])  # seeded: the same masks in every run


def test_without_parallel_context_tp_layers_are_the_single_device_ones():
    assert type(tp.Linear(4, 4)) is M.Linear and type(tp.LayerNorm(4)) is M.LayerNorm
    assert type(tp.Embedding(4, 4)) is M.Embedding and type(tp.Classifier(4, 3)) is M.Linear
    x = mg.tensor(np.ones((2, 3)))
    assert tp.split_input(x) is x and tp.gather_output(x) is x
    logits = mg.tensor(np.random.default_rng(0).standard_normal((2, 3, 5)))
    labels = np.array([[0, 1, 2], [4, 3, 0]])
    expected = F.nn.cross_entropy(logits.reshape(6, 5), mg.tensor(labels.reshape(6)))
    assert tp.cross_entropy(logits, labels).item() == expected.item()


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_dropout_path_equals_the_fused_path(causal):
    # a drop probability so small that nothing is dropped: the composed path (used with dropout)
    # must give what the fused scaled_dot_product_attention gives
    mg.random.seed(0)
    attn = _float64(tp.SelfAttention(DIM, HEADS, dropout=0.5, causal=causal))
    x = mg.tensor(np.random.default_rng(1).standard_normal((2, 5, DIM)))
    fused = attn.eval()(x).numpy()
    attn.train()
    attn.attn_dropout.drop_prob = 1e-300
    np.testing.assert_allclose(attn(x).numpy(), fused, rtol=1e-12, atol=1e-12)


# -- sharded data parallelism over the data axis -------------------------------------------------

def _zero_x_tensor(parallel, mode):
    """data 2 x tensor 1D 2: DDP over the data group, or fully_shard over it (ZeRO-2 / ZeRO-3);
    returns this rank's (tensor-parallel local) parameters after 3 steps."""
    ctx = dist.init_parallel(parallel)
    model = _lm(seed=1)
    ids, labels = _batch(batch=2 * BATCH)
    mine = slice(ctx.rank("data") * BATCH, (ctx.rank("data") + 1) * BATCH)
    data = ctx.group("data")
    names = [name for name, _ in model.named_parameters()]
    cbs = [dist.make_allreduce_cb("mean", group=data)] if mode == "ddp" else []
    if mode != "ddp":
        dist.fully_shard(model, reshard_after_forward=mode == "zero3", group=data)
    gm = ad.GradManager().attach(model.parameters(), callbacks=cbs)
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for _ in range(3):
        _step(model, ids[mine], labels[mine], gm, opt)
    if mode == "ddp":
        return dict(zip(names, [p.numpy() for p in model.parameters()]))
    state = model._fully_shard
    return dict(zip(state.names, [np.asarray(a) for a in state.gather()]))


@pytest.mark.parametrize("mode", ["zero2", "zero3"])
def test_sharded_data_parallel_over_the_data_axis_of_data_times_tensor(mode):
    parallel = dict(tensor=dict(size=2, mode="1d"))  # data 2
    ddp = run_workers(_zero_x_tensor, 4, parallel, "ddp")
    zero = run_workers(_zero_x_tensor, 4, parallel, mode)
    for rank, (z, d) in enumerate(zip(zero, ddp)):
        assert z.keys() == d.keys()
        for key, value in d.items():  # bit for bit: the same sums in the same order
            np.testing.assert_array_equal(z[key], value, err_msg=f"rank {rank} {key}")
