"""PipelineEngine: every schedule at 2, 3 and 4 stages equals one process doing gradient
accumulation (float64, 1e-10), DP x PP equals one process with the global batch, tied weights
equal a single-process tied model, activation checkpointing is bitwise with dropout, data pulls,
messages, timelines, misuse and failures.

Each launched job runs many cases, to keep the suite fast; the single-process references run in
the pytest process.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.data import DataLoader, SequentialSampler
from minigrad.data.dataset import ArrayDataset
from minigrad.distributed.mesh.topology import PipeDataParallelTopology
from minigrad.distributed.pipeline import (
    LayerSpec,
    OneFOneB,
    PipelineEngine,
    PipelineError,
    PipelineModule,
    RepeatingLoader,
    TiedLayerSpec,
    Timeline,
    get_schedule,
    plot_timeline,
)
from minigrad.testing.distributed import run_workers

V, D, C = 7, 4, 3           # vocabulary, width, classes
STEPS = 3
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1"]


# ------------------------------------------------------------------------------------------------
# A float64 model whose stages pass a tuple (float, float, int) to each other
# ------------------------------------------------------------------------------------------------
def _rng_param(seed, *shape, scale=0.5):
    return mg.Parameter(np.random.default_rng(seed).standard_normal(shape) * scale)


class Embed(M.Module):
    """ids -> (h, skip, ids): two float tensors (both get gradients back) and an int one."""

    def __init__(self, seed):
        super().__init__()
        self.weight = _rng_param(seed, V, D)

    @classmethod
    def parameter_count(cls, seed):
        return V * D

    def forward(self, ids):
        h = self.weight[ids]
        return h, h * 0.5, ids


class Block(M.Module):
    built: list = []

    def __init__(self, seed, drop=0.0):
        super().__init__()
        Block.built.append(seed)
        self.w = _rng_param(seed, D, D)
        self.b = _rng_param(seed + 100, D, scale=0.1)
        self.drop = M.Dropout(drop)

    @classmethod
    def parameter_count(cls, seed, drop=0.0):
        return D * D + D

    def forward(self, x):
        h, skip, ids = x
        return self.drop(F.tanh(F.matmul(h, self.w) + self.b)) + 0.5 * skip, h, ids


class Head(M.Module):
    def __init__(self, seed):
        super().__init__()
        self.w = _rng_param(seed, D, C)

    @classmethod
    def parameter_count(cls, seed):
        return D * C

    def forward(self, x):
        h, skip, _ = x
        return F.matmul(h + skip, self.w)


def specs(drop=0.0):
    return [LayerSpec(Embed, 0), *[LayerSpec(Block, i + 1, drop) for i in range(6)],
            LayerSpec(Head, 9)]


def items(n, seed=5, batch=2, sizes=None):
    rng = np.random.default_rng(seed)
    sizes = sizes or [batch] * n
    return [(rng.integers(0, V, b).astype("int32"), rng.integers(0, C, b).astype("int32"))
            for b in sizes]


class Counting:
    """An iterator over a list that counts how often it was asked for an item."""

    def __init__(self, data):
        self.data, self.pulled = list(data), 0

    def __iter__(self):
        return self

    def __next__(self):
        self.pulled += 1
        return self.data[self.pulled - 1]


def reference(layers, data, micro_batches, steps, make_opt, loss_fn=F.nn.cross_entropy):
    """One process: per step, the mean loss over ``micro_batches`` items, one backward, one
    optimizer step. ``layers`` are called in order; returns the losses and the layers."""
    params = list({id(p): p for f in layers if isinstance(f, M.Module)
                   for p in f.parameters()}.values())
    opt = make_opt(params)
    gm = ad.GradManager().attach(params)
    losses = []
    for s in range(steps):
        with gm:
            total = 0.0
            for x, y in data[s * micro_batches:(s + 1) * micro_batches]:
                h = mg.tensor(x)
                for f in layers:
                    h = f(h)
                total = total + loss_fn(h, mg.tensor(y))
            loss = total / micro_batches
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    return losses, layers


def sgd(params):
    return optim.SGD(params, lr=0.2, momentum=0.9)


def state_by_layer(layers):
    """``{"3.w": array}``: the reference's parameters named like a PipelineModule's."""
    return {f"{i}.{n}": p.numpy() for i, f in enumerate(layers) if isinstance(f, M.Module)
            for n, p in f.named_parameters()}


def merged_state(results):
    """The union of every rank's ``{name: array}``; names held by several ranks must agree."""
    merged = {}
    for state in results:
        for name, value in state.items():
            if name in merged:
                np.testing.assert_array_equal(merged[name], value)
            merged[name] = value
    return merged


