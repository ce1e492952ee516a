"""PipelineModule: lazy per-stage construction, partitioning, tied layers, chaining, checkpoints
keyed by global layer index, and configuration errors raised before any communication.

Stages are built in one process through the ``stage_id=`` seam; one multi-process test checks
that ranks pick their stage from the topology and reject a bad configuration on every rank.
"""

import itertools
import logging

import numpy as np
import pytest

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.functional as F
import minigrad.module as M
from minigrad.distributed.mesh.topology import PipeDataParallelTopology, ProcessTopology
from minigrad.distributed.pipeline import LayerSpec, PipelineModule, TiedLayerSpec
from minigrad.distributed.pipeline.module import (
    layer_state_path,
    load_layer_states,
    save_layer_states,
)
from minigrad.distributed.pipeline.partition import (
    partition_balanced,
    partition_balanced_nonempty,
    partition_uniform,
    partition_uniform_nonempty,
)
from minigrad.testing.distributed import run_workers


class Counted(M.Module):
    """A layer that records every construction (its index), and reports its parameter count
    from its arguments so that the "parameters" partition never has to build it."""

    built: list = []

    def __init__(self, index: int, width: int = 3):
        super().__init__()
        Counted.built.append(index)
        self.fc = M.Linear(width, width)

    @classmethod
    def parameter_count(cls, index: int, width: int = 3) -> int:
        return width * width + width

    def forward(self, x):
        return F.tanh(self.fc(x))


class CountedEmbedding(M.Embedding):
    built = 0

    def __init__(self, *args, **kwargs):
        CountedEmbedding.built += 1
        super().__init__(*args, **kwargs)


def stages_of(layers, num_stages, **kwargs):
    return [PipelineModule(layers, num_stages=num_stages, stage_id=s, **kwargs)
            for s in range(num_stages)]


def run_pipeline(stages, x, chunks=1):
    """Chain the stages' parts in logical-stage order: chunk 0 of every stage, then chunk 1..."""
    for c, stage in itertools.product(range(chunks), stages):
        x = stage(x, chunk=c)
    return x


# -- lazy construction ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_stages, chunks", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2)])
def test_a_layer_spec_is_built_only_on_the_stage_that_owns_it(num_stages, chunks):
    specs = [LayerSpec(Counted, i) for i in range(7)]
    owned = []
    for s in range(num_stages):
        Counted.built.clear()
        net = PipelineModule(specs, num_stages=num_stages, chunks=chunks, stage_id=s)
        mine = [i for c in range(chunks) for i in net.layer_range(c)]
        assert Counted.built == mine
        assert [n.split(".")[0] for n, _ in net.named_parameters()][::2] == [str(i) for i in mine]
        owned += mine
    assert sorted(owned) == list(range(7))


def test_chunks_give_rank_r_the_parts_r_r_plus_s():
    specs = [LayerSpec(Counted, i) for i in range(8)]
    nets = stages_of(specs, 2, chunks=2, partition_method="uniform")
    assert nets[0].parts == [0, 2, 4, 6, 8]
    assert [list(nets[0].layer_range(c)) for c in range(2)] == [[0, 1], [4, 5]]
    assert [list(nets[1].layer_range(c)) for c in range(2)] == [[2, 3], [6, 7]]
    with pytest.raises(ValueError, match=r"chunk 2 is outside \[0, 2\)"):
        nets[0](mg.tensor(np.ones((1, 3))), chunk=2)


# -- partitioning --------------------------------------------------------------------------------
def test_uniform_partition():
    assert partition_uniform_nonempty(10, 4) == [0, 3, 6, 8, 10]
    net = PipelineModule([M.Identity() for _ in range(10)], num_stages=4, stage_id=0,
                         partition_method="uniform")
    assert net.parts == [0, 3, 6, 8, 10]


