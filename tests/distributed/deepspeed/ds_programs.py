"""DeepSpeed's two tutorials, written as a DeepSpeed user writes them (only the imports point at
minigrad), on a tiny synthetic dataset, plus the float64 single-process references they are
checked against. Shared by the tests of this folder (module-level functions: the launcher forks
them into ranks)."""

from __future__ import annotations

import argparse

import numpy as np

import minigrad.distributed as dist
import minigrad.distributed.deepspeed as deepspeed
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.autodiff import GradManager
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.data import RandomSampler
from minigrad.distributed.deepspeed.pipe import LayerSpec, PipelineModule

N_SAMPLES, N_IN, N_HIDDEN, N_OUT = 40, 6, 8, 3


class ToySet:
    """A map-style dataset of ``(features float64 (6,), label int64)`` items, like CIFAR-10's."""

    def __init__(self):
        rng = np.random.RandomState(7)
        self.x = rng.standard_normal((N_SAMPLES, N_IN))
        self.y = rng.randint(0, N_OUT, N_SAMPLES).astype(np.int64)

    def __len__(self):
        return N_SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Dense(M.Module):
    """``x @ w + b`` with float64 parameters drawn from ``seed`` (the same on every rank and in
    the reference)."""

    def __init__(self, n_in: int, n_out: int, seed: int, relu: bool = False):
        super().__init__()
        rng = np.random.RandomState(seed)
        self.w = Parameter(rng.standard_normal((n_in, n_out)) * 0.5)
        self.b = Parameter(rng.standard_normal(n_out) * 0.1)
        self.relu = relu

    def forward(self, x):
        y = F.matmul(x, self.w) + self.b
        return F.relu(y) if self.relu else y


class Net(M.Module):
    """The tutorial's classifier, shrunk: two dense layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = Dense(N_IN, N_HIDDEN, seed=1, relu=True)
        self.fc2 = Dense(N_HIDDEN, N_OUT, seed=2)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def full_params(engine) -> dict:
    """The model's parameters by name, unsharded (ZeRO-2/3 keep pieces)."""
    net = engine.module
    state = dist.full_state_dict(net) if engine.zero_optimization_stage() >= 2 else \
        net.state_dict()
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in state.items()}


# -- tutorial 1: CIFAR-10 (getting started), engine(x) / backward / step ------------------------
def cifar_tutorial(argv: list, ds_config, epochs: int, check=None):
    """DeepSpeed's CIFAR-10 tutorial loop. Returns the trained parameters (and what ``check``
    returns, called with the engine at the end)."""
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    deepspeed.init_distributed()
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    trainset = ToySet()
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset,
        config=ds_config)
    criterion = M.CrossEntropyLoss()
    for epoch in range(epochs):  # noqa: B007 - the tutorial's loop, verbatim
        for i, data in enumerate(trainloader):  # noqa: B007
            inputs = data[0].to(model_engine.local_rank)
            labels = data[1].to(model_engine.local_rank)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
    out = {"params": full_params(model_engine), "steps": model_engine.global_steps,
           "micro_steps": model_engine.micro_steps}
    if check is not None:
        out["check"] = check(model_engine)
    return out


def rank_batches(world: int, micro: int, epochs: int) -> list[list]:
    """Each rank's index batches over ``epochs``, in order (DeepSpeed's loader: shuffled with
    seed 0, sharded by rank)."""
    data = ToySet()
    out = []
    for r in range(world):
        sampler = RandomSampler(data, batch_size=micro, world_size=world, rank=r, seed=0)
        out.append([batch for _ in range(epochs) for batch in sampler])
    return out


def reference(world: int, micro: int, accum: int, epochs: int, make_opt, clip: float = 0.0):
    """One process, float64: each step's gradient is that of the mean over the ranks and the
    ``accum`` micro-batches of each micro-batch's mean cross-entropy."""
    data, net = ToySet(), Net()
    gm = GradManager().attach(net.parameters())
    opt = make_opt(net.parameters())
    batches = rank_batches(world, micro, epochs)
    for step in range(len(batches[0]) // accum):
        with gm:
            total = 0
            for r in range(world):
                for idx in batches[r][step * accum:(step + 1) * accum]:
                    logits = net(Tensor(data.x[idx]))
                    total = total + F.nn.cross_entropy(logits, Tensor(data.y[idx]))
            gm.backward(total / (world * accum))
        if clip:
            optim.clip_grad_norm(net.parameters(), clip)
        opt.step()
        opt.clear_grad()
    return {k: np.asarray(v) for k, v in net.state_dict().items()}


# -- tutorial 2: pipeline parallelism, train_batch() -------------------------------------------
def pipeline_tutorial(argv: list, ds_config, steps: int, num_stages: int, lr_scheduler=None):
    """DeepSpeed's pipeline tutorial: a PipelineModule of LayerSpecs, ``initialize`` with the
    training data, ``train_batch()`` with no argument. Returns this stage's parameters by global
    layer index and the losses."""
    parser = argparse.ArgumentParser(description="pipeline")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    deepspeed.init_distributed(dist_backend="gloo")
    layers = [LayerSpec(Dense, N_IN, N_HIDDEN, seed=1, relu=True),
              LayerSpec(Dense, N_HIDDEN, N_HIDDEN, seed=3, relu=True),
              LayerSpec(Dense, N_HIDDEN, N_OUT, seed=2)]
    net = PipelineModule(layers=layers, loss_fn=M.CrossEntropyLoss(), num_stages=num_stages,
                         partition_method="uniform")
    trainset = ToySet()
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset, config=ds_config, lr_scheduler=lr_scheduler)
    losses = [engine.train_batch() for _ in range(steps)]
    state = {k: np.asarray(v) for k, v in net.state_dict().items()}
    return {"state": state, "losses": losses, "stage": engine.stage_id,
            "kind": type(engine).__name__, "lr": engine.get_lr(),
            "scale": None if engine.scaler is None else engine.scaler.get_scale(),
            "optimizer": type(engine.optimizer).__name__}


def pipeline_reference(replicas: int, micro: int, accum: int, steps: int, make_opt):
    """One process: the same three layers; each step averages the gradients over the replicas
    and the ``accum`` micro-batches, each read from that replica's shuffled shard (repeated)."""
    data = ToySet()
    layers = [Dense(N_IN, N_HIDDEN, 1, relu=True), Dense(N_HIDDEN, N_HIDDEN, 3, relu=True),
              Dense(N_HIDDEN, N_OUT, 2)]
    params = [p for layer in layers for p in layer.parameters()]
    gm = GradManager().attach(params)
    opt = make_opt(params)
    per_epoch = len(rank_batches(replicas, micro, 1)[0])
    batches = rank_batches(replicas, micro, -(-steps * accum // per_epoch))
    losses = []
    for step in range(steps):
        with gm:
            total = 0
            for r in range(replicas):
                for idx in batches[r][step * accum:(step + 1) * accum]:
                    h = Tensor(data.x[idx])
                    for layer in layers:
                        h = layer(h)
                    total = total + F.nn.cross_entropy(h, Tensor(data.y[idx]))
            mean = total / (replicas * accum)
            losses.append(float(mean.item()))
            gm.backward(mean)
        opt.step()
        opt.clear_grad()
    return layers, losses
