"""What the quickstart tests (tests/examples/test_*_quickstart.py) share: a small synthetic
stand-in for FashionMNIST and the same training done the MegEngine way, as their reference."""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.data as data
import minigrad.module as M
import minigrad.optimizer as optim


class SyntheticFashionMNIST:
    """FashionMNIST's sample format after ``ToTensor`` (a ``(1, 28, 28)`` float32 tensor in
    [0, 1] and an int label in 0..9), learnable: each image is its class's pattern plus noise."""

    def __init__(self, n: int, seed: int):
        rng = np.random.default_rng(seed)
        patterns = np.random.default_rng(99).random((10, 1, 28, 28), dtype=np.float32)
        self.labels = rng.integers(0, 10, n)
        noise = rng.random((n, 1, 28, 28), dtype=np.float32)
        self.images = (0.5 * patterns[self.labels] + 0.5 * noise).astype(np.float32)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return mg.tensor(self.images[i]), int(self.labels[i])


def full_loss(model, dataset) -> float:
    """The model's mean cross entropy over the whole dataset."""
    with mg.no_grad():
        x = mg.tensor(dataset.images)
        return float(M.CrossEntropyLoss()(model(x), mg.tensor(dataset.labels)))


def grad_manager_reference(net_class, dataset, sampler, epochs: int, lr: float,
                           peeked: bool = False):
    """``net_class()`` built after ``mg.random.seed(0)`` and trained the MegEngine way (a
    GradManager, SGD, one step per batch of ``sampler``) for ``epochs`` passes; ``peeked``: a pass
    was started and left after one batch first (as a program that prints one batch does)."""
    mg.random.seed(0)
    model = net_class()
    loss_fn = M.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=lr)
    gm = ad.GradManager().attach(model.parameters())
    loader = data.DataLoader(dataset, sampler)
    if peeked:
        next(iter(loader))
    for _ in range(epochs):
        for x, y in loader:
            with gm:
                gm.backward(loss_fn(model(mg.tensor(x)), mg.tensor(y)))
            optimizer.step().clear_grad()
    return model