def assert_same_training(got_losses, got_state, ref_losses, ref_state):
    np.testing.assert_allclose(got_losses, ref_losses, rtol=1e-10, atol=0)
    assert sorted(got_state) == sorted(ref_state)
    for name, value in ref_state.items():
        np.testing.assert_allclose(got_state[name], value, rtol=1e-10, atol=1e-15, err_msg=name)


def train(net, micro_batches, schedule, data, steps=STEPS, make_opt=sgd):
    engine = PipelineEngine(net, make_opt(list(net.parameters())), micro_batches, schedule)
    it = Counting(data)
    losses = [engine.train_batch(it) for _ in range(steps)]
    return engine, losses, it.pulled


def params_of(net):
    return {n: p.numpy() for n, p in net.named_parameters()}


def micro_batches_for(stages):
    return 6 if stages < 4 else 4


# ------------------------------------------------------------------------------------------------
# Every schedule at 2, 3 and 4 stages
# ------------------------------------------------------------------------------------------------
def _all_schedules(stages):
    out = {}
    m = micro_batches_for(stages)
    for name in SCHEDULES:
        chunks = 2 if name == "interleaved" else 1
        Block.built.clear()
        net = PipelineModule(specs(), num_stages=stages, loss_fn=F.nn.cross_entropy,
                             partition_method="uniform", chunks=chunks)
        built = list(Block.built)
        _, losses, pulled = train(net, m, name, items(m * STEPS))
        own = [i for c in range(chunks) for i in net.layer_range(c)]
        out[name] = (losses, params_of(net), pulled, built, own)
    return out


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_schedule_equals_gradient_accumulation_in_one_process(stages):
    m = micro_batches_for(stages)
    ref_losses, layers = reference([s.build() for s in specs()], items(m * STEPS), m, STEPS, sgd)
    ref_state = state_by_layer(layers)
    results = run_workers(_all_schedules, stages, stages, timeout=120)
    for name in SCHEDULES:
        per_rank = [r[name] for r in results]
        for losses, *_ in per_rank:  # the same float on every rank
            assert losses == per_rank[0][0]
        assert_same_training(per_rank[0][0], merged_state([r[1] for r in per_rank]),
                             ref_losses, ref_state)
        # exactly M items per step on the first and last stages; middle stages never pull
        pulled = [r[2] for r in per_rank]
        assert pulled == [m * STEPS] + [0] * (stages - 2) + [m * STEPS], (name, pulled)
        # a LayerSpec is built only on the stage that owns it
        for built, own in (r[3:] for r in per_rank):
            assert sorted(built) == [i for i in own if 1 <= i <= 6]


# ------------------------------------------------------------------------------------------------
# Two stages: checkpointing, shapes, eval, timeline, the plain forms; a changed dtype at the end
# ------------------------------------------------------------------------------------------------
def _checkpointed_run(interval, schedule):
    mg.random.seed(100 + dist.get_rank())
    net = PipelineModule(specs(drop=0.3), num_stages=2, loss_fn=F.nn.cross_entropy,
                         partition_method="uniform", activation_checkpoint_interval=interval)
    _, losses, _ = train(net, 4, schedule, items(4 * STEPS))
    return losses, params_of(net)


def _plain_layers(form):
    """DeepSpeed's plain form: built modules and any callable (a list), or an M.Sequential."""
    mg.random.seed(3)
    if form == "list":
        return [M.Linear(4, 5), lambda x: F.tanh(x), M.Linear(5, 6), F.relu, M.Linear(6, 3)]
    return M.Sequential(M.Linear(4, 5), M.Tanh(), M.Linear(5, 6), M.ReLU(), M.Linear(6, 3))


