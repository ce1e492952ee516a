"""compare_layouts: every layout of a correct model equals one device within tolerance; a planted
bug is named by module, direction and step; deterministic mode makes data layouts agree to the
bit; the command line and the plot work."""

import numpy as np
import pytest

import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed import sequence_parallel as sp
from minigrad.distributed import tensor_parallel as tp
from minigrad.distributed.data_parallel.deterministic import deterministic_reductions
from minigrad.distributed.tensor_parallel.regions import reduce_from_region
from minigrad.testing import compare_layouts
from minigrad.testing.compare_layouts import Divergence, main

B, L, D, H = 4, 4, 6, 8


def make_batches():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((B, L, D)), rng.standard_normal((B, L, D))) for _ in range(2)]


def build_model(ctx):
    """Token-wise MLP: single-device layers without tensor parallelism, tp layers with it."""
    return M.Sequential(tp.Linear(D, H), M.GELU(), tp.Linear(H, D))


class BiasOnEveryRank(tp.Linear1DRow):
    """The planted bug: the bias is added before the all-reduce, so P times."""

    def forward(self, x):
        y = F.linear(x, self.weight) + self.bias
        return reduce_from_region(y, self.group)


def build_buggy_tensor_model(ctx):
    if ctx.tensor == 1:
        return build_model(ctx)
    return M.Sequential(tp.Linear(D, H), M.GELU(), BiasOnEveryRank(H, D))


class Remember(M.Module):
    """Keeps its input for a skip connection further on (a Python attribute, not an input)."""

    def __init__(self):
        super().__init__()
        self.saved = None

    def forward(self, x):
        self.saved = x
        return x


class AddRemembered(M.Module):
    """The planted pipeline bug: adds the remembered input if it has one, so on a stage that
    does not hold the Remember layer the residual is silently dropped."""

    def __init__(self, source):
        super().__init__()
        self.source = [source]  # a list: not a sub-module of this one

    def forward(self, h):
        saved = self.source[0].saved
        return h if saved is None else h + saved


def build_skip_model(ctx):
    remember = Remember()
    return M.Sequential(remember, M.Linear(D, H), M.Tanh(), M.Linear(H, D), AddRemembered(remember))


def test_a_correct_model_equals_one_device_in_every_layout():
    layouts = [dict(data=2), dict(data=2, zero=3), dict(tensor=2, mode="1d"),
               dict(pipeline=2, micro_batches=2), dict(sequence=2)]
    report = compare_layouts(build_model, make_batches, steps=2, layouts=layouts)
    text = str(report)
    for name in ("data=2", "data=2,zero=3", "tensor=2,mode=1d", "pipeline=2,micro_batches=2",
                 "sequence=2"):
        result = report[name]
        assert result.equal, text
        assert len(result.steps) == 2
        worst = max(v for step in result.steps for v in step.values() if np.isfinite(v))
        assert 0 <= worst < 1e-13, text  # float64: rounding only
        # the activations were compared, not skipped (tensor/sequence splits reassembled)
        assert all(np.isfinite(step["forward"]) and np.isfinite(step["backward"])
                   for step in result.steps), (name, result.skipped)
    assert report.all_equal and "equal within tolerance" in text and "ERROR" not in text


def adam(params):
    return optim.Adam(params, lr=0.05)


def test_zero_stages_equal_one_device_in_float64_with_every_parameter_gathered():
    layouts = [dict(data=2, zero=1), dict(data=2, zero=2), dict(data=2, zero=3),
               dict(data=2, zero=0), dict(tensor=2, zero=2)]
    report = compare_layouts(build_model, make_batches, steps=2, layouts=layouts,
                             optimizer=adam)
    text = str(report)
    for stage in (1, 2, 3):
        result = report[f"data=2,zero={stage}"]
        assert result.equal and not result.skipped, text
        assert f"data=2,zero={stage}: equal within tolerance" in text
        for step in result.steps:  # parameters and gradients in full shape, compared
            assert 0 <= step["grad"] < 1e-13 and 0 <= step["param"] < 1e-13, text
            assert np.isfinite(step["forward"]) and np.isfinite(step["backward"]), text
    assert "zero must be 1, 2 or 3" in report["data=2,zero=0"].error
    assert "zero shards over the data-parallel ranks" in report["tensor=2,zero=2"].error


def _sharded_sum_bug(ctx):
    """A planted ZeRO bug: the second layer's input is doubled on rank 1 only."""
    from minigrad.distributed.comm.group import get_rank

    class Doubled(M.Linear):
        def forward(self, x):
            return super().forward(x * (2.0 if ctx.zero and get_rank() == 1 else 1.0))

    return M.Sequential(tp.Linear(D, H), M.GELU(), Doubled(H, D))


