"""Datasets of the paper and the offline ones, as in-memory uint8 arrays.

Offline: Fashion-MNIST (the IDX files of Debian's ``dataset-fashion-mnist``
package, a user-given folder, or torchvision's download) and scikit-learn's
digits. Online (cached by Hugging Face ``datasets``): CIFAR-10
(``uoft-cs/cifar10``), CIFAR-100 (``uoft-cs/cifar100``) and TinyImageNet
(``zh-plus/tiny-imagenet``). Images are kept as ``uint8`` NCHW arrays; each
client turns its few hundred samples into float tensors (preload,
augment once).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from .partition import class_indices, low_data_indices

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)  # Debian: dataset-fashion-mnist
HF_NAMES = {
    "cifar10": ("uoft-cs/cifar10", "img", "label", "test"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label", "test"),
    "tinyimagenet": ("zh-plus/tiny-imagenet", "image", "label", "valid"),
}
DATASETS = ("fashion-mnist", "digits", *HF_NAMES)
# (num_classes, channels): enough to build a model without loading the data.
DATASET_INFO = {
    "fashion-mnist": (10, 1), "digits": (10, 1),
    "cifar10": (10, 3), "cifar100": (100, 3), "tinyimagenet": (200, 3),
}


@dataclass(frozen=True)
class ImageDataset:
    """Train and test images (uint8, NCHW), integer labels and normalisation."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    # Each split's indices per class, found once for all the clients a process builds.
    @functools.cached_property
    def train_pools(self) -> tuple[np.ndarray, ...]:
        return class_indices(self.y_train, self.num_classes)

    @functools.cached_property
    def test_pools(self) -> tuple[np.ndarray, ...]:
        return class_indices(self.y_test, self.num_classes)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read a (gzip) IDX file of unsigned bytes, as MNIST and Fashion-MNIST ship."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = _gunzip(data)
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _gunzip(data: bytes) -> bytes:
    """``gzip.decompress(data)``, in one zlib call for a file of one gzip member (Fashion-MNIST's):
    ``gzip.decompress`` copies the stream after each header and checks it again, 1.2x the time of
    the ~0.2 s a process spends on the training images."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # (a gzip header and trailer, checked)
    try:
        out = inflate.decompress(data)
    except zlib.error:  # not gzip, or damaged: gzip's own error (BadGzipFile, an OSError)
        return gzip.decompress(data)
    if not inflate.eof or inflate.unused_data:  # truncated, or more members: gzip's own result or error
        return gzip.decompress(data)
    return out


def _find_idx(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).exists():
            return folder / name
    return None


def load_fashion_mnist(path: str | os.PathLike | None = None) -> ImageDataset:
    """Fashion-MNIST from ``path``, Debian's package, or torchvision's download."""
    folders = [Path(path)] if path else [Path(d) for d in FASHION_MNIST_DIRS]
    for folder in folders:
        files = [_find_idx(folder, f"{s}-idx{d}-ubyte") for s, d in
                 (("train-images", 3), ("train-labels", 1), ("t10k-images", 3), ("t10k-labels", 1))]
        if all(files):
            x_tr, y_tr, x_te, y_te = (read_idx(cast(Path, f)) for f in files)  # all found
            break
    else:
        if path:
            raise FileNotFoundError(
                f"no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in {path}")
        from torchvision.datasets import FashionMNIST  # needs the internet once

        root = Path.home() / ".cache" / "lips-flwr"
        train, test = (FashionMNIST(root, train=t, download=True) for t in (True, False))
        x_tr, y_tr, x_te, y_te = (train.data.numpy(), train.targets.numpy(),
                                  test.data.numpy(), test.targets.numpy())
    return ImageDataset("fashion-mnist", x_tr[:, None], y_tr.astype(np.int64), x_te[:, None],
                        y_te.astype(np.int64), 10, (0.2860,), (0.3530,))


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` gives them: images ``(1797, 8, 8)`` in 0..16, labels.

    Read from scikit-learn's data file, as ``load_digits`` reads it, without
    importing scikit-learn: that import is ~2 s of CPU, paid by every process
    that loads a client (each ClientApp process of a deployed SuperNode). In
    another package layout, ``load_digits`` itself.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    path = folder / "datasets" / "data" / "digits.csv.gz" if folder else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits  # optional dependency (extra "examples")

        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(path, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_digits_dataset(seed: int = 0) -> ImageDataset:
    """scikit-learn's 8x8 digits, split 70/30 per class (seeded), scaled to 0..255."""
    images, target = digits_arrays()
    x = np.round(images * (255 / 16)).astype(np.uint8)[:, None]
    y = target.astype(np.int64)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        cut = int(0.7 * idx.size)
        train.append(idx[:cut])
        test.append(idx[cut:])
    tr, te = np.concatenate(train), np.concatenate(test)
    return ImageDataset("digits", x[tr], y[tr], x[te], y[te], 10, (0.3,), (0.38,))


def load_hf_images(name: str) -> ImageDataset:
    """CIFAR-10/100 or TinyImageNet through Hugging Face ``datasets`` (online, then cached)."""
    import datasets  # installed with flwr-datasets

    repo, image_key, label_key, test_split = HF_NAMES[name]
    data = datasets.load_dataset(repo)
    arrays: list[np.ndarray] = []
    for split in ("train", test_split):
        part = data[split]
        images = np.stack([np.asarray(img.convert("RGB"), dtype=np.uint8) for img in part[image_key]])
        arrays += [images.transpose(0, 3, 1, 2), np.asarray(part[label_key], dtype=np.int64)]
    num_classes = {"cifar10": 10, "cifar100": 100, "tinyimagenet": 200}[name]
    mean, std = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
    if name == "cifar100":
        mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    elif name == "tinyimagenet":
        mean, std = (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)
    x_tr, y_tr, x_te, y_te = arrays
    return ImageDataset(name, x_tr, y_tr, x_te, y_te, num_classes, mean, std)


@functools.lru_cache(maxsize=4)
def load_dataset(name: str, path: str | None = None, seed: int = 0) -> ImageDataset:
    """One of :data:`DATASETS`, loaded once per process (clients of a Ray worker share it)."""
    if name == "fashion-mnist":
        return load_fashion_mnist(path)
    if name == "digits":
        return load_digits_dataset(seed)
    if name in HF_NAMES:
        return load_hf_images(name)
    raise ValueError(f"`dataset` must be one of {DATASETS}, got {name!r}")


def client_split(
    data: ImageDataset, partition_id: int, samples: int, test_samples: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One client's (x_train, y_train, x_test, y_test): the paper's low-data split."""
    tr = low_data_indices(data.y_train, partition_id, samples, alpha, seed, "train", data.num_classes,
                          data.train_pools)
    te = low_data_indices(data.y_test, partition_id, test_samples, alpha, seed, "test", data.num_classes,
                          data.test_pools)
    return data.x_train[tr], data.y_train[tr], data.x_test[te], data.y_test[te]


__all__ = [
    "DATASETS", "DATASET_INFO", "FASHION_MNIST_DIRS", "HF_NAMES", "ImageDataset",
    "client_split", "digits_arrays", "load_dataset", "load_digits_dataset", "load_fashion_mnist",
    "load_hf_images", "read_idx",
]
