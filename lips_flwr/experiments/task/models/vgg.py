"""VGG6 with batch norm, the paper's CIFAR-10 model.

Five 3x3 convolutions (64, 128, 256, 512, 512 channels, with bias, padding 1),
each followed by batch norm, ReLU and a 2x2 max-pool, then one linear layer
512 -> classes. About 3.92M parameters for 10 classes. The max-pools round
up (``ceil_mode``): the same as rounding down on the paper's 32x32 inputs,
where every map has an even size, and what lets 28x28 Fashion-MNIST through
(28 -> 14 -> 7 -> 4 -> 2 -> 1 instead of a 0x0 map after the fifth).

The convolution stack is an :class:`torch.nn.Sequential` named ``features``
so that the stem convolution's tensors are ``features.0.weight`` and
``features.0.bias``: the authors' reference code (the ``"reference"`` layer
preset in :mod:`lips_flwr.core.layers`) recognises the VGG stem by that name. The
head is named ``classifier``.

State-dict layout (each conv block takes four indices in ``features``)::

    features.0   Conv2d(in, 64)     features.1   BatchNorm2d(64)
    features.4   Conv2d(64, 128)    features.5   BatchNorm2d(128)
    features.8   Conv2d(128, 256)   features.9   BatchNorm2d(256)
    features.12  Conv2d(256, 512)   features.13  BatchNorm2d(512)
    features.16  Conv2d(512, 512)   features.17  BatchNorm2d(512)
    classifier   Linear(512, num_classes)

(indices 2, 3, 6, 7, ... are the parameter-free ReLU and max-pool modules).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

VGG6_CHANNELS: tuple[int, ...] = (64, 128, 256, 512, 512)


def make_vgg_features(in_channels: int, channels: Sequence[int]) -> nn.Sequential:
    """Build the VGG convolution stack.

    Parameters
    ----------
    in_channels : int
        Channels of the input images (3 for RGB).
    channels : sequence of int
        Output channels of each 3x3 convolution, in order.

    Returns
    -------
    torch.nn.Sequential
        ``Conv2d(3x3, bias, padding 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2, ceil_mode=True)``
        per entry of ``channels``; the first convolution is module ``0``. A
        map of odd size keeps its last row and column as a pooled cell of its
        own (rounding down would drop them); on even sizes both are the same.
    """
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if not channels:
        raise ValueError("channels must not be empty")
    layers: list[nn.Module] = []
    previous = in_channels
    for width in channels:
        layers.extend(
            [
                nn.Conv2d(previous, width, kernel_size=3, padding=1, bias=True),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True),
            ]
        )
        previous = width
    return nn.Sequential(*layers)


class VGG6(nn.Module):
    """VGG6 with batch norm: five conv blocks and one linear classifier.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input images.

    Notes
    -----
    Built for 32x32 inputs (CIFAR-10), where five 2x2 max-pools leave a 1x1
    map. An adaptive average pool to 1x1 before the classifier makes other
    input sizes work too (it is the identity at 32x32); the max-pools round
    up, so that smaller inputs such as 28x28 Fashion-MNIST also end at 1x1.

    For LIPS, the ``"middle"`` layers are the kernels of
    convolutions 2-5 (``features.{4,8,12,16}.weight``); the ``"reference"``
    preset picks the same four (it drops ``features.0`` by name and the
    linear layer by rank). Conv and classifier biases and all batch-norm
    tensors are never sparsified.

    Examples
    --------
    >>> model = VGG6(num_classes=10)
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.features = make_vgg_features(in_channels, VGG6_CHANNELS)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(VGG6_CHANNELS[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Compute logits.

        Parameters
        ----------
        x : torch.Tensor
            Images of shape ``(batch, in_channels, height, width)`` (32x32 for
            CIFAR-10; 28x28 works too).

        Returns
        -------
        torch.Tensor
            Logits of shape ``(batch, num_classes)``.
        """
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


__all__ = ["VGG6", "VGG6_CHANNELS", "make_vgg_features"]
