"""The LIPS algorithm in plain numpy, with no ``flwr`` import.

Small functions over ordered ``name -> ndarray`` mappings
(:mod:`.schedule`, :mod:`.scores`, :mod:`.layers`, :mod:`.masking`,
:mod:`.inertia`, :mod:`.trigger`, :mod:`.checks`, :mod:`.client_masking`) and one object,
:class:`~lips_flwr.core.lips.LIPSCore`, that holds the settings and answers a
whole round in one call (:class:`~lips_flwr.core.outcome.RoundOutcome`). The
names below are importable from here.
"""

from .client_masking import client_mask, local_update
from .layers import batch_norm_names, candidate_names, select_layers
from .lips import LIPSCore
from .masking import mask_layers, mask_lowest, num_zeros
from .outcome import RoundOutcome
from .schedule import DECAYS, MaskSchedule
from .scores import SCORES, compute_score

__all__ = [
    "DECAYS", "LIPSCore", "MaskSchedule", "RoundOutcome", "SCORES", "batch_norm_names",
    "candidate_names", "client_mask", "compute_score", "local_update", "mask_layers", "mask_lowest",
    "num_zeros", "select_layers",
]