def _plain_forms():
    out = []
    for form in ("list", "sequential"):
        net = PipelineModule(_plain_layers(form), num_stages=2, loss_fn=F.nn.cross_entropy)
        data = [(x.astype("float32"), y) for x, y in _float_items(4 * STEPS)]
        _, losses, _ = train(net, 4, "1f1b", data)
        out.append((losses, params_of(net)))
    return out


def _float_items(n):
    rng = np.random.default_rng(8)
    return [(rng.standard_normal((2, 4)), rng.integers(0, 3, 2).astype("int32")) for _ in range(n)]


def _two_stage_job(tmp):
    rank = dist.get_rank()
    out = {"ckpt": {s: (_checkpointed_run(0, s), _checkpointed_run(2, s))
                    for s in ("1f1b", "zb-h1")}}
    # micro-batches of different sizes in one step work
    net = PipelineModule(specs(), num_stages=2, loss_fn=F.nn.cross_entropy)
    engine, losses, _ = train(net, 4, "1f1b", items(8, sizes=[2, 3, 1, 2] * 2), steps=2)
    out["ragged"] = (losses, params_of(net))
    # the timeline of the last step, merged over the ranks
    timeline = engine.timeline()
    out["timeline"] = timeline
    if rank == 0:
        plot_timeline(timeline, os.path.join(tmp, "timeline.png"))
    # eval_batch of a fresh model
    net = PipelineModule(specs(drop=0.5), num_stages=2, loss_fn=F.nn.cross_entropy)
    engine = PipelineEngine(net, None, 3)
    it = Counting(items(3, seed=9))
    loss, logits = engine.eval_batch(it, return_logits=True)
    out["eval"] = (loss, None if logits is None else logits.numpy(), it.pulled, net.training)
    out["plain"] = _plain_forms()
    # last: a micro-batch whose int tensor changes dtype (the job's channels are left dirty)
    bad = items(4)
    bad[2] = (bad[2][0].astype("int64"), bad[2][1])
    net = PipelineModule(specs(), num_stages=2, loss_fn=F.nn.cross_entropy)
    engine = PipelineEngine(net, sgd(list(net.parameters())), 4)
    try:
        engine.train_batch(iter(bad))
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        out["dtype"] = f"{type(e).__name__}: {e}"
    try:
        engine.train_batch(iter(items(4)))
    except PipelineError as e:
        out["after"] = str(e)
    return out