def brute_force_bottleneck(weights, parts):
    best = None
    for cuts in itertools.combinations(range(1, len(weights)), parts - 1):
        bounds = [0, *cuts, len(weights)]
        worst = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_balanced_partition_minimises_the_largest_part():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        parts = int(rng.integers(1, n + 1))
        weights = [int(w) for w in rng.integers(0, 20, n) * rng.integers(0, 2, n)]
        bounds = partition_balanced_nonempty(weights, parts)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == parts + 1
        assert all(a < b for a, b in zip(bounds, bounds[1:]))
        worst = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert worst == brute_force_bottleneck(weights, parts), (weights, parts, bounds)
    assert partition_balanced_nonempty([4, 1, 1, 1, 1, 4], 3) == [0, 1, 5, 6]


def test_deepspeed_partition_functions_give_deepspeed_results():
    """DeepSpeed's ``partition_uniform``/``partition_balanced``: fewer items than parts leave the
    last parts empty; the balanced fill takes all that fits, so late parts may come out empty."""
    assert partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert partition_uniform(2, 4) == [0, 1, 2, 2, 2]
    assert partition_uniform(0, 2) == [0, 0, 0]
    assert partition_balanced([1, 1], 4) == [0, 1, 2, 2, 2]
    assert partition_balanced([1] * 16, 4) == [0, 4, 8, 12, 16]
    assert partition_balanced([1, 1, 1, 1], 3) == [0, 2, 4, 4]  # bottleneck 2, third part empty
    assert partition_balanced([0, 1, 2, 3, 3, 3], 4) == [0, 3, 4, 5, 6]
    assert partition_balanced([0.0, 1.1, 1.9, 3.0, 3.0, 3.0], 4) == [0, 3, 4, 5, 6]
    assert partition_balanced([4, 1, 1, 1, 1, 4], 3) == [0, 1, 5, 6]
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, parts = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        weights = [int(w) for w in rng.integers(0, 20, n)]
        bounds = partition_balanced(weights, parts)
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == parts + 1
        assert all(a <= b for a, b in zip(bounds, bounds[1:]))
        if n <= parts:
            continue
        sums = [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])]
        # the smallest bottleneck of a fill that may leave parts empty ...
        best = min(max(sum(weights[a:b]) for a, b in zip(c, c[1:]))
                   for cuts in itertools.combinations_with_replacement(range(n + 1), parts - 1)
                   for c in [[0, *cuts, n]])
        assert max(sums) == best, (weights, parts, bounds)
        # ... reached by filling each part with all that fits under it
        for p in range(parts - 1):
            if bounds[p + 1] < n:
                assert sums[p] + weights[bounds[p + 1]] > best
        # with no empty part it is the partition a PipelineModule uses
        if all(a < b for a, b in zip(bounds, bounds[1:])):
            assert bounds == partition_balanced_nonempty(weights, parts)


def test_parameters_partition_counts_specs_without_building_them():
    specs = [LayerSpec(M.Linear, 4, 4), LayerSpec(M.ReLU), LayerSpec(M.Linear, 4, 16),
             M.ReLU(), LayerSpec(M.Linear, 16, 4), lambda x: x, LayerSpec(M.Linear, 4, 2)]
    # parameter counts 20, 0, 80, 0, 68, 0, 10: the best split of 2 has largest part 100
    net = PipelineModule(specs, num_stages=2, stage_id=1)
    assert net.parts == [0, 4, 7]
    Counted.built.clear()
    counted = [LayerSpec(Counted, i, width=w) for i, w in enumerate([1, 1, 1, 6])]
    assert PipelineModule(counted, num_stages=2, stage_id=0).parts == [0, 3, 4]
    assert Counted.built == [0, 1, 2]


