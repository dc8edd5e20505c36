"""gru-fedavgm: the model, the data and the training loop."""

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """A GRU over the sequence, batch norm on its last state, a linear classifier."""

    def __init__(self, features: int = 3, hidden: int = 16, classes: int = 2):
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        _, last = self.gru(x)
        return self.fc(self.bn(last[-1]))


def load_data(path: str, partition_id: int, num_partitions: int):
    """This partition of the sequences in ``path`` (``x``: N x T x F, ``y``: N): 80% train, 20% test."""
    data = np.load(path)
    x = torch.tensor(data["x"], dtype=torch.float32)
    y = torch.tensor(data["y"], dtype=torch.long)
    part = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    n_train = int(0.8 * len(part))
    train, test = part[:n_train], part[n_train:]
    trainloader = DataLoader(TensorDataset(x[train], y[train]), batch_size=16, shuffle=True)
    testloader = DataLoader(TensorDataset(x[test], y[test]), batch_size=64)
    return trainloader, testloader


def train(net, trainloader, epochs, lr):
    """Train the model on the training set; the mean loss."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(1, batches)


def test(net, testloader):
    """Loss and accuracy on the test set."""
    criterion = nn.CrossEntropyLoss()
    net.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in testloader:
            out = net(x)
            loss += criterion(out, y).item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
    n = len(testloader.dataset)
    return loss / n, correct / n
