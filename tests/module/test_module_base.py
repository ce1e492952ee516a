"""Module base class: attribute discovery, hooks, modes and state dicts."""

import logging
from collections import OrderedDict

import numpy as np
import pytest
from minigrad.tensor import Parameter

import minigrad as mg
import minigrad.module as M


class NoSuper(M.Module):
    """MegEngine's data-parallel tutorial style: no super().__init__() call."""

    def __init__(self):
        self.w = Parameter(np.ones((2, 3), np.float32))
        self.b = Parameter(np.zeros(3, np.float32))

    def forward(self, x):
        return x @ self.w + self.b


class Nested(M.Module):
    def __init__(self):
        super().__init__()
        self.first = M.Linear(3, 4)
        self.blocks = [M.Linear(4, 4), NoSuper()]
        self.heads = {"a": M.Linear(4, 2), "b": Parameter(np.ones(2, np.float32))}
        self.stat = mg.tensor(np.zeros(4, np.float32))
        self.scale = Parameter(np.ones(1, np.float32))
        self.not_a_tensor = np.ones(3)


def test_discovery_without_super_init():
    m = NoSuper()
    assert [n for n, _ in m.named_parameters()] == ["w", "b"]
    x = mg.tensor(np.ones((1, 2), np.float32))
    np.testing.assert_allclose(m(x).numpy(), np.full((1, 3), 2.0))
    assert m.training
    m.eval()
    assert not m.training
    hits = []
    m.register_forward_hook(lambda mod, inp, out: hits.append(out.shape))
    m(x)
    assert hits == [(1, 3)]
    assert list(m.state_dict()) == ["w", "b"]


def test_names_follow_definition_order_and_containers():
    m = Nested()
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "first.weight", "first.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.w",
        "blocks.1.b", "heads.a.weight", "heads.a.bias", "heads.b", "scale",
    ]
    assert [n for n, _ in m.named_buffers()] == ["stat"]
    assert [n for n, _ in m.named_tensors()] == names[:-1] + ["stat", "scale"]
    assert len(list(m.parameters())) == 10
    assert [n for n, _ in m.named_children()] == ["first", "blocks.0", "blocks.1", "heads.a"]
    assert [n for n, _ in m.named_modules()] == ["", "first", "blocks.0", "blocks.1", "heads.a"]
    assert [n for n, _ in m.named_parameters(recursive=False)] == ["heads.b", "scale"]
    assert [n for n, _ in m.named_parameters(prefix="net")][0] == "net.first.weight"


def test_shared_parameters_and_cycles_listed_once():
    lin = M.Linear(2, 2)
    seq = M.Sequential(lin, M.ReLU(), lin)
    assert len(list(seq.parameters())) == 2
    seq.parent = seq  # a cycle must not recurse forever
    assert len(list(seq.modules())) == 3


def test_apply_train_eval_zero_grad():
    m = Nested()
    m.apply(lambda mod: setattr(mod, "visited", True))
    assert all(getattr(mod, "visited", False) for mod in m.modules())
    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())
    gm = mg.GradManager().attach(m.parameters())
    x = mg.tensor(np.ones((2, 3), np.float32))
    with gm:
        gm.backward(m.first(x).sum())
    assert m.first.weight.grad is not None
    m.zero_grad()
    np.testing.assert_array_equal(m.first.weight.grad.numpy(), 0)
    assert m.scale.grad is None


def test_hooks_can_replace_inputs_and_outputs_and_be_removed():
    lin = M.Linear(2, 2)
    x = mg.tensor(np.ones((1, 2), np.float32))
    ref = lin(x).numpy()
    h1 = lin.register_forward_pre_hook(lambda mod, inp: (inp[0] * 0,))
    h2 = lin.register_forward_hook(lambda mod, inp, out: out + 1)
    np.testing.assert_allclose(lin(x).numpy(), lin.bias.numpy()[None] + 1, rtol=1e-6)
    h1.remove()
    h2.remove()
    np.testing.assert_array_equal(lin(x).numpy(), ref)


def test_state_dict_round_trip_and_copy_semantics():
    mg.random.seed(0)
    a = Nested()
    mg.random.seed(1)
    b = Nested()
    sd = a.state_dict()
    assert isinstance(sd, OrderedDict) and all(isinstance(v, np.ndarray) for v in sd.values())
    sd["first.weight"][...] = 7  # a copy: mutating it leaves the model alone
    assert not np.any(a.first.weight.numpy() == 7)
    b.load_state_dict(a.state_dict())
    for (na, ta), (nb, tb) in zip(a.named_tensors(), b.named_tensors(), strict=True):
        assert na == nb
        np.testing.assert_array_equal(ta.numpy(), tb.numpy())
    # Tensors are accepted as values too
    b.load_state_dict({k: mg.tensor(v) for k, v in a.state_dict().items()})


