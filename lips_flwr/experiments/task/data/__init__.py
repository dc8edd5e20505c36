"""Federated datasets: the paper's low-data Dirichlet split and its loaders.

``LowDataDirichletPartitioner`` (flwr-datasets) lives in
:mod:`lips_flwr.experiments.task.data.partitioner` so that importing this package does not
need flwr-datasets.
"""

from .datasets import DATASET_INFO, DATASETS, ImageDataset, client_split, load_dataset, read_idx
from .digits import load_digits_client
from .partition import class_proportions, low_data_indices

__all__ = [
    "DATASETS",
    "DATASET_INFO",
    "ImageDataset",
    "class_proportions",
    "client_split",
    "load_dataset",
    "load_digits_client",
    "low_data_indices",
    "read_idx",
]
