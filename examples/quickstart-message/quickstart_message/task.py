"""Model, data and training loop shared by the ServerApp and the ClientApp.

Data: scikit-learn's ``load_digits`` (1797 8x8 images, bundled, works offline).
Each client gets exactly ``samples-per-client`` training samples and a 100-sample
test set, both drawn with the same class proportions from a Dirichlet(alpha)
seeded by ``(seed, partition-id)``: the split is reproducible.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

NUM_CLASSES = 10
TEST_SIZE = 100
BATCH_SIZE = 50

torch.set_num_threads(1)


class Net(nn.Module):
    """Small CNN with batch norm: first conv, two middle convs, last linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.bn3 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        x = torch.relu(self.bn3(self.conv3(x)))
        return self.fc(x.mean(dim=(2, 3)))


def _pools(seed: int) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Split load_digits 70/30 per class into a train pool and a test pool."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in range(NUM_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        cut = int(0.7 * len(idx))
        train_idx.append(idx[:cut])
        test_idx.append(idx[cut:])
    return x, y, train_idx, test_idx


def _draw(rng: np.random.Generator, pools: list, counts: np.ndarray) -> np.ndarray:
    """Draw counts[c] indices from pools[c] (with replacement only if needed)."""
    out = [
        rng.choice(pool, size=n, replace=n > len(pool))
        for pool, n in zip(pools, counts)
        if n > 0
    ]
    return rng.permutation(np.concatenate(out))


def load_data(
    partition_id: int, samples: int = 100, alpha: float = 0.5, seed: int = 0
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """Return (train, test) TensorDatasets for one client."""
    x, y, train_pools, test_pools = _pools(seed)
    rng = np.random.default_rng([seed, partition_id])
    props = rng.dirichlet([alpha] * NUM_CLASSES)
    train = _draw(rng, train_pools, rng.multinomial(samples, props))
    test = _draw(rng, test_pools, rng.multinomial(TEST_SIZE, props))
    tds = torch.utils.data.TensorDataset
    return (
        tds(torch.from_numpy(x[train]), torch.from_numpy(y[train])),
        tds(torch.from_numpy(x[test]), torch.from_numpy(y[test])),
    )


def train(net: nn.Module, data, epochs: int, seed: int = 0) -> float:
    """Train with SGD (lr 0.05, momentum 0.9); return the mean training loss."""
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        data, batch_size=BATCH_SIZE, shuffle=True, generator=gen
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
            count += len(yb)
    return total / max(count, 1)


@torch.no_grad()
def test(net: nn.Module, data) -> tuple[float, float]:
    """Return (loss, accuracy) on ``data``."""
    net.eval()
    xb, yb = data.tensors
    logits = net(xb)
    loss = nn.functional.cross_entropy(logits, yb).item()
    acc = (logits.argmax(dim=1) == yb).float().mean().item()
    return loss, acc
