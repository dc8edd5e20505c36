"""Models for the examples and the paper's experiments.

* :class:`DigitsCNN`: tiny CNN for scikit-learn's 8x8 digits (quickstarts, tests).
* :class:`FashionCNN`: ~36k-parameter five-conv CNN for 28x28 grayscale images.
* :class:`VGG6`: the paper's CIFAR-10 model (~3.92M parameters).
* :func:`ResNet8`: the paper's CIFAR-100 model (~1.26M parameters, 100 classes).
* :func:`ResNet10`: the paper's TinyImageNet model (~5.01M parameters, 200 classes).
  Both build one class, :class:`ResNet`, with their stages.

:func:`build_model` builds any of them by name.
"""

from __future__ import annotations

from torch import nn

from .cnn import FashionCNN
from .resnet import BasicBlock, ResNet, ResNet8, ResNet10
from .small_cnn import NUM_CLASSES as DIGITS_NUM_CLASSES
from .small_cnn import DigitsCNN
from .vgg import VGG6

MODEL_NAMES = ("digits-cnn", "fashion-cnn", "vgg6", "resnet8", "resnet10")

__all__ = [
    "MODEL_NAMES",
    "BasicBlock",
    "DigitsCNN",
    "FashionCNN",
    "ResNet",
    "ResNet8",
    "ResNet10",
    "VGG6",
    "build_model",
]


def build_model(name: str, num_classes: int, in_channels: int) -> nn.Module:
    """Build a model by name.

    Parameters
    ----------
    name : str
        One of ``"digits-cnn"``, ``"fashion-cnn"``, ``"vgg6"``, ``"resnet8"``,
        ``"resnet10"``.
    num_classes : int
        Number of output logits.
    in_channels : int
        Channels of the input images.

    Returns
    -------
    torch.nn.Module
        A freshly initialised model.

    Raises
    ------
    ValueError
        If ``name`` is unknown, or for ``"digits-cnn"`` (fixed to 1 input
        channel and 10 classes) when other values are asked for.
    """
    if name == "digits-cnn":
        if num_classes != DIGITS_NUM_CLASSES or in_channels != 1:
            raise ValueError(
                f"'digits-cnn' has {DIGITS_NUM_CLASSES} classes and 1 input channel; "
                f"got num_classes={num_classes}, in_channels={in_channels}"
            )
        return DigitsCNN()
    if name == "fashion-cnn":
        return FashionCNN(num_classes=num_classes, in_channels=in_channels)
    if name == "vgg6":
        return VGG6(num_classes=num_classes, in_channels=in_channels)
    if name == "resnet8":
        return ResNet8(num_classes=num_classes, in_channels=in_channels)
    if name == "resnet10":
        return ResNet10(num_classes=num_classes, in_channels=in_channels)
    raise ValueError(f"unknown model {name!r}; allowed names: {', '.join(MODEL_NAMES)}")
