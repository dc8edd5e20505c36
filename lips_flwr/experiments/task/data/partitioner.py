"""The low-data Dirichlet split as a flwr-datasets ``Partitioner``.

    from flwr_datasets import FederatedDataset
    fds = FederatedDataset(dataset="uoft-cs/cifar10", partitioners={
        "train": LowDataDirichletPartitioner(100, samples=100, alpha=0.1, seed=42),
        "test": LowDataDirichletPartitioner(100, samples=400, alpha=0.1, seed=42, split="test"),
    })
    train, test = fds.load_partition(7, "train"), fds.load_partition(7, "test")

The two partitioners give client 7 the same class proportions.
"""

from __future__ import annotations

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import Partitioner

from .partition import SPLIT_SALTS, low_data_indices


class LowDataDirichletPartitioner(Partitioner):
    """Exactly ``samples`` examples per partition, class proportions ``Dir(alpha)``.

    Partitions are drawn independently (they may overlap), seeded by
    ``(seed, partition_id)``; a partitioner with ``split="test"`` and the same
    ``seed``, ``alpha`` and ``num_partitions`` gives each partition the same
    class proportions (the paper's per-client test sets). See
    :func:`lips_flwr.experiments.task.data.partition.low_data_indices`.

    Parameters
    ----------
    num_partitions : int
        Number of clients, >= 1.
    samples : int (default: 100)
        Examples per partition.
    alpha : float (default: 0.1)
        Dirichlet concentration, > 0.
    seed : int (default: 42)
        Seed of the partitioning.
    split : str (default: "train")
        ``"train"`` or ``"test"``.
    partition_by : str (default: "label")
        The column holding the class labels.
    num_classes : int, optional
        Number of classes; defaults to the largest label + 1 (give it when a
        split may lack the last class, so train and test proportions agree).
    """

    def __init__(
        self,
        num_partitions: int,
        samples: int = 100,
        alpha: float = 0.1,
        seed: int = 42,
        split: str = "train",
        partition_by: str = "label",
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"`num_partitions` must be an integer >= 1, got {num_partitions!r}")
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"`samples` must be an integer >= 1, got {samples!r}")
        if not alpha > 0:
            raise ValueError(f"`alpha` must be > 0, got {alpha!r}")
        if split not in SPLIT_SALTS:
            raise ValueError(f"`split` must be one of {tuple(SPLIT_SALTS)}, got {split!r}")
        self._num_partitions = num_partitions
        self.samples, self.alpha, self.seed = samples, alpha, seed
        self.split, self.partition_by, self.num_classes = split, partition_by, num_classes
        self._labels: np.ndarray | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def load_partition(self, partition_id: int) -> Dataset:
        """The ``samples`` examples of ``partition_id`` (rows of the assigned dataset)."""
        if not 0 <= partition_id < self._num_partitions:
            raise ValueError(
                f"`partition_id` must be in [0, {self._num_partitions}), got {partition_id}"
            )
        if self._labels is None:
            self._labels = np.asarray(self.dataset[self.partition_by])
        indices = low_data_indices(
            self._labels, partition_id, self.samples, self.alpha, self.seed, self.split,
            self.num_classes,
        )
        return self.dataset.select(indices.tolist())


__all__ = ["LowDataDirichletPartitioner"]
