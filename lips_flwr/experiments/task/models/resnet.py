"""ResNet8 and ResNet10 with batch norm, the paper's CIFAR-100 and TinyImageNet models.

Both follow the ImageNet-style layout of the paper: a 7x7 stride-2 stem
convolution (64 channels, no bias) with batch norm, ReLU and a 3x3 stride-2
max-pool, then stages of one :class:`BasicBlock` each, global average pooling
and a linear classifier. ResNet8 has stages of 64, 128 and 256 channels
(strides 1, 2, 2); ResNet10 adds a fourth of 512 channels (stride 2). A block
whose output shape differs from its input gets a 1x1 convolution + batch norm
shortcut. Both are one class, :class:`ResNet`, that takes the stages:
:func:`ResNet8` and :func:`ResNet10` build it with their stages and default
class counts (``isinstance(model, ResNet)``; ``len(model.stages)`` says which).

Parameter counts: ResNet8 with 100 classes about 1.26M, ResNet10 with 200
classes about 5.01M.

State-dict names: ``conv1`` / ``bn1`` (stem), ``layer{i}.0.conv1``,
``layer{i}.0.bn1``, ``layer{i}.0.conv2``, ``layer{i}.0.bn2``,
``layer{i}.0.shortcut.0`` (1x1 conv) and ``layer{i}.0.shortcut.1`` (its batch
norm) when present, and ``fc`` (classifier).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

RESNET8_STAGES: tuple[tuple[int, int], ...] = ((64, 1), (128, 2), (256, 2))
RESNET10_STAGES: tuple[tuple[int, int], ...] = RESNET8_STAGES + ((512, 2),)
STEM_CHANNELS = 64


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection.

    Parameters
    ----------
    in_channels : int
        Channels of the block's input.
    out_channels : int
        Channels of the block's output.
    stride : int, default 1
        Stride of the first convolution (and of the shortcut).

    Notes
    -----
    The shortcut is the identity when ``stride == 1`` and the channel counts
    match; otherwise it is a 1x1 convolution (no bias) with the given stride
    followed by batch norm, stored as ``shortcut.0`` and ``shortcut.1``.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ImageNet-style ResNet with one :class:`BasicBlock` per stage.

    Parameters
    ----------
    stages : sequence of (int, int)
        ``(channels, stride)`` of each stage, in order; stage ``i`` (from 1)
        is the module ``layer{i}``.
    num_classes : int
        Number of output logits.
    in_channels : int, default 3
        Channels of the input images.

    Notes
    -----
    Convolutions are initialised with Kaiming-normal (fan-out, ReLU) and
    batch norm with weight 1 and bias 0, as in torchvision's ResNets; the
    classifier keeps PyTorch's default initialisation.

    For LIPS the ``"middle"`` layers are every block
    convolution and every 1x1 shortcut convolution: the stem ``conv1.weight``
    (first candidate) and ``fc.weight`` (last) are excluded. The
    ``"reference"`` preset picks the same set here (the stem by its 7x7
    kernel, the classifier as a linear layer).
    """

    def __init__(
        self, stages: Sequence[tuple[int, int]], num_classes: int, in_channels: int = 3
    ) -> None:
        super().__init__()
        if not stages:
            raise ValueError("stages must not be empty")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if in_channels < 1:
            raise ValueError(f"in_channels must be >= 1, got {in_channels}")
        self.conv1 = nn.Conv2d(
            in_channels, STEM_CHANNELS, kernel_size=7, stride=2, padding=3, bias=False
        )
        self.bn1 = nn.BatchNorm2d(STEM_CHANNELS)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        previous = STEM_CHANNELS
        self.stages = tuple(stages)  # (ResNet8 or ResNet10: RESNET8_STAGES or RESNET10_STAGES)
        self.num_stages = len(stages)
        for index, (channels, stride) in enumerate(stages, start=1):
            self.add_module(f"layer{index}", nn.Sequential(BasicBlock(previous, channels, stride)))
            previous = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(previous, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Compute logits.

        Parameters
        ----------
        x : torch.Tensor
            Images of shape ``(batch, in_channels, height, width)``.

        Returns
        -------
        torch.Tensor
            Logits of shape ``(batch, num_classes)``.
        """
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{index}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def ResNet8(num_classes: int = 100, in_channels: int = 3) -> ResNet:  # noqa: N802 (the model's name)
    """ResNet8: stages of 64, 128 and 256 channels; the paper's CIFAR-100 model.

    Parameters
    ----------
    num_classes : int, default 100
        Number of output logits.
    in_channels : int, default 3
        Channels of the input images (32x32 CIFAR images in the paper).

    Examples
    --------
    >>> ResNet8()(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 100])
    """
    return ResNet(RESNET8_STAGES, num_classes, in_channels)


def ResNet10(num_classes: int = 200, in_channels: int = 3) -> ResNet:  # noqa: N802 (the model's name)
    """ResNet10: ResNet8 plus a 512-channel stage; the paper's TinyImageNet model.

    Parameters
    ----------
    num_classes : int, default 200
        Number of output logits.
    in_channels : int, default 3
        Channels of the input images (64x64 TinyImageNet images in the paper).

    Examples
    --------
    >>> ResNet10()(torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 200])
    """
    return ResNet(RESNET10_STAGES, num_classes, in_channels)


__all__ = [
    "BasicBlock", "RESNET10_STAGES", "RESNET8_STAGES", "ResNet", "ResNet10", "ResNet8",
    "STEM_CHANNELS",
]
