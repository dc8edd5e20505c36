"""lips-flwr: LIPS transient sparsity (arXiv 2506.00932) for Flower.

- :mod:`lips_flwr.strategies`: the server side, ``LIPS``/``LIPSFedAvg``
  (Message API) and ``LegacyLIPS``/``LegacyLIPSFedAvg`` (legacy API);
- :mod:`lips_flwr.clients`: the client side, ``lips_mod``, ``fedbn_mod``,
  ``persistent_state_mod`` and ``LIPSNumPyClient``;
- :mod:`lips_flwr.core`: the algorithm in plain numpy, no ``flwr`` import
  (its main names re-exported here);
- :mod:`lips_flwr.protocol`: the ``lips-*`` keys both sides agree on;
- :mod:`lips_flwr.persistence`: checkpoints and client state on disk;
- :mod:`lips_flwr.experiments`: data, models and training loops that the
  examples and benchmarks share.

The base install (``pip install lips-flwr``) is ``flwr`` and ``numpy``: all
of the above but :mod:`lips_flwr.experiments` imports without torch or Ray.
The experiments (and the ``lips-flwr`` command) need the ``[examples]``
extra, ``pip install "lips-flwr[examples]"``, and say so in one line
without it.
"""

from .core import (
    LIPSCore,
    MaskSchedule,
    RoundOutcome,
    batch_norm_names,
    candidate_names,
    mask_layers,
    mask_lowest,
    num_zeros,
    select_layers,
)

__version__ = "0.1.0"

__all__ = [
    "LIPSCore",
    "MaskSchedule",
    "RoundOutcome",
    "batch_norm_names",
    "candidate_names",
    "mask_layers",
    "mask_lowest",
    "num_zeros",
    "select_layers",
]