def test_load_state_dict_errors_list_every_problem_and_modify_nothing():
    m = Nested()
    before = m.state_dict()
    sd = m.state_dict()
    del sd["scale"]
    sd["extra"] = np.zeros(1)
    sd["first.weight"] = np.zeros((5, 5), np.float32)
    sd["first.bias"] = np.full(4, 3.0, np.float32)
    with pytest.raises(ValueError) as info:
        m.load_state_dict(sd)
    msg = str(info.value)
    assert "missing keys: ['scale']" in msg and "unexpected keys: ['extra']" in msg
    assert "'first.weight': expected (4, 3), got (5, 5)" in msg
    np.testing.assert_array_equal(m.first.bias.numpy(), before["first.bias"])
    # strict=False ignores missing/unexpected keys but never a wrong shape
    with pytest.raises(ValueError, match="shape mismatch"):
        m.load_state_dict(sd, strict=False)
    sd["first.weight"] = before["first.weight"]
    m.load_state_dict(sd, strict=False)
    np.testing.assert_array_equal(m.first.bias.numpy(), 3.0)
    np.testing.assert_array_equal(m.scale.numpy(), before["scale"])
    with pytest.raises(TypeError, match="expected a dict"):
        m.load_state_dict([1, 2])


def test_repr_lists_children():
    text = repr(M.Sequential(M.Linear(2, 3), M.ReLU()))
    assert "(0): Linear(in_features=2, out_features=3, bias=True)" in text
    assert "(1): ReLU()" in text


def test_named_modules_with_parent_as_megengine():
    """MegEngine code replaces layers in place: ``for name, m, parent in
    net.named_modules(with_parent=True): setattr(parent, name.split('.')[-1], new)``."""
    net = M.Sequential(M.Linear(2, 3), M.Sequential(M.ReLU(), M.Linear(3, 1)))
    items = list(net.named_modules(with_parent=True))
    assert [name for name, _, _ in items] == [name for name, _ in net.named_modules()]
    assert items[0] == ("", net, None)
    parents = {name: parent for name, _, parent in items}
    inner = [m for name, m in net.named_modules() if name == "1"][0]
    assert parents["0"] is net and parents["1"] is net
    assert parents["1.0"] is inner and parents["1.1"] is inner
    assert [(m, p) for m, p in net.modules(with_parent=True)] == [(m, p) for _, m, p in items]
    # used the MegEngine way: swap every ReLU for a Sigmoid through its parent
    for name, m, parent in list(net.named_modules(with_parent=True)):
        if isinstance(m, M.ReLU):
            setattr(parent, name.split(".")[-1], M.Sigmoid())
    assert [type(m).__name__ for m in net.modules()].count("Sigmoid") == 1


def test_load_state_dict_key_errors_are_key_errors_and_non_strict_warns(caplog):
    m = Nested()
    sd = m.state_dict()
    sd["extra"] = np.zeros(1)
    with pytest.raises(KeyError, match=r"Unused params violate `strict=True`") as info:
        m.load_state_dict(sd)
    assert "unexpected keys: ['extra']" in str(info.value)
    del sd["extra"]
    del sd["scale"]
    with pytest.raises(KeyError, match=r"missing keys: \['scale'\]"):
        m.load_state_dict(sd)
    sd["extra"] = np.zeros(1)
    logger = logging.getLogger("minigrad.module")
    logger.addHandler(caplog.handler)
    try:
        m.load_state_dict(sd, strict=False)
    finally:
        logger.removeHandler(caplog.handler)
    assert "missing keys ['scale'], unused keys ['extra']" in caplog.text


def test_load_state_dict_from_a_function_of_name_and_tensor():
    m = Nested()
    before = m.state_dict()
    m.load_state_dict(lambda name, t: np.full(t.shape, 2.0, np.float32)
                      if name.endswith("bias") else None)
    for name, t in m.named_tensors():
        expected = 2.0 if name.endswith("bias") else before[name]
        np.testing.assert_array_equal(t.numpy(), np.broadcast_to(expected, t.shape))


def test_conv_repr_lists_only_arguments_that_differ_from_the_defaults():
    """MegEngine's repr (its test_repr_basic): kernel size always, the rest when not default."""
    assert repr(M.Conv2d(3, 128, 3, padding=1, bias=False)) == (
        "Conv2d(3, 128, kernel_size=(3, 3), padding=(1, 1), bias=False)")
    assert repr(M.Conv2d(3, 128, 3, dilation=2, bias=False)) == (
        "Conv2d(3, 128, kernel_size=(3, 3), dilation=(2, 2), bias=False)")
    assert repr(M.Conv2d(256, 256, 3, 1, 0, groups=256, bias=False)) == (
        "Conv2d(256, 256, kernel_size=(3, 3), groups=256, bias=False)")
    assert repr(M.Conv2d(256, 256, 1)) == "Conv2d(256, 256, kernel_size=(1, 1))"
    assert repr(M.Conv2d(4, 4, 3, stride=2)) == "Conv2d(4, 4, kernel_size=(3, 3), stride=(2, 2))"


def test_pool_repr_shows_the_stride_in_effect():
    assert repr(M.MaxPool2d(kernel_size=2, padding=0)) == (
        "MaxPool2d(kernel_size=2, stride=2, padding=0)")
    assert "stride=3" in repr(M.AvgPool2d(3))