def test_two_stages_checkpointing_shapes_eval_timeline_and_plain_forms(tmp_path):
    r0, r1 = run_workers(_two_stage_job, 2, str(tmp_path), timeout=120)
    # activation checkpointing with dropout: bitwise the same training, every schedule
    for r in (r0, r1):
        for schedule, (plain, checkpointed) in r["ckpt"].items():
            assert plain[0] == checkpointed[0], schedule
            for name, value in plain[1].items():
                assert np.array_equal(value, checkpointed[1][name]), (schedule, name)

    # micro-batches of different sizes: still plain gradient accumulation
    ref_losses, layers = reference([s.build() for s in specs()],
                                   items(8, sizes=[2, 3, 1, 2] * 2), 4, 2, sgd)
    assert r0["ragged"][0] == r1["ragged"][0]
    assert_same_training(r0["ragged"][0], merged_state([r0["ragged"][1], r1["ragged"][1]]),
                         ref_losses, state_by_layer(layers))

    # the merged timeline: both ranks, each running its schedule's compute order
    timeline = r0["timeline"]
    assert isinstance(timeline, Timeline) and timeline.ranks() == [0, 1]
    assert [(e.rank, e.action, e.start) for e in timeline] == \
        [(e.rank, e.action, e.start) for e in r1["timeline"]]
    sched = OneFOneB(2, 4)
    for rank in (0, 1):
        mine = timeline.for_rank(rank)
        assert [f"{e.action}{e.micro_batch}" for e in mine if e.is_compute] == \
            [repr(a) for a in sched.compute_order(rank)]
        assert [e.action for e in mine][-3:] == ["ReduceTiedGrads", "ReduceGrads",
                                                 "OptimizerStep"]
        assert all(a.end <= b.start + 1e-6 for a, b in zip(mine, mine[1:]))
        assert all(e.start <= e.end for e in mine)
    assert (tmp_path / "timeline.png").stat().st_size > 1000

    # eval_batch: eval mode (no dropout), the reference's mean loss and logits on the last stage
    loss0, logits0, pulled0, training0 = r0["eval"]
    loss1, logits1, pulled1, _ = r1["eval"]
    layers = [s.build() for s in specs(drop=0.5)]
    for f in layers:
        f.eval()
    outs = []
    for x, _ in items(3, seed=9):
        h = mg.tensor(x)
        for f in layers:
            h = f(h)
        outs.append(h.numpy())
    ref_loss = np.mean([F.nn.cross_entropy(mg.tensor(o), mg.tensor(y)).item()
                        for o, (_, y) in zip(outs, items(3, seed=9))])
    assert loss0 == loss1 == pytest.approx(ref_loss, rel=1e-12)
    assert logits0 is None and (pulled0, pulled1) == (3, 3) and training0
    np.testing.assert_allclose(logits1, np.concatenate(outs), rtol=1e-12)

    # the plain forms (float32 Linear layers, seeded alike in every process)
    for i, form in enumerate(("list", "sequential")):
        losses, state = r0["plain"][i]
        data = [(x.astype("float32"), y) for x, y in _float_items(4 * STEPS)]
        ref_losses, layers = reference(list(_plain_layers(form)), data, 4, STEPS, sgd)
        got = merged_state([state, r1["plain"][i][1]])
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        for name, value in state_by_layer(layers).items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6)

    # a changed dtype raises on both ranks, naming stage, micro-batch and both signatures
    assert r1["dtype"].startswith("PipelineError: PipelineEngine: stage 1 received micro-batch 2")
    assert "((2, 4) float64, (2, 4) float64, (2,) int64)" in r1["dtype"]
    assert "micro-batch 0 of this step came as ((2, 4) float64, (2, 4) float64, (2,) int32)" \
        in r1["dtype"]
    assert r0["dtype"].startswith("PipelineError: PipelineEngine: rank 0 (stage 0) stopped at")
    assert "stage 1 (rank 1) failed at RA2" in r0["dtype"]
    for r in (r0, r1):
        assert "an earlier step failed" in r["after"]


# ------------------------------------------------------------------------------------------------
# Four ranks: DP x PP against the global batch, tied weights against a single tied model
# ------------------------------------------------------------------------------------------------
class TiedEmbed(M.Module):
    def __init__(self, vocab, width, seed):
        super().__init__()
        self.weight = _rng_param(seed, vocab, width)

    def forward(self, ids):
        return self.weight[ids]


class Dense(M.Module):
    def __init__(self, seed):
        super().__init__()
        self.w = _rng_param(seed, D, D)

    def forward(self, h):
        return F.tanh(F.matmul(h, self.w))


def tied_specs():
    # the last copy is built with another seed: the engine's broadcast must replace it
    return [TiedLayerSpec("embed", TiedEmbed, V, D, seed=0),
            *[LayerSpec(Dense, i) for i in range(1, 5)],
            TiedLayerSpec("embed", TiedEmbed, V, D, seed=99,
                          forward_fn=lambda emb, h: F.matmul(h, emb.weight.T))]


def adam(params):
    return optim.Adam(params, lr=0.05)