@pytest.mark.parametrize("spec", [
    LayerSpec(M.Linear, 3, 4), LayerSpec(M.Linear, 3, 4, bias=False),
    LayerSpec(M.Embedding, 5, 3), LayerSpec(M.LayerNorm, (2, 3)),
    LayerSpec(M.LayerNorm, 4, affine=False), LayerSpec(M.GroupNorm, 2, 4),
    LayerSpec(M.BatchNorm1d, 3), LayerSpec(M.BatchNorm2d, 3, affine=False),
    LayerSpec(M.Conv1d, 2, 4, 3), LayerSpec(M.Conv2d, 2, 4, (3, 2), groups=2),
    LayerSpec(M.Conv2d, 2, 4, 3, bias=False), LayerSpec(M.ConvTranspose2d, 4, 2, 3, groups=2),
    LayerSpec(M.MultiHeadAttention, 8, 2), LayerSpec(M.MultiHeadAttention, 8, 2, bias=False),
    LayerSpec(M.ReLU), LayerSpec(M.Dropout, 0.1), LayerSpec(M.MaxPool2d, 2),
    LayerSpec(M.Flatten), LayerSpec(M.Softmax), LayerSpec(M.AdaptiveAvgPool2d, 1),
])
def test_known_parameter_counts_match_the_built_layer(spec):
    assert spec.num_parameters() == sum(p.size for p in spec.build().parameters())


@pytest.mark.parametrize("cls, args, kwargs", [
    (M.Linear, (3, 4), {}), (M.Linear, (3, 4, False), {}), (M.Embedding, (5, 3), {}),
    (M.LayerNorm, ((2, 3),), {}), (M.LayerNorm, (4, 1e-5, False), {}),
    (M.GroupNorm, (2, 4), {"affine": False}), (M.BatchNorm1d, (3, 1e-5, 0.9, False), {}),
    (M.BatchNorm2d, (5,), {}), (M.Conv1d, (2, 4, 3), {"bias": False}),
    (M.Conv2d, (2, 4, (3, 2), 1, 0, 1, 2, False), {}),
    (M.ConvTranspose2d, (4, 2, 3, 2, 1, 1, 1, 2), {}),
    (M.MultiHeadAttention, (8, 2, 0.0, False), {}), (M.LeakyReLU, (0.2,), {}),
    (M.AvgPool2d, (2,), {}), (M.Identity, (), {}), (M.GELU, (), {}),
])
def test_layers_count_their_parameters_from_constructor_arguments(cls, args, kwargs):
    # positional arguments bind as the constructor binds them (ConvTranspose2d's groups is 8th)
    expected = sum(p.size for p in cls(*args, **kwargs).parameters())
    assert cls.count_parameters(*args, **kwargs) == expected
    assert LayerSpec(cls, *args, **kwargs).num_parameters() == expected


def test_unknown_parameter_counts_are_counted_by_building_once():
    """DeepSpeed builds each LayerSpec once to count its trainable parameters and discards it:
    the "parameters" partition then works for any layer, as DeepSpeed programs expect."""
    class Block(M.Module):
        built = 0

        def __init__(self, width):
            super().__init__()
            Block.built += 1
            self.fc = M.Linear(width, width)
            self.frozen = mg.Parameter(np.zeros(50, np.float32)).requires_grad_(False)

    class MyLinear(M.Linear):          # a subclass may take other arguments: not guessed
        pass

    assert LayerSpec(Block, 4).num_parameters() is None
    assert LayerSpec(MyLinear, 4, 4).num_parameters() is None
    specs = [LayerSpec(Block, 4), LayerSpec(Block, 2), LayerSpec(Block, 2), LayerSpec(Block, 2),
             LayerSpec(MyLinear, 2, 2)]
    net = PipelineModule(specs, num_stages=2, stage_id=1)
    # trainable counts 20, 6, 6, 6, 6 (the frozen 50 are not counted): best split [0, 1, 5]
    assert net.parts == [0, 1, 5]
    assert Block.built == 4 + 3  # each spec once to count, then stage 1's own three
    assert specs[0].count_by_building() == 20 and Block.built == 7  # the count is kept
    assert "| 20" in net.partition_table()  # the table shows the counts, building nothing
    assert Block.built == 7
    # counting drew nothing from the generators the program sees: the stage's own layers get
    # the weights they get when no count is needed (explicit bounds)
    weights = []
    for method in ("parameters", [0, 1, 2]):
        mg.random.seed(7)
        stage = PipelineModule([LayerSpec(Block, 4), LayerSpec(Block, 3)], num_stages=2,
                               stage_id=1, partition_method=method)
        assert stage.parts == [0, 1, 2]
        weights.append([p.numpy() for p in stage.parameters()])
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_type_partition_weights_matching_layer_classes():
    class Block(Counted):
        pass

    specs = [TiedLayerSpec("embed", M.Embedding, 16, 3),
             *[LayerSpec(Block, i) for i in range(6)],
             LayerSpec(M.LayerNorm, 3),
             TiedLayerSpec("embed", M.Embedding, 16, 3, forward_fn=lambda e, h: h)]
    for method in ("type:block", "type:BLOCK", "type:^bl"):
        assert PipelineModule(specs, num_stages=2, stage_id=0, partition_method=method).parts == [
            0, 4, 9]
    assert PipelineModule(specs, num_stages=3, stage_id=0,
                          partition_method="type:block|layernorm").parts == [0, 4, 7, 9]
    with pytest.raises(ValueError, match=r"the regex 'transformer' matches no layer class"):
        PipelineModule(specs, num_stages=2, stage_id=0, partition_method="type:transformer")


