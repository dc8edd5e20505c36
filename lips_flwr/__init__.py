"""lips-flwr: LIPS transient sparsity (arXiv 2506.00932) for Flower.

The algorithm lives in plain numpy modules with no ``flwr`` import
(:mod:`~lips_flwr.schedule`, :mod:`~lips_flwr.scores`, :mod:`~lips_flwr.layers`,
:mod:`~lips_flwr.masking`, :mod:`~lips_flwr.inertia`,
:mod:`~lips_flwr.sparsifier`, :mod:`~lips_flwr.local`,
:mod:`~lips_flwr.validation`); the Flower adapters are in
:mod:`lips_flwr.strategies` and :mod:`lips_flwr.clients`.
"""

from .layers import batch_norm_names, candidate_names, select_layers
from .masking import mask_lowest, num_zeros, sparsify
from .schedule import MaskSchedule
from .sparsifier import TransientSparsifier

__version__ = "0.1.0"

__all__ = [
    "MaskSchedule",
    "TransientSparsifier",
    "batch_norm_names",
    "candidate_names",
    "mask_lowest",
    "num_zeros",
    "select_layers",
    "sparsify",
]