def _four_rank_job(tmp):
    rank = dist.get_rank()
    out = {}
    # 2 stages x 2 replicas: replica r gets its own half of each global batch
    net = PipelineModule(specs(), topology=PipeDataParallelTopology(2, 2),
                         loss_fn=F.nn.cross_entropy)
    replica = net.topology.get_coord(rank).data
    data = items(8 * STEPS)
    mine = [x for s in range(STEPS) for x in data[s * 8 + replica * 4:s * 8 + replica * 4 + 4]]
    _, losses, _ = train(net, 4, "1f1b", mine)
    out["dp"] = (losses, params_of(net), replica)
    # tied embedding / LM head on the first and last of 4 stages, two schedules
    for schedule in ("1f1b", "zb-h1"):
        net = PipelineModule(tied_specs(), num_stages=4, loss_fn=F.nn.cross_entropy,
                             partition_method="uniform")
        engine, losses, _ = train(net, 4, schedule, items(4 * STEPS), make_opt=adam)
        out[schedule] = (losses, params_of(net))
    # a checkpoint load ends with every tied copy equal to the lowest owning stage's: here the
    # tied layer's file is gone, so stage 3 keeps zeros until the broadcast
    engine.save_state_dict(tmp)
    dist.comm.barrier()
    if rank == 0:
        os.remove(os.path.join(tmp, "layer_00-model_states.mgc"))
    if net.stage_id == 3:
        for w in net.tied_weights()["embed"]:
            w.set_value(np.zeros(w.shape))
    dist.comm.barrier()
    engine.load_state_dir(tmp, strict=False)
    out["loaded"] = [w.numpy() for w in net.tied_weights().get("embed", [])]
    return out


def test_dp_x_pp_equals_the_global_batch_and_tied_weights_a_single_tied_model(tmp_path):
    results = run_workers(_four_rank_job, 4, str(tmp_path), timeout=120)
    ref_losses, layers = reference([s.build() for s in specs()], items(8 * STEPS), 8, STEPS, sgd)
    assert [r["dp"][2] for r in results] == [0, 1, 0, 1]
    for r in results:
        assert r["dp"][0] == results[0]["dp"][0]
    for replica in (0, 1):  # replicas hold identical weights, equal to the global-batch run
        state = merged_state([r["dp"][1] for r in results if r["dp"][2] == replica])
        assert_same_training(results[0]["dp"][0], state, ref_losses, state_by_layer(layers))

    emb = TiedEmbed(V, D, seed=0)
    tied = [emb, *[Dense(i) for i in range(1, 5)], lambda h: F.matmul(h, emb.weight.T)]
    ref_losses, tied = reference(tied, items(4 * STEPS), 4, STEPS, adam)
    ref_state = state_by_layer(tied)
    for schedule in ("1f1b", "zb-h1"):
        per_rank = [r[schedule] for r in results]
        assert all(p[0] == per_rank[0][0] for p in per_rank)
        # both copies of the embedding ("0.weight" on stages 0 and 3) equal the single one
        assert "0.weight" in per_rank[0][1] and "0.weight" in per_rank[3][1]
        assert_same_training(per_rank[0][0], merged_state([p[1] for p in per_rank]),
                             ref_losses, ref_state)
    saved = results[0]["zb-h1"][1]["0.weight"]
    assert [len(r["loaded"]) for r in results] == [1, 0, 0, 1]
    for r in (results[0], results[3]):
        np.testing.assert_array_equal(r["loaded"][0], saved)


# ------------------------------------------------------------------------------------------------
# The program of issue 12, as users write it (sizes shrunk)
# ------------------------------------------------------------------------------------------------
class UserBlock(M.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = M.Linear(width, width)

    def forward(self, h):
        return h + F.relu(self.fc(h))


def test_what_users_write_runs_as_written():
    Block = UserBlock  # noqa: N806 - the issue's name
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, 40).astype("int32")
    dataset = ArrayDataset(tokens, (tokens + 1) % 32)
    loader = DataLoader(dataset, SequentialSampler(dataset, batch_size=4))  # built here: unsharded

    @dist.launcher(n_gpus=4)                                   # 2 stages x 2 replicas
    def main():
        specs = [TiedLayerSpec("embed", M.Embedding, 32, 8),
                 *[LayerSpec(Block, 8) for _ in range(6)],
                 LayerSpec(M.LayerNorm, 8),
                 TiedLayerSpec("embed", M.Embedding, 32, 8,
                               forward_fn=lambda emb, h: F.matmul(h, emb.weight.T))]
        net = PipelineModule(layers=specs, num_stages=2, loss_fn=F.nn.cross_entropy,
                             partition_method="type:block")
        engine = PipelineEngine(net, optim.Adam(net.parameters(), lr=1e-2), micro_batches=8,
                                schedule="1f1b")
        data = iter(RepeatingLoader(loader))
        losses = []
        for step in range(4):  # noqa: B007 - as the issue writes it
            loss = engine.train_batch(data)                    # the same float on every rank
            losses.append(loss)
        return losses, net.parts, [w.numpy() for w in net.tied_weights()["embed"]]

    results = main()
    losses, parts, _ = results[0]
    assert parts == [0, 4, 9]
    assert all(r[0] == losses for r in results)
    assert losses[-1] < losses[0]
    # the embedding's copies on stage 0 (ranks 0, 1) and stage 1 (ranks 2, 3) stay identical
    copies = [r[2][0] for r in results]
    assert all(np.array_equal(c, copies[0]) for c in copies)


