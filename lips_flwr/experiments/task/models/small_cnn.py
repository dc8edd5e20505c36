"""A small CNN with batch norm, sized for scikit-learn's 8x8 digits (quickstarts, tests)."""

from __future__ import annotations

import torch
from torch import nn

NUM_CLASSES = 10


class DigitsCNN(nn.Module):
    """Small CNN with batch norm for 8x8 digits: a stem conv, two middle convs, a linear head.

    Its middle layers for LIPS are ``conv2.weight`` and ``conv3.weight``.
    """

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


__all__ = ["DigitsCNN", "NUM_CLASSES"]
