"""scikit-learn's ``load_digits`` as a low-data, label-skewed federated dataset (offline).

Each client gets exactly ``samples`` training samples and a ``test_size``
test set, both drawn with the same class proportions ``q ~ Dir(alpha)``,
seeded by ``(seed, partition_id)``: the split is reproducible and clients
draw independently (they may share samples), as in the paper's setup.
"""

from __future__ import annotations

import numpy as np
import torch

NUM_CLASSES = 10


def _pools(seed: int) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Split load_digits 70/30 per class into a train pool and a test pool."""
    from sklearn.datasets import load_digits  # optional dependency (extra "examples")

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in range(NUM_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        cut = int(0.7 * len(idx))
        train_idx.append(idx[:cut])
        test_idx.append(idx[cut:])
    return x, y, train_idx, test_idx


def _draw(rng: np.random.Generator, pools: list, counts: np.ndarray) -> np.ndarray:
    """Draw counts[c] indices from pools[c] (with replacement only if needed)."""
    out = [
        rng.choice(pool, size=n, replace=n > len(pool))
        for pool, n in zip(pools, counts)
        if n > 0
    ]
    return rng.permutation(np.concatenate(out))


def load_digits_client(
    partition_id: int, samples: int = 100, alpha: float = 0.5, seed: int = 0, test_size: int = 100
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """Return (train, test) TensorDatasets for one client."""
    x, y, train_pools, test_pools = _pools(seed)
    rng = np.random.default_rng([seed, partition_id])
    props = rng.dirichlet([alpha] * NUM_CLASSES)
    train = _draw(rng, train_pools, rng.multinomial(samples, props))
    test = _draw(rng, test_pools, rng.multinomial(test_size, props))
    tds = torch.utils.data.TensorDataset
    return (
        tds(torch.from_numpy(x[train]), torch.from_numpy(y[train])),
        tds(torch.from_numpy(x[test]), torch.from_numpy(y[test])),
    )
