"""Flower's own strategies, both APIs (read from flwr 1.35 to 1.42): their state, and their model copy.

A strategy's state is what it rebinds or edits after its constructor and reads
in a later round. Each row gives the state a checkpoint keeps; the
attributes a strategy rewrites from the round's global model in every
configure call before it reads them (kept out, and not reported as left out:
the checkpoint's model stands for them); and the attributes that cache the
model the strategy builds its next round on, which the mask's zeros must
reach (:mod:`.adapters.cache_sync`). A subclass inherits its bases' rows; a
strategy with no row (FedAvg, FedProx, FedMedian, FedTrimmedAvg, Krum,
MultiKrum, Bulyan, the fixed-clipping DP wrappers without an accountant, ...)
keeps nothing between rounds.

=======  ================  ===============================  ========================  ======================
API      strategy          state                            rewritten every round     caches the model
=======  ================  ===============================  ========================  ======================
Message  FedAvgM           current_arrays, momentum_vector                            current_arrays
Message  FedOpt [4]        m_t, v_t                         current_arrays
Message  QFedAvg                                            current_arrays
Message  DP adaptive [5]   clipping_norm                    current_arrays [3]
Message  DP fixed [5]      accountant (state_dict())        current_arrays [3]
legacy   FedAvg [6]        initial_parameters [1]
legacy   FedAvgM           momentum_vector                                            initial_parameters [1]
legacy   FedOpt [4]        current_weights, m_t, v_t                                  current_weights
legacy   QFedAvg                                            pre_weights
legacy   DP adaptive [5]   clipping_norm                    current_round_params [3]
legacy   DP fixed [5]                                       current_round_params [3]
legacy   DPFedAvgAdaptive  clip_norm
legacy   FedAvgAndroid                                      initial_parameters [2]
=======  ================  ===============================  ========================  ======================

[1] The initial model until ``initialize_parameters`` hands it out (then
``None``); FedAvgM with server momentum keeps its current model there.
[2] ``None`` once handed out, never read again.
[3] The server-side wrapper's.
[4] FedAdam, FedYogi, FedAdagrad.
[5] The DP wrappers with adaptive or fixed clipping, server and client side
(legacy fixed clipping: the server side's row).
[6] And its subclasses.

A model rewritten every round needs no zeros: the next configure call
rewrites it from the broadcast (masked) model.

The XGBoost strategies hold their model as bytes, which a checkpoint does not
save: they are not covered.
"""

from __future__ import annotations

from typing import NamedTuple

from flwr.server import strategy as legacy
from flwr.serverapp import strategy as message
from flwr.serverapp.strategy.dp_adaptive_clipping import DifferentialPrivacyAdaptiveBase
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.serverapp.strategy.fedopt import FedOpt


class FlowerRow(NamedTuple):
    """One row of :data:`FLOWER_STATE` (attribute names)."""

    state: tuple[str, ...] = ()  # what a checkpoint keeps
    rewritten: tuple[str, ...] = ()  # rewritten from the global model every round: kept out
    caches: tuple[str, ...] = ()  # the model the next round builds on: gets the mask's zeros


FLOWER_STATE: dict[type, FlowerRow] = {
    message.FedAvgM: FlowerRow(("current_arrays", "momentum_vector"), caches=("current_arrays",)),
    FedOpt: FlowerRow(("m_t", "v_t"), ("current_arrays",)),
    message.QFedAvg: FlowerRow((), ("current_arrays",)),
    DifferentialPrivacyAdaptiveBase: FlowerRow(("clipping_norm",)),
    message.DifferentialPrivacyServerSideAdaptiveClipping: FlowerRow((), ("current_arrays",)),
    DifferentialPrivacyFixedClippingBase: FlowerRow(("accountant",)),
    message.DifferentialPrivacyServerSideFixedClipping: FlowerRow((), ("current_arrays",)),
    legacy.FedAvg: FlowerRow(("initial_parameters",)),
    legacy.FedAvgM: FlowerRow(("momentum_vector",), caches=("initial_parameters",)),
    legacy.FedOpt: FlowerRow(("current_weights", "m_t", "v_t"), caches=("current_weights",)),
    legacy.QFedAvg: FlowerRow((), ("pre_weights",)),
    legacy.DifferentialPrivacyServerSideAdaptiveClipping: FlowerRow(("clipping_norm",),
                                                                    ("current_round_params",)),
    legacy.DifferentialPrivacyClientSideAdaptiveClipping: FlowerRow(("clipping_norm",)),
    legacy.DifferentialPrivacyServerSideFixedClipping: FlowerRow((), ("current_round_params",)),
    legacy.DPFedAvgAdaptive: FlowerRow(("clip_norm",)),
    legacy.FedAvgAndroid: FlowerRow((), ("initial_parameters",)),
}

__all__ = ["FLOWER_STATE", "FlowerRow"]