# ------------------------------------------------------------------------------------------------
# Configuration errors before any communication; a failing layer; a dying rank
# ------------------------------------------------------------------------------------------------
def _clean_channels():
    """A collective and a ring of point-to-point messages: fails if anything is left over."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total = dist.comm.all_reduce(np.ones(1))
    dist.comm.send(np.array([rank]), (rank + 1) % world)
    got = dist.comm.recv((rank - 1) % world)
    return float(total[0]) == world and int(got[0]) == (rank - 1) % world


class ReturnsList(M.Module):
    def forward(self, h):
        return [h, h]


def _config_errors():
    messages = []
    cases = [
        lambda: PipelineModule(specs(), num_stages=2),
        lambda: PipelineEngine(PipelineModule(specs(), num_stages=3, chunks=2,
                                              partition_method="uniform"), None, 4,
                               "interleaved"),
        lambda: PipelineModule(specs(), num_stages=3, partition_method="type:attention"),
    ]
    for case in cases:
        try:
            case()
        except (ValueError, TypeError) as e:
            messages.append(str(e))
        messages.append(_clean_channels())
    # a layer returning a list on stage 1: every rank fails with a clear error
    layers = [M.Linear(4, 4), M.Linear(4, 4), ReturnsList(), M.Linear(4, 3)]
    net = PipelineModule(layers, num_stages=3, loss_fn=F.nn.cross_entropy,
                         partition_method=[0, 1, 3, 4])
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), 2)
    data = [(x.astype("float32"), y) for x, y in _float_items(2)]
    try:
        engine.train_batch(iter(data))
    except Exception as e:  # noqa: BLE001
        messages.append(f"{type(e).__name__}: {e}")
    return messages


def test_bad_configurations_raise_on_every_rank_before_any_communication():
    results = run_workers(_config_errors, 3, timeout=60)
    for r in results:
        assert r[0] == "PipelineModule: num_stages (2) must divide the world size (3)"
        assert "micro_batches" in r[2] and "4" in r[2] and "3" in r[2]
        assert "regex 'attention' matches no layer class" in r[4]
        assert r[1] is True and r[3] is True and r[5] is True
    assert results[1][6].startswith("TypeError: PipelineModule: the output of layer 2 "
                                    "(ReturnsList) is a list")
    for rank in (0, 2):
        assert results[rank][6].startswith(f"PipelineError: PipelineEngine: rank {rank} "
                                           f"(stage {rank}) stopped at")
        assert "stage 1 (rank 1) failed at F0 of step 0: TypeError: PipelineModule: the " \
               "output of layer 2 (ReturnsList) is a list" in results[rank][6]


def _dies_mid_step():
    net = PipelineModule(specs(), num_stages=2, loss_fn=F.nn.cross_entropy)
    engine = PipelineEngine(net, sgd(list(net.parameters())), 4)
    data = iter(items(40))
    engine.train_batch(data)
    if dist.get_rank() == 1:
        def dying(x, chunk=0):
            os._exit(3)

        net.forward = dying  # the next forward of this stage kills the process
    engine.train_batch(data)
    engine.train_batch(data)


def test_a_rank_that_dies_mid_step_ends_the_job_naming_it():
    start = time.monotonic()
    with pytest.raises(dist.LaunchError) as info:
        run_workers(_dies_mid_step, 2, timeout=60)
    assert time.monotonic() - start < 30
    assert info.value.rank == 1 and "rank 1" in str(info.value) and "exit code 3" in str(info.value)


# ------------------------------------------------------------------------------------------------
# One process: one stage (chunks handed over locally), misuse
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1),
                                              ("interleaved", 2), ("interleaved", 3)])
def test_one_stage_in_one_process_equals_gradient_accumulation(schedule, chunks):
    net = PipelineModule(specs(), num_stages=1, loss_fn=F.nn.cross_entropy, chunks=chunks,
                         partition_method="uniform")
    _, losses, pulled = train(net, 3, schedule, items(3 * STEPS))
    ref_losses, layers = reference([s.build() for s in specs()], items(3 * STEPS), 3, STEPS, sgd)
    assert_same_training(losses, params_of(net), ref_losses, state_by_layer(layers))
    assert pulled == 3 * STEPS


def test_misuse_raises_clear_errors():
    net = PipelineModule(specs(), num_stages=1, loss_fn=F.nn.cross_entropy)
    x = mg.tensor(items(1)[0][0])
    net(x)  # before an engine drives it, a stage can be run by hand
    engine = PipelineEngine(net, sgd(list(net.parameters())), 2)
    for call in (engine.forward, engine.backward, engine.step, engine):
        with pytest.raises(PipelineError, match="only train_batch\\(\\) is accessible in "
                                                "pipeline mode"):
            call(x)
    with pytest.raises(PipelineError, match="driven by a PipelineEngine; only "
                                            "engine.train_batch\\(\\) and engine.eval_batch"):
        net(x)
    with ad.no_grad(), pytest.raises(PipelineError, match="under no_grad.*use "
                                                          "engine.eval_batch"):
        engine.train_batch(iter(items(2)))
    with pytest.raises(TypeError, match="data_iter must be an iterator of \\(inputs, labels\\)"):
        engine.train_batch(items(2))
    engine = PipelineEngine(net, sgd(list(net.parameters())), 2)
    with pytest.raises(PipelineError, match="data_iter ran out after 1 of 2 micro-batches"):
        engine.train_batch(iter(items(1)))
    engine = PipelineEngine(net, sgd(list(net.parameters())), 2)
    with pytest.raises(TypeError, match="micro-batch 0 from data_iter is a ndarray; expected a "
                                        "pair"):
        engine.train_batch(iter([np.ones(3)]))


def test_engine_configuration_errors():
    net = PipelineModule(specs(), num_stages=1, loss_fn=F.nn.cross_entropy)
    other = mg.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="optimizer holds 1 parameter\\(s\\) that are not this "
                                         "stage's"):
        PipelineEngine(net, optim.SGD([other], lr=0.1), 2)
    with pytest.raises(ValueError, match="micro_batches must be a positive integer, got 0"):
        PipelineEngine(net, None, 0)
    with pytest.raises(ValueError, match="inference schedule"):
        PipelineEngine(net, None, 2, "inference")
    with pytest.raises(ValueError, match="OneFOneB: chunks must be 1"):
        PipelineEngine(PipelineModule(specs(), num_stages=1, chunks=2), None, 2, "1f1b")
    with pytest.raises(ValueError, match="does not match the pipeline"):
        PipelineEngine(net, None, 2, get_schedule("gpipe", 1, 3))
    with pytest.raises(ValueError, match="needs 2 ranks but the job has 1 .*dist.launcher"):
        PipelineEngine(PipelineModule(specs(), num_stages=2, stage_id=0), None, 2)
    with pytest.raises(TypeError, match="module must be a PipelineModule"):
        PipelineEngine(M.Linear(2, 2), None, 2)
    bad = PipelineModule(specs(), num_stages=1, loss_fn=lambda out, y: out)
    with pytest.raises(PipelineError, match="loss_fn\\(outputs, labels\\) of micro-batch 0 gave "
                                            "a Tensor of shape \\(2, 3\\)"):
        PipelineEngine(bad, sgd(list(bad.parameters())), 2).train_batch(iter(items(2)))


# ------------------------------------------------------------------------------------------------
# ZeRO-1 over the data-parallel axis
# ------------------------------------------------------------------------------------------------
def _dp_x_pp(make_opt, **engine_options):
    """2 stages x 2 replicas: this rank's engine (4 micro-batches, 1F1B), its replica and its
    replica's items (4 of every 8)."""
    net = PipelineModule(specs(), topology=PipeDataParallelTopology(2, 2),
                         loss_fn=F.nn.cross_entropy)
    replica = net.topology.get_coord(dist.get_rank()).data
    data = items(8 * STEPS)
    mine = [x for s in range(STEPS) for x in data[s * 8 + replica * 4:s * 8 + replica * 4 + 4]]
    engine = PipelineEngine(net, make_opt(list(net.parameters())), 4, "1f1b", **engine_options)
    return engine, net, replica, mine


