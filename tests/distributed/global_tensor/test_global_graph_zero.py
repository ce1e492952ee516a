"""``Graph.config.enable_zero`` (OneFlow's): stages 1, 2 and 3 over a data-parallel Graph train
the same bits as the Graph without ZeRO, while each rank holds only its shard of the optimizer
state (and, at stage 3, of the parameters); bad arguments get clear errors."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed.global_tensor.graph_zero import ZeroConfig
from minigrad.testing.distributed import run_workers

IN, HID, OUT, BATCH, STEPS = 6, 8, 3, 8, 3


class Net(M.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(2)
        self.fc1 = M.Linear(IN, HID)
        self.fc2 = M.Linear(HID, OUT)
        for name, shape in (("fc1.weight", (HID, IN)), ("fc1.bias", (HID,)),
                            ("fc2.weight", (OUT, HID)), ("fc2.bias", (OUT,))):
            module, attr = name.split(".")
            setattr(getattr(self, module), attr, mg.Parameter(rng.standard_normal(shape) * 0.5))

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def _batches(dtype):
    rng = np.random.default_rng(8)
    return [(rng.standard_normal((BATCH, IN)).astype(dtype),
             rng.standard_normal((BATCH, OUT)).astype(dtype)) for _ in range(STEPS)]


def _train(stage, dtype, micro=2, min_size=2):
    """STEPS Adam steps of a data-parallel Graph (parameters broadcast, batch split(0)) on 2
    ranks; the logical parameters, the losses, this rank's optimizer-state elements and the
    elements of the module's parameters at rest."""
    P = mg.placement("cpu", [0, 1])
    net = Net()
    for module in (net.fc1, net.fc2):
        for attr in ("weight", "bias"):
            p = getattr(module, attr)
            setattr(module, attr, mg.Parameter(p.numpy().astype(dtype)))
    net.to_global(P, mg.sbp.broadcast)
    names = [n for n, _ in net.named_parameters()]
    opt = optim.Adam(net.parameters(), lr=0.05)

    class Step(mg.Graph):
        def __init__(self):
            super().__init__()
            self.model = net
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(micro)
            if stage:
                self.config.enable_zero(True, stage=stage, shard_min_size=min_size)

        def build(self, x, y):
            loss = F.nn.square_loss(self.model(x), y)
            loss.backward()
            return loss

    graph = Step()
    losses = []
    for x, y in _batches(dtype):
        xg = mg.tensor(x).to_global(P, mg.sbp.split(0))
        yg = mg.tensor(y).to_global(P, mg.sbp.split(0))
        losses.append(graph(xg, yg).to_local().numpy().tobytes())
    params = dict(net.named_parameters())
    logical = {n: params[n].numpy() for n in names}  # gathered where split (stage 3)
    state = sum(v.size for st in opt.state_dict()["state"].values() for v in st.values()
                if getattr(v, "ndim", 0) > 0)
    at_rest = sum(p.to_local().size for p in net.parameters())
    return logical, losses, state, at_rest, repr(graph.config)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_stage_trains_the_bits_of_the_graph_without_zero(dtype):
    base = run_workers(_train, 2, 0, dtype, timeout=120)
    total = IN * HID + HID + HID * OUT + OUT
    assert base[0][2] == 2 * total and base[0][3] == total  # Adam: two moments, whole model
    for stage in (1, 2, 3):
        runs = run_workers(_train, 2, stage, dtype, timeout=120)
        for rank, (params, losses, state, at_rest, config) in enumerate(runs):
            for name, value in base[0][0].items():
                assert params[name].tobytes() == value.tobytes(), (stage, rank, name)
            assert losses == base[0][1], (stage, rank)
            # sharded: both weights (rows 8 and 3 over 2 ranks) and fc1.bias (8); fc2.bias (3
            # elements, 1 per shard < shard_min_size 2) stays whole
            rows = {0: HID // 2, 1: HID // 2}[rank], {0: 2, 1: 1}[rank]
            mine = rows[0] * IN + rows[0] + rows[1] * HID + OUT
            assert state == 2 * mine, (stage, rank, state)
            assert at_rest == (mine if stage == 3 else total), (stage, rank)
            assert f"stage={stage}, shard_min_size=2" in config
    # the model is training: the parameters moved
    assert np.abs(base[0][0]["fc1.weight"] - Net().fc1.weight.numpy()).max() > 1e-3


def test_enable_zero_arguments_are_checked():
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3, got 4"):
        ZeroConfig(stage=4)
    with pytest.raises(ValueError, match="shard_min_size must be an int >= 1, got 0"):
        ZeroConfig(shard_min_size=0)
    with pytest.raises(ValueError, match="shard_restore_level must be 1 or 2"):
        ZeroConfig(shard_restore_level=0)
    config = mg.Graph().config
    config.enable_zero()
    assert (config.zero.stage, config.zero.shard_min_size) == (2, 1024)  # OneFlow's defaults
    config.enable_zero(False)
    assert config.zero is None


def _late_enable():
    P = mg.placement("cpu", [0, 1])
    net = Net().to_global(P, mg.sbp.broadcast)
    opt = optim.Adam(net.parameters(), lr=0.05)

    class Step(mg.Graph):
        def __init__(self):
            super().__init__()
            self.model = net
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = F.nn.square_loss(self.model(x), y)
            loss.backward()
            return loss

    graph = Step()
    x, y = (mg.tensor(a).to_global(P, mg.sbp.split(0)) for a in _batches("float64")[0])
    graph(x, y)
    graph.config.enable_zero(True, stage=1, shard_min_size=1)
    try:
        graph(x, y)
    except RuntimeError as exc:
        return str(exc)
    return None


def test_enabling_zero_after_the_optimizer_stepped_is_refused_on_every_rank():
    for message in run_workers(_late_enable, 2, timeout=120):
        assert "Adam already has state" in message and "before the graph's first call" in message
