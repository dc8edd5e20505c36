"""LIPS around Flower's DP wrappers and robust strategies, in both APIs (mocked replies).

Each chain runs four rounds with ``every=2`` (mask rounds 1 and 3): no
exception, exact zeros on the mask rounds only, and the wrapped strategy's own
checks (clipping, DP reply rules, accounting, norm bits) still apply.
"""

from __future__ import annotations

import logging
import math
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message
from flwr.common import ndarrays_to_parameters
from flwr.server import strategy as legacy
from flwr.serverapp import strategy as message
from flwr.serverapp.exception import AggregationError
from flwr.supercore.privacy_accounting import (
    NeighboringRelation,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)

from flower_fakes import (
    MIDDLE,
    client_manager,
    client_models,
    grid,
    legacy_result,
    message_reply,
    params_to_model,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
)
from lips_flwr.strategies import LIPS, LegacyLIPS

pytestmark = pytest.mark.usefixtures("task_identity")
NUM_ROUNDS = 10
CLIENTS = 7  # Bulyan needs n >= 4f + 3
NAMES = list(tiny_model())
MASK_ROUNDS = (1, 3)


def run_message(strategy, rounds=4, bad=None, **metrics):
    """Drive configure/aggregate for ``rounds`` rounds; ``bad(round, models)`` may spoil a reply."""
    arrays, history = to_record(tiny_model()), []
    for rnd in range(1, rounds + 1):
        list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid(CLIENTS)))
        current = to_numpy(arrays)
        trained = client_models(current, CLIENTS, seed=rnd)
        if bad is not None:
            trained = bad(rnd, trained)
        replies = [message_reply(m, i + 1, **metrics) for i, m in enumerate(trained)]
        new, agg_metrics = strategy.aggregate_train(rnd, replies)
        history.append((current, None if new is None else to_numpy(new), agg_metrics))
        arrays = arrays if new is None else new
    return history


def run_legacy(strategy, rounds=4, bad=None, **metrics):
    params, history = ndarrays_to_parameters(list(tiny_model().values())), []
    for rnd in range(1, rounds + 1):
        strategy.configure_fit(rnd, params, client_manager(CLIENTS))
        current = params_to_model(params, NAMES)
        trained = client_models(current, CLIENTS, seed=rnd)
        if bad is not None:
            trained = bad(rnd, trained)
        results = [legacy_result(m, str(i + 1), **metrics) for i, m in enumerate(trained)]
        new, agg_metrics = strategy.aggregate_fit(rnd, results, [])
        history.append((current, None if new is None else params_to_model(new, NAMES), agg_metrics))
        params = params if new is None else new
    return history


def assert_masks_on_schedule(history):
    for rnd, (_, new, metrics) in enumerate(history, start=1):
        assert new is not None, rnd
        mask_round = rnd in MASK_ROUNDS
        assert metrics["lips-mask-round"] == int(mask_round), rnd
        tau = 0.5 * (1 - (rnd - 1) / NUM_ROUNDS)
        for name in MIDDLE:
            expected = math.ceil(new[name].size * tau) if mask_round else 0
            assert int((new[name] == 0).sum()) == expected, (rnd, name)
            assert metrics.get(f"lips-zeros/{name}", 0) == expected, (rnd, name)


def nan_in_first_reply(rounds):
    def spoil(rnd, trained):
        if rnd in rounds:
            trained[0] = {**trained[0], "fc.bias": np.full_like(trained[0]["fc.bias"], np.nan)}
        return trained
    return spoil


# --------------------------------------------------------------------------- Message API
MESSAGE_CHAINS = {
    "dp-server-fixed": lambda: message.DifferentialPrivacyServerSideFixedClipping(
        message.FedAvg(), 0.1, 1.0, CLIENTS),
    "dp-client-fixed": lambda: message.DifferentialPrivacyClientSideFixedClipping(
        message.FedAvg(), 0.1, 1.0, CLIENTS),
    "dp-server-adaptive": lambda: message.DifferentialPrivacyServerSideAdaptiveClipping(
        message.FedAvg(), 0.1, CLIENTS),
    "dp-client-adaptive": lambda: message.DifferentialPrivacyClientSideAdaptiveClipping(
        message.FedAvg(), 0.1, CLIENTS),
    "fedmedian": message.FedMedian,
    "fedtrimmedavg": lambda: message.FedTrimmedAvg(beta=0.2),
    "krum": lambda: message.Krum(num_malicious_nodes=1),
    "multikrum": lambda: message.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3),
    "bulyan": lambda: message.Bulyan(num_malicious_nodes=1),
    "dp-server-fixed-over-fedmedian": lambda: message.DifferentialPrivacyServerSideFixedClipping(
        message.FedMedian(), 0.1, 1.0, CLIENTS),
}