def test_explicit_bounds_and_partition_errors():
    layers = [M.Identity() for _ in range(5)]
    assert PipelineModule(layers, num_stages=2, stage_id=1, partition_method=[0, 1, 5]).parts == [
        0, 1, 5]
    for bad in ([0, 5], [1, 2, 5], [0, 2, 6], [0, 0, 5], [0, 2.5, 5]):
        with pytest.raises(ValueError, match="partition bounds .* are invalid"):
            PipelineModule(layers, num_stages=2, stage_id=0, partition_method=bad)
    with pytest.raises(ValueError, match="5 layers cannot fill 6 pipeline parts"):
        PipelineModule(layers, num_stages=3, chunks=2, stage_id=0)
    with pytest.raises(ValueError, match="unknown partition_method 'profile'"):
        PipelineModule(layers, num_stages=2, stage_id=0, partition_method="profile")


def test_rank_zero_logs_the_partition_table(caplog):
    specs = [LayerSpec(M.Linear, 4, 4), LayerSpec(M.ReLU), LayerSpec(M.Linear, 4, 4),
             lambda x: x]
    with caplog.at_level(logging.INFO, logger="minigrad.distributed.pipeline"):
        PipelineModule(specs, num_stages=2, stage_id=1)
    assert caplog.records[-1].getMessage().splitlines() == [
        "PipelineModule: 4 layers over 2 stages (partition_method='parameters')",
        "stage | chunk | layers | names            | parameters",
        "------+-------+--------+------------------+-----------",
        "0     | 0     | 0-1    | Linear, ReLU     | 20",
        "1     | 0     | 2-3    | Linear, <lambda> | 20",
    ]


# -- running the stages --------------------------------------------------------------------------
def test_stages_chained_equal_the_sequential_model(tmp_path):
    mg.random.seed(1)
    seq = M.Sequential(M.Linear(4, 6), M.Tanh(), M.Linear(6, 6), M.Tanh(), M.Linear(6, 3))
    specs = [LayerSpec(M.Linear, 4, 6), LayerSpec(M.Tanh), LayerSpec(M.Linear, 6, 6),
             LayerSpec(M.Tanh), LayerSpec(M.Linear, 6, 3)]
    save_layer_states(seq.state_dict(), str(tmp_path))
    x = mg.tensor(np.random.default_rng(0).standard_normal((5, 4)).astype("float32"))
    expected = seq(x).numpy()
    for num_stages, chunks in [(1, 1), (2, 1), (3, 1), (2, 2)]:
        nets = [net.load_state_dir(str(tmp_path))
                for net in stages_of(specs, num_stages, chunks=chunks, partition_method="uniform")]
        np.testing.assert_array_equal(run_pipeline(nets, x, chunks).numpy(), expected)


