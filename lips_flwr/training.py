"""Plain PyTorch training and evaluation loops used by the example apps."""

from __future__ import annotations

import torch
from torch import nn


def train(
    net: nn.Module, data, epochs: int, seed: int = 0, lr: float = 0.05, batch_size: int = 50
) -> float:
    """Train with SGD (momentum 0.9, a fresh optimizer per call); return the mean loss."""
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=gen
    )
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
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
def evaluate(net: nn.Module, data) -> tuple[float, float]:
    """Return (loss, accuracy) on ``data``."""
    net.eval()
    xb, yb = data.tensors
    logits = net(xb)
    loss = nn.functional.cross_entropy(logits, yb).item()
    acc = (logits.argmax(dim=1) == yb).float().mean().item()
    return loss, acc
