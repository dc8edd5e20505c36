"""What a checkpoint holds of Flower's own strategies, both APIs (read from flwr 1.35 to 1.42).

A strategy's state is what it rebinds or edits after its constructor and reads
in a later round. Each row gives the state a checkpoint keeps, and the
attributes a strategy rewrites from the round's global model in every
configure call before it reads them (kept out, and not reported as left out:
the checkpoint's model stands for them). A subclass inherits its bases' rows;
a strategy with no row (FedAvg, FedProx, FedMedian, FedTrimmedAvg, Krum,
MultiKrum, Bulyan, the fixed-clipping DP wrappers without an accountant, ...)
keeps nothing between rounds.

=======  ======================================  ==============================  ======================
API      strategy                                state                           rewritten every round
=======  ======================================  ==============================  ======================
Message  FedAvgM                                 current_arrays, momentum_vector
Message  FedOpt (FedAdam, FedYogi, FedAdagrad)   m_t, v_t                        current_arrays
Message  QFedAvg                                                                 current_arrays
Message  DP adaptive clipping (server, client)   clipping_norm                   current_arrays (server)
Message  DP fixed clipping (server, client)      accountant (its state_dict())   current_arrays (server)
legacy   FedAvg and its subclasses               initial_parameters [1]
legacy   FedAvgM                                 momentum_vector
legacy   FedOpt (FedAdam, FedYogi, FedAdagrad)   current_weights, m_t, v_t
legacy   QFedAvg                                                                 pre_weights
legacy   DP adaptive clipping (server, client)   clipping_norm                   current_round_params (server)
legacy   DP fixed clipping (server)                                              current_round_params
legacy   DPFedAvgAdaptive                        clip_norm
legacy   FedAvgAndroid                                                           initial_parameters [2]
=======  ======================================  ==============================  ======================

[1] The initial model until ``initialize_parameters`` hands it out (then
``None``); FedAvgM with server momentum keeps its current model there.
[2] ``None`` once handed out, never read again.

The XGBoost strategies hold their model as bytes, which a checkpoint does not
save: they are not covered.
"""

from __future__ import annotations

from flwr.server import strategy as legacy
from flwr.serverapp import strategy as message
from flwr.serverapp.strategy.dp_adaptive_clipping import DifferentialPrivacyAdaptiveBase
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase
from flwr.serverapp.strategy.fedopt import FedOpt

# class -> (state, rewritten every round)
FLOWER_STATE: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    message.FedAvgM: (("current_arrays", "momentum_vector"), ()),
    FedOpt: (("m_t", "v_t"), ("current_arrays",)),
    message.QFedAvg: ((), ("current_arrays",)),
    DifferentialPrivacyAdaptiveBase: (("clipping_norm",), ()),
    message.DifferentialPrivacyServerSideAdaptiveClipping: ((), ("current_arrays",)),
    DifferentialPrivacyFixedClippingBase: (("accountant",), ()),
    message.DifferentialPrivacyServerSideFixedClipping: ((), ("current_arrays",)),
    legacy.FedAvg: (("initial_parameters",), ()),
    legacy.FedAvgM: (("momentum_vector",), ()),
    legacy.FedOpt: (("current_weights", "m_t", "v_t"), ()),
    legacy.QFedAvg: ((), ("pre_weights",)),
    legacy.DifferentialPrivacyServerSideAdaptiveClipping: (("clipping_norm",), ("current_round_params",)),
    legacy.DifferentialPrivacyClientSideAdaptiveClipping: (("clipping_norm",), ()),
    legacy.DifferentialPrivacyServerSideFixedClipping: ((), ("current_round_params",)),
    legacy.DPFedAvgAdaptive: (("clip_norm",), ()),
    legacy.FedAvgAndroid: ((), ("initial_parameters",)),
}

__all__ = ["FLOWER_STATE"]
