"""Plain PyTorch training and evaluation loops used by the example apps.

Data are tensors already on the training device (a client has a few hundred
samples: no DataLoader, no worker processes). Augmentation runs batched on
that device, once per sample per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F

AUGMENTATIONS = ("none", "flip-crop-rotate", "flip-rotate")


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Random horizontal flip, 15-degree rotation and (``flip-crop-rotate``) 4-pixel crop.

    The paper's CIFAR-100 (flip, rotation, crop 32 with padding 4) and
    TinyImageNet (flip, rotation) augmentations, batched.
    """
    if kind == "none":
        return x
    if kind not in AUGMENTATIONS:
        raise ValueError(f"`augment` must be one of {AUGMENTATIONS}, got {kind!r}")
    n = x.shape[0]
    rand = lambda *s: torch.rand(*s, generator=generator, device="cpu").to(x.device)  # noqa: E731
    flip = rand(n) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    angle = (rand(n) * 2 - 1) * math.radians(15)
    cos, sin = torch.cos(angle), torch.sin(angle)
    shift = torch.zeros(n, 2, device=x.device)
    if kind == "flip-crop-rotate":  # a random crop of the 4-pixel padded image, as a shift
        shift = (torch.floor(rand(n, 2) * 9) - 4) * 2 / x.shape[-1]
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)


def train_tensors(
    net: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    batch_size: int = 100,
    augmentation: str = "none",
    seed: int = 0,
    decay_only: set[str] | None = None,
) -> float:
    """SGD with a fresh optimizer (the paper's local training); returns the mean loss.

    ``decay_only``: parameter names that get ``weight_decay`` (default: all).
    """
    generator = torch.Generator().manual_seed(seed)
    named = list(net.named_parameters())
    decayed = [p for n, p in named if decay_only is None or n in decay_only]
    others = [p for n, p in named if decay_only is not None and n not in decay_only]
    groups = [{"params": decayed, "weight_decay": weight_decay}]
    if others:
        groups.append({"params": others, "weight_decay": 0.0})
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum)
    net.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=generator).to(x.device)
        for start in range(0, x.shape[0], batch_size):
            idx = order[start:start + batch_size]
            xb, yb = augment(x[idx], augmentation, generator), y[idx]
            opt.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
            count += len(yb)
    return total / max(count, 1)


@torch.no_grad()
def evaluate_tensors(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000
) -> tuple[float, float]:
    """Return (mean loss, accuracy) of ``net`` in eval mode."""
    net.eval()
    loss, correct = 0.0, 0
    for start in range(0, x.shape[0], batch_size):
        logits = net(x[start:start + batch_size])
        yb = y[start:start + batch_size]
        loss += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == yb).sum())
    return loss / max(x.shape[0], 1), correct / max(x.shape[0], 1)


def train(
    net: nn.Module, data, epochs: int, seed: int = 0, lr: float = 0.05, batch_size: int = 50
) -> float:
    """:func:`train_tensors` on a ``TensorDataset`` (the quickstarts' settings)."""
    x, y = data.tensors
    return train_tensors(net, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def evaluate(net: nn.Module, data) -> tuple[float, float]:
    """:func:`evaluate_tensors` on a ``TensorDataset``."""
    return evaluate_tensors(net, *data.tensors)


class LocalCompute(Protocol):
    """Where a client's training and evaluation run: the signatures of the two loops above.

    A ClientApp that calls :func:`local_compute` instead of the loops directly
    lets an engine that holds many clients at once (the batched Grid) run
    their work together; under ``flwr run`` it is always :data:`SEQUENTIAL`.
    """

    def train(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> float: ...

    def evaluate(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]: ...


class _Sequential:
    """This client's work, done now, in this thread: :func:`train_tensors` and :func:`evaluate_tensors`."""

    def train(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> float:
        return train_tensors(net, x, y, **kwargs)

    def evaluate(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        return evaluate_tensors(net, x, y)


SEQUENTIAL: LocalCompute = _Sequential()
_CURRENT: ContextVar[LocalCompute] = ContextVar("lips_flwr_local_compute", default=SEQUENTIAL)


def local_compute() -> LocalCompute:
    """The engine that runs this client's training and evaluation (:data:`SEQUENTIAL` by default)."""
    return _CURRENT.get()


@contextmanager
def computing_with(engine: LocalCompute) -> Iterator[None]:
    """Within the block (this thread or context only), :func:`local_compute` returns ``engine``."""
    token = _CURRENT.set(engine)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def add_dropout(net: nn.Module, weight_names: list[str], p: float) -> list:
    """Dropout (``p``) on the outputs of the modules owning ``weight_names``, in training only.

    Returns the hook handles (``handle.remove()`` undoes it).
    """
    handles = []
    for name in weight_names:
        module = net.get_submodule(name.rsplit(".", 1)[0])
        handles.append(module.register_forward_hook(
            lambda m, _inputs, out: F.dropout(out, p, training=m.training)))
    return handles


__all__ = [
    "AUGMENTATIONS", "SEQUENTIAL", "LocalCompute", "add_dropout", "augment", "computing_with",
    "evaluate", "evaluate_tensors", "local_compute", "train", "train_tensors",
]
