"""A small five-convolution CNN with batch norm for 28x28 grayscale images.

:class:`FashionCNN` is the CPU-sized model ("a
36k-parameter 5-conv CNN") for Fashion-MNIST-shaped data: five 3x3
convolutions (no bias: batch norm follows each), each with batch norm and
ReLU, a 2x2 max-pool after the second and the fourth, global average pooling
and a linear classifier::

    conv1  in -> w        28x28
    conv2  w -> w         28x28, max-pool -> 14x14
    conv3  w -> 2w        14x14
    conv4  2w -> 2w       14x14, max-pool -> 7x7
    conv5  2w -> 4w       7x7, global average pool
    fc     4w -> classes

With the default width ``w = 16`` and 10 classes it has 35,674 parameters;
``width=32`` gives the ~140k-parameter variant that section 11 also measured
(140,458 parameters).
"""

from __future__ import annotations

import torch
from torch import nn

DEFAULT_WIDTH = 16
NUM_CONVS = 5


def _conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 convolution (padding 1, no bias) -> BatchNorm2d -> ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class FashionCNN(nn.Module):
    """Five-conv CNN with batch norm for 28x28 grayscale images (~36k parameters).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input images.
    width : int, default 16
        Channels of the first two convolutions; the next two have ``2 * width``
        and the last ``4 * width``.

    Notes
    -----
    Each convolution block is an :class:`torch.nn.Sequential` ``conv{i}``
    (``i`` from 1 to 5) holding the convolution at index 0 and its batch norm
    at index 1, so the kernels are ``conv1.0.weight`` ... ``conv5.0.weight``
    and the classifier is ``fc``.

    For LIPS the ``"middle"`` layers are the kernels of
    convolutions 2-5, ``conv2.0.weight`` to ``conv5.0.weight``;
    the stem ``conv1.0.weight`` and ``fc.weight`` are excluded. The
    ``"reference"`` preset (which only recognises a 7x7 stem or a stem named
    ``features.0``) keeps ``conv1.0.weight`` and drops only ``fc.weight``.

    Examples
    --------
    >>> FashionCNN()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(
        self, num_classes: int = 10, in_channels: int = 1, width: int = DEFAULT_WIDTH
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if in_channels < 1:
            raise ValueError(f"in_channels must be >= 1, got {in_channels}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.conv1 = _conv_bn_relu(in_channels, width)
        self.conv2 = _conv_bn_relu(width, width)
        self.conv3 = _conv_bn_relu(width, 2 * width)
        self.conv4 = _conv_bn_relu(2 * width, 2 * width)
        self.conv5 = _conv_bn_relu(2 * width, 4 * width)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Compute logits.

        Parameters
        ----------
        x : torch.Tensor
            Images of shape ``(batch, in_channels, height, width)``; 28x28 for
            Fashion-MNIST (any size of at least 4x4 works).

        Returns
        -------
        torch.Tensor
            Logits of shape ``(batch, num_classes)``.
        """
        x = self.pool(self.conv2(self.conv1(x)))
        x = self.pool(self.conv4(self.conv3(x)))
        x = self.conv5(x)
        return self.fc(x.mean(dim=(2, 3)))


__all__ = ["DEFAULT_WIDTH", "FashionCNN", "NUM_CONVS"]