def test_a_rank_that_computes_differently_under_zero_is_named():
    report = compare_layouts(_sharded_sum_bug, make_batches, steps=2,
                             layouts=[dict(data=2, zero=3)])
    first = report["data=2,zero=3"].first
    assert (first.step, first.stage, first.path, first.op) == (0, "forward", "2", "Doubled")


def test_tensor_parallel_bias_added_on_every_rank_is_named_with_module_and_step():
    report = compare_layouts(build_buggy_tensor_model, make_batches, steps=2,
                             layouts=[dict(tensor=2, mode="1d"), dict(data=2)])
    first = report["tensor=2,mode=1d"].first
    assert isinstance(first, Divergence)
    assert (first.step, first.stage, first.path, first.op) == (0, "forward", "2",
                                                              "BiasOnEveryRank")
    assert first.difference > 1e-3
    lines = str(report).splitlines()
    header = next(line for line in lines if line.startswith("layout")).split()
    row = next(line for line in lines if line.startswith("tensor=2,mode=1d")).split()
    assert row[header.index("forward")] == f"{first.difference:.3g}"  # the table's column
    assert report["data=2"].equal  # the bug lives in the tensor-parallel layer only
    assert ("FIRST DIVERGENCE step 0: forward output of 2 (BiasOnEveryRank; one device: "
            "Linear)") in str(report)


def test_pipeline_stage_that_drops_a_residual_is_named():
    report = compare_layouts(build_skip_model, make_batches, steps=2,
                             layouts=[dict(pipeline=2, micro_batches=2), dict(data=2)])
    first = report["pipeline=2,micro_batches=2"].first
    assert (first.step, first.stage, first.path, first.op) == (0, "forward", "4",
                                                              "AddRemembered")
    assert report["data=2"].equal


def test_sequence_layout_with_ring_attention_equals_one_device():
    vocab = 16

    def build(ctx):  # ring attention over the sequence group of the context the tool creates
        return sp.SequenceParallelLM(vocab, 8, 2, 1, 8, attention="ring", zigzag=False)

    def batches():
        rng = np.random.default_rng(0)
        return [(rng.integers(0, vocab, (2, 8)), rng.integers(0, vocab, (2, 8)))] * 2

    def loss_fn(logits, labels):  # the mean over this rank's tokens
        return F.nn.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    report = compare_layouts(build, batches, steps=2, layouts=[dict(sequence=2)],
                             loss_fn=loss_fn)
    result = report["sequence=2"]
    assert result.equal and report.rows == 16, str(report)
    assert all(np.isfinite(step["forward"]) and np.isfinite(step["backward"])
               for step in result.steps), result.skipped


def test_batch_norm_without_sync_diverges_in_data_parallel_at_its_forward():
    def build(ctx):
        return M.Sequential(M.Linear(D, H), M.BatchNorm1d(H), M.Linear(H, D))

    def batches():
        return [(x.reshape(B * L, D), y.reshape(B * L, D)) for x, y in make_batches()]

    first = compare_layouts(build, batches, steps=1, layouts=[dict(data=2)])["data=2"].first
    assert (first.step, first.stage, first.path) == (0, "forward", "1")


def test_deterministic_mode_makes_data_layouts_bitwise_equal_to_one_device_in_float32():
    layouts = [dict(data=2), dict(data=4), dict(data=2, zero=2)]
    usual = compare_layouts(build_model, make_batches, steps=2, layouts=layouts[1:2],
                            dtype="float32")
    with deterministic_reductions(4):
        exact = compare_layouts(build_model, make_batches, steps=2, layouts=layouts,
                                dtype="float32")
    for name in ("data=2", "data=4", "data=2,zero=2"):
        assert exact[name].equal
        assert all(v == 0 for step in exact[name].steps for v in step.values()), str(exact)
    # without the mode the gradients differ in their last bits (within tolerance)
    assert usual["data=4"].equal
    assert any(step["grad"] > 0 for step in usual["data=4"].steps), str(usual)


def test_command_line_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    script = tmp_path / "my_train.py"
    script.write_text(
        "import numpy as np\n"
        "import minigrad.module as M\n"
        "from minigrad.distributed import tensor_parallel as tp\n"
        "def build_model(ctx):\n"
        "    return M.Sequential(tp.Linear(4, 8), M.ReLU(), tp.Linear(8, 2))\n"
        "def make_batches():\n"
        "    rng = np.random.default_rng(1)\n"
        "    return [(rng.standard_normal((4, 4)), rng.standard_normal((4, 2)))] * 2\n")
    plot = tmp_path / "diff.png"
    code = main([str(script), "--layouts", "data=2", "tensor=2,mode=1d", "--steps", "2",
                 "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "data=2: equal within tolerance" in out
    assert "tensor=2,mode=1d: equal within tolerance" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        main([str(script), "--layouts", "data"])