def test_layers_may_pass_tuples_but_nothing_else():
    layers = [M.Linear(2, 2), lambda x: (x, x * 2), lambda xy: xy[0] + xy[1]]
    x = mg.tensor(np.ones((1, 2), "float32"))
    nets = stages_of(layers, 3, partition_method="uniform")
    out = run_pipeline(nets, x)
    np.testing.assert_allclose(out.numpy(), 3 * layers[0](x).numpy())
    assert isinstance(nets[1](layers[0](x)), tuple)
    net = PipelineModule([M.Linear(2, 2), lambda x: [x]], num_stages=1)
    with pytest.raises(TypeError, match=r"the output of layer 1 \(<lambda>\) is a list; pipeline "
                                        r"layers take and return a Tensor or a tuple of Tensors"):
        net(x)
    net = PipelineModule([lambda x: (x, 3)], num_stages=1)
    with pytest.raises(TypeError, match=r"layer 0 \(<lambda>\) is a tuple of \(Tensor, int\)"):
        net(x)
    with pytest.raises(TypeError, match="the input of layer 0 is a str"):
        net("x")


def test_sequential_is_accepted_as_its_layers():
    seq = M.Sequential(M.Linear(2, 3), M.ReLU(), M.Linear(3, 2))
    net = PipelineModule(seq, num_stages=2, stage_id=1)
    assert net.parts == [0, 2, 3]
    assert net.state_dict().keys() == {"2.weight", "2.bias"}
    assert net.state_dict()["2.weight"] is not seq[2].weight.numpy()
    np.testing.assert_array_equal(net.state_dict()["2.weight"], seq.state_dict()["2.weight"])


# -- tied layers ---------------------------------------------------------------------------------
def tied_specs(cls=M.Embedding):
    return [TiedLayerSpec("embed", cls, 10, 4),
            LayerSpec(M.Linear, 4, 4),
            LayerSpec(M.Tanh),
            TiedLayerSpec("embed", cls, 10, 4, forward_fn=lambda emb, h: F.matmul(h, emb.weight.T))]


def test_a_tied_layer_is_built_once_per_owning_stage():
    CountedEmbedding.built = 0
    net = PipelineModule(tied_specs(CountedEmbedding), num_stages=1, partition_method="uniform")
    assert CountedEmbedding.built == 1
    assert [n for n, _ in net.named_parameters()] == ["0.weight", "1.weight", "1.bias"]
    assert net.tie_groups() == {"embed": (0,)}
    tokens = mg.tensor(np.array([1, 7, 3]), dtype="int32")
    emb, lin = net.state_dict()["0.weight"], getattr(net, "1")
    hidden = np.tanh(emb[[1, 7, 3]] @ lin.weight.numpy().T + lin.bias.numpy())
    np.testing.assert_allclose(net(tokens).numpy(), hidden @ emb.T, rtol=1e-5, atol=1e-6)


def test_tied_copies_tie_groups_and_ranks():
    CountedEmbedding.built = 0
    topology = PipeDataParallelTopology(num_pp=3, num_dp=2)
    nets = [PipelineModule(tied_specs(CountedEmbedding), topology=topology, stage_id=s,
                           partition_method=[0, 1, 3, 4]) for s in range(3)]
    assert CountedEmbedding.built == 2                          # stages 0 and 2 only
    assert [net.tie_groups() for net in nets] == [{"embed": (0, 2)}] * 3
    assert [list(net.tied_weights()) for net in nets] == [["embed"], [], ["embed"]]
    assert nets[2].tied_weights()["embed"][0] is getattr(nets[2], "0").weight
    assert [n for n, _ in nets[2].named_parameters()] == ["0.weight"]
    assert nets[0].tie_group_ranks("embed") == [[0, 4], [1, 5]]
    assert nets[1].pipeline_ranks() == [0, 2, 4]
    assert nets[0].tied_layer_index("embed") == 0
    with pytest.raises(TypeError, match="tied_weight_attr must be a name or a list of names"):
        TiedLayerSpec("k", M.Linear, 2, 2, tied_weight_attr=[])
    spec = TiedLayerSpec("k", M.Linear, 2, 2, tied_weight_attr=["weight", "bias"])
    net = PipelineModule([spec], num_stages=1)
    assert net.tied_weights()["k"] == [getattr(net, "0").weight, getattr(net, "0").bias]