def _zero_job(zero_stage):
    engine, net, replica, mine = _dp_x_pp(adam, zero_stage=zero_stage)
    losses = [engine.train_batch(Counting(mine[s * 4:(s + 1) * 4])) for s in range(STEPS)]
    state_bytes = engine.optimizer.local_state_bytes() if zero_stage else None
    return losses, params_of(net), replica, state_bytes


def test_zero1_x_pp_equals_plain_dp_x_pp_and_the_global_batch():
    plain = run_workers(_zero_job, 4, 0, timeout=120)
    zero = run_workers(_zero_job, 4, 1, timeout=120)
    ref_losses, layers = reference([s.build() for s in specs()], items(8 * STEPS), 8, STEPS, adam)
    for (lz, pz, rz, sb), (lp, pp, rp, _) in zip(zero, plain):
        assert rz == rp and lz == lp
        for name, value in pp.items():
            np.testing.assert_array_equal(pz[name], value, err_msg=name)  # bit for bit
        full = 2 * 8 * sum(v.size for v in pp.values())  # Adam: two float64 moments
        assert sb <= full / 2 + 2 * 8 * 2 * len(pp)  # half the stage's state, plus padding
    for replica in (0, 1):
        state = merged_state([r[1] for r in zero if r[2] == replica])
        assert_same_training(zero[0][0], state, ref_losses, state_by_layer(layers))


