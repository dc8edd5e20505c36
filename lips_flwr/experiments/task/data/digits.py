"""scikit-learn's ``load_digits`` as a low-data, label-skewed federated dataset (offline).

Each client gets exactly ``samples`` training samples and a ``test_size``
test set, both drawn with the same class proportions ``q ~ Dir(alpha)``,
seeded by ``(seed, partition_id)`` (see :mod:`lips_flwr.experiments.task.data.partition`).
"""

from __future__ import annotations

import torch

from .datasets import client_split, load_dataset


def load_digits_client(
    partition_id: int, samples: int = 100, alpha: float = 0.5, seed: int = 0, test_size: int = 100
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """Return one client's (train, test) TensorDatasets: images in [0, 1], shape (1, 8, 8)."""
    x_tr, y_tr, x_te, y_te = client_split(
        load_dataset("digits", seed=seed), partition_id, samples, test_size, alpha, seed
    )
    tds = torch.utils.data.TensorDataset
    return (
        tds(torch.from_numpy(x_tr).float() / 255, torch.from_numpy(y_tr)),
        tds(torch.from_numpy(x_te).float() / 255, torch.from_numpy(y_te)),
    )


__all__ = ["load_digits_client"]
