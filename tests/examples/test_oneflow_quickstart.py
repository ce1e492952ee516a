"""OneFlow's quickstart (docs.oneflow.org, "Quickstart": FashionMNIST with an MLP, eager
``loss.backward()``, ``flow.no_grad`` evaluation, ``flow.save``/``flow.load``) runs with only its
imports changed to ``import minigrad as flow`` / ``import minigrad.module as nn`` (issue 27).

The dataset is a small synthetic stand-in of FashionMNIST's shape (flowvision's ``ToTensor`` gives
``(1, 28, 28)`` float32 tensors and int labels); the program's code below follows the tutorial
step by step. Its training must lower the loss and give exactly the parameters that the MegEngine
way (a GradManager) gives from the same start and the same batches.
"""

import numpy as np
from quickstart_data import SyntheticFashionMNIST, full_loss, grad_manager_reference

import minigrad as flow
import minigrad.data as data
import minigrad.module as nn

BATCH_SIZE = 8
EPOCHS = 2


# --- the quickstart, as OneFlow's documentation writes it (imports changed) -------------------

def quickstart(training_data, test_data, model_path):
    DEVICE = "cuda" if flow.cuda.is_available() else "cpu"
    print("Using {} device".format(DEVICE))

    train_dataloader = flow.utils.data.DataLoader(training_data, BATCH_SIZE, shuffle=True)
    test_dataloader = flow.utils.data.DataLoader(test_data, BATCH_SIZE, shuffle=False)
    for x, y in train_dataloader:
        print("x.shape:", x.shape)
        print("y.shape:", y.shape)
        break

    class NeuralNetwork(nn.Module):
        def __init__(self):
            super(NeuralNetwork, self).__init__()
            self.flatten = nn.Flatten()
            self.linear_relu_stack = nn.Sequential(
                nn.Linear(28 * 28, 512),
                nn.ReLU(),
                nn.Linear(512, 512),
                nn.ReLU(),
                nn.Linear(512, 10),
            )

        def forward(self, x):
            x = self.flatten(x)
            logits = self.linear_relu_stack(x)
            return logits

    model = NeuralNetwork().to(DEVICE)
    print(model)
    loss_fn = nn.CrossEntropyLoss().to(DEVICE)
    optimizer = flow.optim.SGD(model.parameters(), lr=1e-3)

    def train(iter, model, loss_fn, optimizer):
        size = len(iter.dataset)
        for batch, (x, y) in enumerate(iter):
            x = x.to(DEVICE)
            y = y.to(DEVICE)

            # Compute prediction error
            pred = model(x)
            loss = loss_fn(pred, y)

            # Backpropagation
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            current = batch * BATCH_SIZE
            if batch % 2 == 0:
                print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")

    def test(iter, model, loss_fn):
        size = len(iter.dataset)
        num_batches = len(iter)
        model.eval()
        test_loss, correct = 0, 0
        with flow.no_grad():
            for x, y in iter:
                x = x.to(DEVICE)
                y = y.to(DEVICE)
                pred = model(x)
                test_loss += loss_fn(pred, y)
                bool_value = (pred.argmax(1).to(dtype=flow.int64) == y)
                correct += float(bool_value.sum().numpy())
        test_loss /= num_batches
        print("test_loss", test_loss, "num_batches ", num_batches)
        correct /= size
        print(f"Test Error: \n Accuracy: {(100*correct):>0.1f}, Avg loss: {test_loss:>8f}")

    for t in range(EPOCHS):
        print(f"Epoch {t+1}\n-------------------------------")
        train(train_dataloader, model, loss_fn, optimizer)
        test(test_dataloader, model, loss_fn)
    print("Done!")

    flow.save(model.state_dict(), model_path)
    print("Saved OneFlow Model")
    model2 = NeuralNetwork().to(DEVICE)
    model2.load_state_dict(flow.load(model_path))
    return model, model2, train_dataloader, NeuralNetwork


# --- checks ------------------------------------------------------------------------------------

def test_oneflow_quickstart_runs_and_trains_like_a_grad_manager(tmp_path, capsys):
    training_data, test_data = SyntheticFashionMNIST(48, 0), SyntheticFashionMNIST(16, 1)
    flow.random.seed(0)
    model, model2, train_dataloader, net_class = quickstart(training_data, test_data,
                                                            str(tmp_path / "model"))
    out = capsys.readouterr().out
    assert "x.shape: (8, 1, 28, 28)" in out and "Accuracy:" in out and "Done!" in out
    printed = [line for line in out.splitlines() if line.startswith("loss: ")]
    assert len(printed) == EPOCHS * 3  # batches 0, 2, 4 of 6 in each epoch

    flow.random.seed(0)
    initial = net_class()
    assert full_loss(model, training_data) < full_loss(initial, training_data) - 1e-3

    sampler = data.RandomSampler(training_data, BATCH_SIZE, seed=train_dataloader.sampler.seed,
                                 world_size=1, rank=0)
    reference = grad_manager_reference(net_class, training_data, sampler, EPOCHS, 1e-3,
                                       peeked=True)
    for (name, p), q, r in zip(model.named_parameters(), model2.parameters(),
                               reference.parameters(), strict=True):
        assert not np.array_equal(p.numpy(), initial.state_dict()[name]), name  # trained
        np.testing.assert_allclose(p.numpy(), r.numpy(), rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(q.numpy(), p.numpy())  # flow.save / flow.load
