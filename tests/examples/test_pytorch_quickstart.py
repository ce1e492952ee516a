"""PyTorch's quickstart tutorial (pytorch.org, "Learn the Basics: Quickstart": FashionMNIST with
an MLP, ``loss.backward()``, ``torch.no_grad`` evaluation, ``torch.save``/``torch.load``, one
prediction) runs with only its imports changed: ``import minigrad as torch``, ``from minigrad
import module as nn``, ``from minigrad.utils.data import DataLoader`` (issue 27).

The dataset is a small synthetic stand-in of FashionMNIST's shape (see ``quickstart_data``); the
program's code below follows the tutorial step by step. Its training must lower the loss and give
exactly the parameters that the MegEngine way (a GradManager) gives from the same start and the
same batches.
"""

import numpy as np
from minigrad.utils.data import DataLoader
from quickstart_data import SyntheticFashionMNIST, full_loss, grad_manager_reference

import minigrad as torch
import minigrad.data as data
from minigrad import module as nn

EPOCHS = 2


# --- the quickstart, as PyTorch's tutorial writes it (imports changed) -------------------------

def quickstart(training_data, test_data, model_path):
    batch_size = 8

    # Create data loaders.
    train_dataloader = DataLoader(training_data, batch_size=batch_size)
    test_dataloader = DataLoader(test_data, batch_size=batch_size)

    for X, y in test_dataloader:
        print(f"Shape of X [N, C, H, W]: {X.shape}")
        print(f"Shape of y: {y.shape} {y.dtype}")
        break

    device = (torch.accelerator.current_accelerator().type
              if torch.accelerator.is_available() else "cpu")
    print(f"Using {device} device")

    # Define model
    class NeuralNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.linear_relu_stack = nn.Sequential(
                nn.Linear(28 * 28, 512),
                nn.ReLU(),
                nn.Linear(512, 512),
                nn.ReLU(),
                nn.Linear(512, 10)
            )

        def forward(self, x):
            x = self.flatten(x)
            logits = self.linear_relu_stack(x)
            return logits

    model = NeuralNetwork().to(device)
    print(model)

    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train(dataloader, model, loss_fn, optimizer):
        size = len(dataloader.dataset)
        model.train()
        for batch, (X, y) in enumerate(dataloader):
            X, y = X.to(device), y.to(device)

            # Compute prediction error
            pred = model(X)
            loss = loss_fn(pred, y)

            # Backpropagation
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

            if batch % 100 == 0:
                loss, current = loss.item(), (batch + 1) * len(X)
                print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")

    def test(dataloader, model, loss_fn):
        size = len(dataloader.dataset)
        num_batches = len(dataloader)
        model.eval()
        test_loss, correct = 0, 0
        with torch.no_grad():
            for X, y in dataloader:
                X, y = X.to(device), y.to(device)
                pred = model(X)
                test_loss += loss_fn(pred, y).item()
                correct += (pred.argmax(1) == y).type(torch.float).sum().item()
        test_loss /= num_batches
        correct /= size
        print(f"Test Error: \n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \n")

    epochs = EPOCHS
    for t in range(epochs):
        print(f"Epoch {t+1}\n-------------------------------")
        train(train_dataloader, model, loss_fn, optimizer)
        test(test_dataloader, model, loss_fn)
    print("Done!")

    torch.save(model.state_dict(), model_path)
    print("Saved PyTorch Model State to model.pth")

    trained = model
    model = NeuralNetwork().to(device)
    model.load_state_dict(torch.load(model_path, weights_only=True))

    classes = [
        "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
        "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
    ]

    model.eval()
    x, y = test_data[0][0], test_data[0][1]
    with torch.no_grad():
        x = x.to(device)
        pred = model(x)
        predicted, actual = classes[pred[0].argmax(0)], classes[y]
        print(f'Predicted: "{predicted}", Actual: "{actual}"')
    return trained, model, NeuralNetwork


# --- checks ------------------------------------------------------------------------------------

def test_pytorch_quickstart_runs_and_trains_like_a_grad_manager(tmp_path, capsys):
    training_data, test_data = SyntheticFashionMNIST(48, 0), SyntheticFashionMNIST(16, 1)
    torch.random.seed(0)
    model, loaded, net_class = quickstart(training_data, test_data, str(tmp_path / "model.pth"))
    out = capsys.readouterr().out
    assert "Shape of X [N, C, H, W]: (8, 1, 28, 28)" in out
    assert "Shape of y: (8,) int64" in out and "Using cpu device" in out
    assert out.count("Accuracy:") == EPOCHS and "Predicted: " in out

    torch.random.seed(0)
    initial = net_class()
    assert full_loss(model, training_data) < full_loss(initial, training_data) - 1e-3

    sampler = data.SequentialSampler(training_data, 8, world_size=1, rank=0)
    reference = grad_manager_reference(net_class, training_data, sampler, EPOCHS, 1e-3)
    for (name, p), q, r in zip(model.named_parameters(), loaded.parameters(),
                               reference.parameters(), strict=True):
        assert not np.array_equal(p.numpy(), initial.state_dict()[name]), name  # trained
        np.testing.assert_allclose(p.numpy(), r.numpy(), rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(q.numpy(), p.numpy())  # torch.save / torch.load
