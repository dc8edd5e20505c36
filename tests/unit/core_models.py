"""Shared fixtures for the core unit tests: small realistic state dicts.

Import the fixtures into a test module: ``from core_models import small_net``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn


class SmallNet(nn.Module):
    """conv + BN + conv + BN + 1x1 shortcut + linear (FedBN-style model)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, bias=True)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.shortcut = nn.Conv2d(8, 16, 1, bias=False)
        self.fc = nn.Linear(16, 10)


class ResNetLike(nn.Module):
    """7x7 stem, one block with 1x1 shortcut, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(
            nn.ModuleDict(
                {
                    "conv1": nn.Conv2d(8, 8, 3, bias=False),
                    "bn1": nn.BatchNorm2d(8),
                    "shortcut": nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)),
                }
            )
        )
        self.fc1 = nn.Linear(16, 12)
        self.fc2 = nn.Linear(12, 10)


def vgg_like() -> nn.Module:
    """``features.0`` is a 3x3 stem; ``features.10`` must not look like the stem."""
    model = nn.Module()
    model.features = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),  # 0, 1, 2
        nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),  # 3, 4, 5
        nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),  # 6, 7, 8
        nn.Identity(),  # 9
        nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),  # 10, 11
    )
    model.classifier = nn.Linear(8, 10)
    return model


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture
def small_net() -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    return to_numpy(SmallNet())


@pytest.fixture
def resnet_like() -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    return to_numpy(ResNetLike())


@pytest.fixture
def vgg_net() -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    return to_numpy(vgg_like())