# -- checkpoints ---------------------------------------------------------------------------------
def test_checkpoint_by_global_layer_index_loads_with_other_stage_counts(tmp_path):
    mg.random.seed(2)
    saved = stages_of(tied_specs(), 2, partition_method=[0, 3, 4])
    # what the engine's broadcast from the lowest owning stage does at start:
    saved[1].tied_weights()["embed"][0].set_value(saved[0].tied_weights()["embed"][0].numpy())
    written = [net.save_state_dict(str(tmp_path)) for net in saved]
    assert written == [[layer_state_path(str(tmp_path), 0), layer_state_path(str(tmp_path), 1)],
                       []]                        # stage 1 only holds a copy of tied layer 0
    state = load_layer_states(str(tmp_path))
    assert list(state) == ["0.weight", "1.weight", "1.bias"]
    tokens = mg.tensor(np.array([[2, 5]]), dtype="int32")
    expected = run_pipeline(saved, tokens).numpy()
    for num_stages in (1, 3, 4):
        loaded = [net.load_state_dir(str(tmp_path))
                  for net in stages_of(tied_specs(), num_stages, partition_method="uniform")]
        np.testing.assert_array_equal(run_pipeline(loaded, tokens).numpy(), expected)
        np.testing.assert_array_equal(loaded[-1].tied_weights()["embed"][0].numpy(),
                                      state["0.weight"])


def test_a_pipeline_checkpoint_loads_into_a_plain_sequential(tmp_path):
    specs = [LayerSpec(M.Linear, 3, 5), LayerSpec(M.ReLU), LayerSpec(M.Linear, 5, 2)]
    for net in stages_of(specs, 3, partition_method="uniform"):
        net.save_state_dict(str(tmp_path))
    seq = M.Sequential(M.Linear(3, 5), M.ReLU(), M.Linear(5, 2))
    seq.load_state_dict(load_layer_states(str(tmp_path)))
    nets = [net.load_state_dir(str(tmp_path))
            for net in stages_of(specs, 3, partition_method="uniform")]
    x = mg.tensor(np.ones((2, 3), "float32"))
    np.testing.assert_array_equal(seq(x).numpy(), run_pipeline(nets, x).numpy())


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no layer_\\*-model_states.mgc"):
        load_layer_states(str(tmp_path))
    with pytest.raises(ValueError, match="'fc.weight' does not start with a layer index"):
        save_layer_states({"fc.weight": np.ones(2)}, str(tmp_path))
    net = PipelineModule([LayerSpec(M.Linear, 2, 2)], num_stages=1)
    with pytest.raises(FileNotFoundError, match="stage 0 needs layer 0, but .*layer_00-model_st"):
        net.load_state_dir(str(tmp_path))


