"""module_stats against hand-computed parameter counts, FLOPs (MegEngine's multiply-add rules)
and activation sizes."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad.functional as F
import minigrad.module as M
from minigrad.utils.module_stats import module_stats, register_flops


def stats(model, *shapes):
    return module_stats(model, input_shapes=list(shapes), logging_to_stdout=False)


def test_linear_counts_rows_and_the_bias_once_as_megengine():
    total, details = stats(M.Linear(7, 5), (3, 7))
    assert total.param_dims == 7 * 5 + 5 and total.param_size == 4 * 40
    assert total.flops == 3 * 5 * 7 + 5                 # prod(out) * in + out_features
    assert total.act_dims == 15 and total.act_size == 60
    no_bias, _ = stats(M.Linear(7, 5, bias=False), (3, 7))
    assert no_bias.flops == 3 * 5 * 7 and no_bias.param_dims == 35


@pytest.mark.parametrize("groups", [1, 2])
def test_conv2d(groups):
    conv = M.Conv2d(4, 6, (3, 2), stride=1, padding=1, groups=groups)
    total, details = stats(conv, (2, 4, 8, 9))
    out = (2, 6, 8 + 2 - 3 + 1, 9 + 2 - 2 + 1)
    assert details.flops[0]["output_shapes"] == [out]
    assert total.flops == np.prod(out) * (4 // groups * 3 * 2 + 1)
    assert total.param_dims == 6 * (4 // groups) * 3 * 2 + 6


def test_conv_transpose2d():
    conv = M.ConvTranspose2d(3, 4, 2, stride=2)
    total, _ = stats(conv, (1, 3, 5, 5))
    assert total.flops == 1 * 3 * 5 * 5 * 4 * 2 * 2 + 1 * 4 * 10 * 10


def test_layer_norm_and_batch_norm_are_seven_per_input_element():
    assert stats(M.LayerNorm(6), (4, 6))[0].flops == 7 * 24
    bn_total, _ = stats(M.BatchNorm2d(3), (2, 3, 4, 4))
    assert bn_total.flops == 7 * 2 * 3 * 4 * 4 and bn_total.param_dims == 6


def test_multi_head_attention_projections_core_and_out_proj():
    n, length, e, h = 2, 5, 8, 2
    total, details = stats(M.MultiHeadAttention(e, h), (n, length, e))
    by_name = {d["name"]: d["flops_num"] for d in details.flops}
    projections = 3 * (n * length * e * e + e)
    core = 2 * n * h * length * length * (e // h)
    assert by_name["MultiHeadAttention"] == projections + core
    assert by_name["out_proj"] == n * length * e * e + e
    assert total.flops == projections + core + by_name["out_proj"]
    assert total.param_dims == 3 * e * e + 3 * e + e * e + e


def test_dot_product_attention_core_with_different_key_length():
    q, k = np.zeros((2, 3, 4, 5), np.float32), np.zeros((2, 3, 7, 5), np.float32)
    total, _ = module_stats(M.DotProductAttention(), inputs=(q, k, k), logging_to_stdout=False)
    assert total.flops == 2 * 2 * 3 * 4 * 7 * 5


class LeNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.pool1 = M.Conv2d(1, 6, 5, padding=2), M.MaxPool2d(2)
        self.conv2, self.pool2 = M.Conv2d(6, 16, 5), M.MaxPool2d(2)
        self.fc1, self.fc2, self.fc3 = M.Linear(400, 120), M.Linear(120, 84), M.Linear(84, 10)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(F.flatten(x, 1))))))


def test_lenet_totals_by_hand(capsys):
    total, details = module_stats(LeNet(), input_shapes=[(1, 1, 28, 28)])
    params = ((6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84)
              + (84 * 10 + 10))
    flops = (6 * 28 * 28 * 26 + 6 * 14 * 14 * 4 + 16 * 10 * 10 * 151 + 16 * 5 * 5 * 4
             + (120 * 400 + 120) + (84 * 120 + 84) + (10 * 84 + 10))
    assert (total.param_dims, total.flops) == (params, flops) == (61706, 429342)
    assert total.param_size == 4 * params
    acts = 6 * 28 * 28 + 6 * 14 * 14 + 16 * 10 * 10 + 16 * 5 * 5 + 120 + 84 + 10
    assert total.act_dims == acts and total.act_size == 4 * acts
    assert [d["name"] for d in details.flops] == ["conv1", "pool1", "conv2", "pool2",
                                                  "fc1", "fc2", "fc3"]
    printed = capsys.readouterr().out
    assert "flops stats:" in printed and "total_flops" in printed and "fc1.weight" in printed


def test_eval_mode_for_the_pass_and_restored():
    net = M.Sequential(M.Linear(3, 3), M.Dropout(0.5))
    x = np.ones((4, 3), np.float32)
    total, details = module_stats(net, inputs=x, logging_to_stdout=False)
    assert net.training  # put back
    assert total.flops == 4 * 3 * 3 + 3


def test_own_rule_for_a_custom_layer():
    class Square(M.Module):
        def forward(self, x):
            return x * x

    @register_flops(Square)
    def square_flops(module, inputs, output):
        return int(np.prod(output.shape))

    assert stats(Square(), (5, 2))[0].flops == 10


def test_inputs_are_required():
    with pytest.raises(ValueError, match="module_stats: give inputs="):
        module_stats(M.Linear(2, 2), logging_to_stdout=False)