def _reduce_dtype_job(reduce_dtype):
    engine, net, _, mine = _dp_x_pp(sgd, reduce_dtype=reduce_dtype)
    engine.train_batch(Counting(mine[:4]))
    return params_of(net)


def test_reduce_dtype_all_reduces_the_data_parallel_gradients_in_that_dtype():
    exact = run_workers(_reduce_dtype_job, 4, None, timeout=120)
    low = run_workers(_reduce_dtype_job, 4, "float32", timeout=120)
    for e, lo in zip(exact, low):
        assert e.keys() == lo.keys() and e
        for name, value in e.items():  # one SGD step: the gradients' float32 rounding shows
            assert lo[name].dtype == value.dtype == np.float64
            np.testing.assert_allclose(lo[name], value, rtol=1e-6, atol=1e-8, err_msg=name)
        assert any(not np.array_equal(lo[n], v) for n, v in e.items())  # float32 on the wire
    net = PipelineModule(specs(), num_stages=1, loss_fn=F.nn.cross_entropy)
    with pytest.raises(ValueError, match="PipelineEngine: reduce_dtype must be a floating dtype, "
                                         "got int32"):
        PipelineEngine(net, sgd(list(net.parameters())), 2, reduce_dtype="int32")


def test_zero_stages_2_and_3_are_refused_with_the_reason():
    net = PipelineModule(specs(), num_stages=1, loss_fn=F.nn.cross_entropy)
    for stage in (2, 3):
        with pytest.raises(ValueError, match=f"zero_stage={stage} is not supported with pipeline "
                           "parallelism.*conflicts with the pipeline accumulating"):
            PipelineEngine(net, sgd(list(net.parameters())), 2, zero_stage=stage)