@pytest.mark.parametrize("chain", list(MESSAGE_CHAINS))
def test_message_chains_mask_on_schedule(chain):
    metrics = {"norm_bit": 1} if chain == "dp-client-adaptive" else {}
    rounds = 2 if chain == "bulyan" else 4  # Flower's Bulyan runs gc.collect() per reply: slow
    history = run_message(LIPS(MESSAGE_CHAINS[chain](), num_rounds=NUM_ROUNDS, every=2),
                          rounds=rounds, **metrics)
    assert_masks_on_schedule(history)


@pytest.mark.parametrize("chain", ["fedmedian", "krum", "dp-server-fixed"])
def test_message_chains_with_a_nan_reply_still_mask(chain, caplog):
    strategy = LIPS(MESSAGE_CHAINS[chain](), num_rounds=NUM_ROUNDS, every=2)
    with caplog.at_level(logging.WARNING):
        history = run_message(strategy, bad=nan_in_first_reply((1, 2)))
    # LIPS checks the aggregate, not each reply: a NaN reply that reaches it is found and
    # dropped; Krum picks one reply's model and never picks the NaN one.
    dropped = caplog.text.count("ignoring reply from node 1")
    assert dropped == (0 if chain == "krum" else 2)
    assert all(np.isfinite(a).all() for _, new, _ in history for a in new.values())
    assert_masks_on_schedule(history)


def test_message_dp_server_side_clipping_still_bounds_the_update():
    clip = 0.05
    strategy = LIPS(message.DifferentialPrivacyServerSideFixedClipping(
        message.FedAvg(), 0.0, clip, CLIENTS), num_rounds=NUM_ROUNDS, every=2)
    for rnd, (current, new, _) in enumerate(run_message(strategy), start=1):
        if rnd not in MASK_ROUNDS:  # a mask only zeroes entries: check the DP output itself
            norm = math.sqrt(sum(float(np.sum((new[n].astype(np.float64) - current[n]) ** 2))
                                 for n in NAMES))
            assert norm <= clip * (1 + 1e-5), rnd


def test_message_dp_client_adaptive_still_requires_norm_bits():
    strategy = LIPS(MESSAGE_CHAINS["dp-client-adaptive"](), num_rounds=NUM_ROUNDS, every=2)
    with pytest.raises(AggregationError, match="norm_bit"):
        run_message(strategy, rounds=1)


def test_message_dp_adaptive_clipping_norm_still_adapts():
    dp = message.DifferentialPrivacyServerSideAdaptiveClipping(message.FedAvg(), 0.1, CLIENTS)
    before = dp.clipping_norm
    run_message(LIPS(dp, num_rounds=NUM_ROUNDS, every=2), rounds=2)
    assert dp.clipping_norm != before


def test_message_dp_reply_with_error_still_skips_the_round(caplog):
    """Flower's DP wrappers skip a round with any failed reply; LIPS adds no model of its own."""
    strategy = LIPS(MESSAGE_CHAINS["dp-server-fixed"](), num_rounds=NUM_ROUNDS, every=2)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid(CLIENTS)))
    failed = Mock(spec=Message)
    failed.has_error.return_value = True
    failed.metadata.src_node_id = 9
    replies = [message_reply(m, i + 1) for i, m in enumerate(client_models(model, CLIENTS - 1, 1))]
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(1, replies + [failed])
    assert new is None and "round 1 has no aggregate" in caplog.text


class FakeAccountant:
    """What Flower's DP wrappers ask of a PrivacyAccountant; counts the releases."""

    def __init__(self) -> None:
        self.config = PrivacyConfig(target_delta=1e-5, population_size=CLIENTS,
                                    neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                    sampling_method=SamplingMethod.NO_AMPLIFICATION)
        self.releases = 0

    def would_exceed(self, event, max_epsilon=None, count=1) -> bool:
        return False

    def compose(self, event, count: int = 1) -> None:
        self.releases += count

    def get_privacy_spent(self, delta=None) -> PrivacySpent:
        return PrivacySpent(epsilon=float(self.releases), delta=1e-5,
                            num_releases=self.releases, accounting_method="fake")


def test_message_dp_accounting_still_refuses_a_round_short_of_replies(caplog):
    """A reply LIPS rejects leaves the accountant's round short: no release, no model."""
    accountant = FakeAccountant()
    dp = message.DifferentialPrivacyServerSideFixedClipping(
        message.FedAvg(), 1.0, 1.0, CLIENTS, accountant=accountant)
    strategy = LIPS(dp, num_rounds=NUM_ROUNDS, every=2)
    with caplog.at_level(logging.WARNING):
        history = run_message(strategy, rounds=2, bad=nan_in_first_reply((2,)))
    assert history[0][1] is not None and history[0][2]["lips-mask-round"] == 1
    assert history[1][1] is None and "round 2 has no aggregate" not in caplog.text  # not a mask round
    assert accountant.releases == 1
    assert strategy.privacy_spent().num_releases == 1  # the wrapper's own API through LIPS