# -- configuration errors ------------------------------------------------------------------------
def test_configuration_errors_are_raised_before_anything_is_built():
    layers = [LayerSpec(Counted, i) for i in range(4)]
    Counted.built.clear()
    cases = [
        (dict(num_stages=2), ValueError, r"num_stages \(2\) must divide the world size \(1\)"),
        (dict(), ValueError, "give num_stages or topology"),
        (dict(num_stages=3, topology=PipeDataParallelTopology(2, 1)), ValueError,
         r"num_stages \(3\) differs from the topology's pipe dimension \(2\)"),
        (dict(topology=ProcessTopology(["data"], [2])), ValueError, "with a 'pipe' axis"),
        (dict(topology=PipeDataParallelTopology(2, 2)), ValueError,
         "needs 4 ranks, but the world size is 1"),
        (dict(num_stages=2, stage_id=2), ValueError, r"stage_id 2 is outside \[0, 2\)"),
        (dict(num_stages=1, chunks=0), ValueError, "chunks must be an integer >= 1, got 0"),
        (dict(num_stages=1, activation_checkpoint_interval=-1), ValueError,
         "activation_checkpoint_interval must be an integer >= 0"),
        (dict(num_stages=1, loss_fn=M.Linear(2, 2)), TypeError, "loss_fn has parameters"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            PipelineModule(layers, **kwargs)
    assert Counted.built == []
    with pytest.raises(ValueError, match="layers is empty"):
        PipelineModule([], num_stages=1)
    with pytest.raises(TypeError, match="layer 1 is a int; expected a LayerSpec"):
        PipelineModule([M.ReLU(), 3], num_stages=1)
    with pytest.raises(TypeError, match="layers must be a list"):
        PipelineModule(M.ReLU(), num_stages=1)
    with pytest.raises(TypeError, match="LayerSpec: expected a Module subclass"):
        LayerSpec(np.ones, 3)


class DropBlock(M.Module):
    """Linear, tanh, dropout: a layer whose backward depends on the random mask."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = mg.Parameter(rng.standard_normal((width, width)) * 0.5)
        self.drop = M.Dropout(0.3)

    def forward(self, x):
        return self.drop(F.tanh(F.matmul(x, self.w)))


def _grads_with_checkpointing(interval, num_layers=5):
    mg.random.seed(11)
    net = PipelineModule([DropBlock(4, i) for i in range(num_layers)], num_stages=1,
                         activation_checkpoint_interval=interval)
    gm = ad.GradManager().attach(list(net.parameters()))
    x = mg.tensor(np.random.default_rng(0).standard_normal((3, 4)))
    with gm:
        for _ in range(2):  # two graphs in one recording, back-propagated one by one
            gm.backward((net(x) ** 2).sum(), release=False)
    return [p.grad.numpy() for p in net.parameters()]


@pytest.mark.parametrize("interval", [1, 2, 5])
def test_activation_checkpointing_gives_bitwise_the_gradients_with_dropout(interval):
    plain = _grads_with_checkpointing(0)
    checkpointed = _grads_with_checkpointing(interval)
    assert all(np.array_equal(a, b) for a, b in zip(plain, checkpointed))
    assert len(plain) == 5 and all(np.abs(g).sum() > 0 for g in plain)


def test_activation_checkpointing_recomputes_instead_of_keeping_internals():
    """A checkpointed segment keeps only its input: its layers run again during backward."""
    calls = []

    def spy(x):
        calls.append(x.shape)
        return x * 2.0

    net = PipelineModule([M.Linear(2, 2), spy, M.Linear(2, 2)], num_stages=1,
                         activation_checkpoint_interval=3)
    gm = ad.GradManager().attach(list(net.parameters()))
    with gm:
        y = net(mg.tensor(np.ones((1, 2), "float32")))
        assert len(calls) == 1
        gm.backward(y.sum())
    assert len(calls) == 2


def _build_on_every_rank(num_stages):
    Counted.built.clear()
    try:
        net = PipelineModule([LayerSpec(Counted, i) for i in range(6)], num_stages=num_stages)
    except ValueError as e:
        return str(e)
    return net.stage_id, list(Counted.built), net.pipeline_ranks()


def test_ranks_build_their_own_stage_and_all_reject_a_bad_world_size():
    # PipeDataParallelTopology(2, 2): rank = stage * 2 + replica
    assert run_workers(_build_on_every_rank, 4, 2) == [
        (0, [0, 1, 2], [0, 2]), (0, [0, 1, 2], [1, 3]), (1, [3, 4, 5], [0, 2]),
        (1, [3, 4, 5], [1, 3])]
    assert run_workers(_build_on_every_rank, 3, 2) == [
        "PipelineModule: num_stages (2) must divide the world size (3)"] * 3