def test_message_dp_accounting_still_requires_equal_weights():
    dp = message.DifferentialPrivacyServerSideFixedClipping(
        message.FedAvg(), 1.0, 1.0, CLIENTS, accountant=FakeAccountant())
    strategy = LIPS(dp, num_rounds=NUM_ROUNDS, every=2)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid(CLIENTS)))
    replies = [message_reply(m, i + 1, num_examples=10 + i)
               for i, m in enumerate(client_models(model, CLIENTS, 1))]
    with pytest.raises(ValueError, match="equal client weights"):
        strategy.aggregate_train(1, replies)


# --------------------------------------------------------------------------- legacy API
LEGACY_CHAINS = {
    "dp-server-fixed": lambda: legacy.DifferentialPrivacyServerSideFixedClipping(
        legacy.FedAvg(), 0.1, 1.0, CLIENTS),
    "dp-client-fixed": lambda: legacy.DifferentialPrivacyClientSideFixedClipping(
        legacy.FedAvg(), 0.1, 1.0, CLIENTS),
    "dp-server-adaptive": lambda: legacy.DifferentialPrivacyServerSideAdaptiveClipping(
        legacy.FedAvg(), 0.1, CLIENTS),
    "dp-client-adaptive": lambda: legacy.DifferentialPrivacyClientSideAdaptiveClipping(
        legacy.FedAvg(), 0.1, CLIENTS),
    "fedmedian": legacy.FedMedian,
    "fedtrimmedavg": lambda: legacy.FedTrimmedAvg(beta=0.2),
    "krum": lambda: legacy.Krum(num_malicious_clients=1),
    "bulyan": lambda: legacy.Bulyan(num_malicious_clients=1, to_keep=0),
}


@pytest.mark.parametrize("chain", list(LEGACY_CHAINS))
def test_legacy_chains_mask_on_schedule(chain):
    metrics = {"norm_bit": 1} if chain == "dp-client-adaptive" else {}
    strategy = LegacyLIPS(LEGACY_CHAINS[chain](), param_names=NAMES, num_rounds=NUM_ROUNDS, every=2)
    assert_masks_on_schedule(run_legacy(strategy, **metrics))


@pytest.mark.parametrize("chain", ["fedmedian", "krum"])
def test_legacy_robust_chains_with_a_nan_reply_still_mask(chain, caplog):
    strategy = LegacyLIPS(LEGACY_CHAINS[chain](), param_names=NAMES, num_rounds=NUM_ROUNDS, every=2)
    with caplog.at_level(logging.WARNING):
        history = run_legacy(strategy, bad=nan_in_first_reply((1, 2)))
    assert caplog.text.count("ignoring reply from client 1") == 2
    assert_masks_on_schedule(history)


def test_legacy_dp_skips_a_round_with_a_rejected_reply(caplog):
    """LIPS moves a bad reply to failures; the legacy DP wrappers skip any round with failures."""
    strategy = LegacyLIPS(LEGACY_CHAINS["dp-server-fixed"](), param_names=NAMES,
                          num_rounds=NUM_ROUNDS, every=2)
    with caplog.at_level(logging.WARNING):
        history = run_legacy(strategy, rounds=3, bad=nan_in_first_reply((1,)))
    assert history[0][1] is None and "round 1 has no aggregate" in caplog.text
    # the next rounds start from the unchanged model and mask as scheduled
    assert history[1][2]["lips-mask-round"] == 0 and history[2][2]["lips-mask-round"] == 1


def test_legacy_dp_server_side_clipping_still_bounds_the_update():
    clip = 0.05
    strategy = LegacyLIPS(legacy.DifferentialPrivacyServerSideFixedClipping(
        legacy.FedAvg(), 0.0, clip, CLIENTS), param_names=NAMES, num_rounds=NUM_ROUNDS, every=2)
    for rnd, (current, new, _) in enumerate(run_legacy(strategy), start=1):
        if rnd not in MASK_ROUNDS:
            norm = math.sqrt(sum(float(np.sum((new[n].astype(np.float64) - current[n]) ** 2))
                                 for n in NAMES if new[n].dtype.kind == "f"))
            assert norm <= clip * (1 + 1e-5), rnd


def test_legacy_dp_client_adaptive_still_requires_norm_bits():
    strategy = LegacyLIPS(LEGACY_CHAINS["dp-client-adaptive"](), param_names=NAMES,
                          num_rounds=NUM_ROUNDS, every=2)
    with pytest.raises(KeyError, match="norm_bit"):
        run_legacy(strategy, rounds=1)
