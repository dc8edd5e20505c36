"""LIPS around legacy strategies (``aggregate_fit``), and agreement with the Message API."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import (
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
)
from flwr.serverapp.strategy import FedAvg as MessageFedAvg

from flower_fakes import (
    MIDDLE,
    client_manager,
    client_models,
    fit_result,
    grid,
    params_to_model,
    reply,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
    zeros_placed,
)
from lips_flwr.strategies import LIPS, LegacyLIPS, LegacyLIPSFedAvg

NUM_ROUNDS = 7
EXAMPLES = [10, 30, 60]
NAMES = list(tiny_model())


def run_rounds(strategy, num_rounds=NUM_ROUNDS, seed=0):
    """Drive configure_fit/aggregate_fit like the legacy server; return per-round models."""
    params = ndarrays_to_parameters(list(tiny_model(seed).values()))
    history = []
    for rnd in range(1, num_rounds + 1):
        instructions = strategy.configure_fit(rnd, params, client_manager(3))
        current = params_to_model(params, NAMES)
        trained = client_models(current, len(EXAMPLES), seed=100 * seed + rnd)
        results = [fit_result(m, n, cid=str(i)) for i, (m, n) in enumerate(zip(trained, EXAMPLES))]
        new, metrics = strategy.aggregate_fit(rnd, results, [])
        history.append((current, params_to_model(new, NAMES), metrics, instructions))
        params = new
    return history


def initial():
    return ndarrays_to_parameters(list(tiny_model().values()))


def test_masks_on_schedule_middle_layers_only():
    history = run_rounds(LegacyLIPS(FedAvg(), param_names=NAMES, num_rounds=NUM_ROUNDS))
    reference = run_rounds(FedAvg())
    for rnd, ((_, after, metrics, _), (_, dense, _, _)) in enumerate(zip(history, reference), 1):
        mask_round = rnd in (1, 6)
        assert metrics["lips-mask-round"] == int(mask_round)
        tau = 0.5 * (1 - (rnd - 1) / NUM_ROUNDS) if mask_round else 0.0
        for name in NAMES:
            if mask_round and name in MIDDLE:
                # From round 2 on, the dense run has drifted: compare the counts only.
                if rnd == 1:
                    assert zeros_placed(dense[name], after[name]) == math.ceil(dense[name].size * tau)
                assert metrics[f"lips-zeros/{name}"] == math.ceil(after[name].size * tau)
            elif rnd == 1:
                np.testing.assert_array_equal(after[name], dense[name])


def test_config_carries_lips_keys():
    history = run_rounds(LegacyLIPS(FedAvg(), num_rounds=NUM_ROUNDS, mode="client"), num_rounds=2)
    config = history[0][3][0][1].config
    assert config["lips-round"] == 1 and config["lips-mode"] == "client"
    assert config["lips-tau"] == pytest.approx(0.5)
    assert history[1][3][0][1].config["lips-tau"] == 0.0


@pytest.mark.parametrize(
    "make_inner",
    [
        FedAvg,
        lambda: FedProx(proximal_mu=0.1),
        lambda: FedAdam(initial_parameters=initial()),
        lambda: FedAvgM(initial_parameters=initial(), server_momentum=0.9),
        lambda: DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 100.0, 3),
    ],
    ids=["fedavg", "fedprox", "fedadam", "fedavgm", "dp-fixed-clipping"],
)
def test_tau0_zero_reproduces_inner_strategy_bit_for_bit(make_inner):
    plain = run_rounds(make_inner())
    wrapped = run_rounds(LegacyLIPS(make_inner(), param_names=NAMES, num_rounds=NUM_ROUNDS, tau0=0.0))
    for (_, a, _, _), (_, b, _, _) in zip(plain, wrapped):
        for name in NAMES:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize(
    ("make_inner", "attribute"),
    [
        (lambda: FedAdam(initial_parameters=initial()), "current_weights"),
        (lambda: FedAvgM(initial_parameters=initial(), server_momentum=0.9), "initial_parameters"),
    ],
    ids=["fedadam", "fedavgm"],
)
def test_caches_of_inner_strategies_hold_the_masked_model(make_inner, attribute):
    inner = make_inner()
    masked = run_rounds(LegacyLIPS(inner, param_names=NAMES, num_rounds=NUM_ROUNDS), num_rounds=1)[0][1]
    cache = getattr(inner, attribute)
    cache = list(cache) if isinstance(cache, list) else list(params_to_model(cache, NAMES).values())
    for name, value in zip(NAMES, cache):
        np.testing.assert_array_equal(value, masked[name])


class KeepsItsAggregate(FedAvg):
    """Flower's FedAvg that remembers the Parameters it returned."""

    def aggregate_fit(self, server_round, results, failures):
        self.returned, metrics = super().aggregate_fit(server_round, results, failures)
        return self.returned, metrics


def test_a_mask_round_serializes_only_the_masked_layers():
    """Issue 36: the broadcast Parameters hold the wrapped strategy's own bytes for every layer
    the mask leaves alone (before, every layer was serialized again)."""
    inner = KeepsItsAggregate()
    strategy = LegacyLIPS(inner, param_names=NAMES, num_rounds=NUM_ROUNDS)
    params = ndarrays_to_parameters(list(tiny_model().values()))
    strategy.configure_fit(1, params, client_manager(3))
    trained = client_models(tiny_model(), len(EXAMPLES), seed=1)
    new, metrics = strategy.aggregate_fit(
        1, [fit_result(m, n, cid=str(i)) for i, (m, n) in enumerate(zip(trained, EXAMPLES))], [])
    masked = {name for name in NAMES if metrics.get(f"lips-zeros/{name}")}
    assert masked and masked < set(NAMES)
    for name, ours, theirs in zip(NAMES, new.tensors, inner.returned.tensors):
        assert (ours is theirs) == (name not in masked), name
    assert new.tensor_type == inner.returned.tensor_type


@pytest.mark.parametrize(
    ("make_inner", "server_lr"),
    [
        (FedAvg, 1.0),
        (lambda: FedAvgM(initial_parameters=initial(), server_learning_rate=0.5), 0.5),
        (lambda: DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 100.0, 3), 1.0),
    ],
    ids=["fedavg", "fedavgm-server-lr", "dp-fixed-clipping"],
)
def test_next_round_builds_on_the_masked_model(make_inner, server_lr):
    history = run_rounds(LegacyLIPS(make_inner(), param_names=NAMES, num_rounds=NUM_ROUNDS), num_rounds=2)
    masked, round2 = history[0][1], history[1][1]
    trained = client_models(masked, len(EXAMPLES), seed=2)
    total = sum(EXAMPLES)
    for name in NAMES:
        mean = sum(m[name] * (n / total) for m, n in zip(trained, EXAMPLES))
        expected = masked[name] + server_lr * (mean - masked[name])
        np.testing.assert_allclose(round2[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_fedavg_subclass_equals_wrapper():
    a = run_rounds(LegacyLIPS(FedAvg(), param_names=NAMES, num_rounds=NUM_ROUNDS, every=2))
    b = run_rounds(LegacyLIPSFedAvg(param_names=NAMES, num_rounds=NUM_ROUNDS, every=2))
    for (_, x, _, _), (_, y, _, _) in zip(a, b):
        for name in NAMES:
            np.testing.assert_array_equal(x[name], y[name])


def test_both_apis_place_identical_masks(task_identity):  # noqa: F811
    legacy = LegacyLIPS(FedAvg(), param_names=NAMES, num_rounds=NUM_ROUNDS, tau0=0.6)
    message = LIPS(MessageFedAvg(), num_rounds=NUM_ROUNDS, tau0=0.6)
    legacy_history = run_rounds(legacy, num_rounds=1)
    model = tiny_model()
    list(message.configure_train(1, to_record(model), ConfigRecord(), grid()))
    trained = client_models(model, len(EXAMPLES), seed=1)
    new, _ = message.aggregate_train(1, [reply(m, n) for m, n in zip(trained, EXAMPLES)])
    from_message, from_legacy = to_numpy(new), legacy_history[0][1]
    for name in NAMES:
        np.testing.assert_allclose(from_message[name], from_legacy[name], rtol=1e-6, atol=1e-7)
        if name in MIDDLE:
            np.testing.assert_array_equal(from_message[name] == 0, from_legacy[name] == 0)


def test_bad_replies_become_failures_with_a_reason(caplog):
    strategy = LegacyLIPS(FedAvg(accept_failures=True), param_names=NAMES, num_rounds=3)
    params = initial()
    strategy.configure_fit(2, params, client_manager(3))
    model = params_to_model(params, NAMES)
    good = client_models(model, 2, seed=5)
    short = fit_result({k: v for k, v in good[0].items() if k != "fc.bias"}, 10, cid="short")
    reshaped = dict(good[0])
    reshaped["conv3.weight"] = reshaped["conv3.weight"][:1]
    failures = []
    with caplog.at_level(logging.WARNING):
        new, metrics = strategy.aggregate_fit(
            2, [fit_result(good[0], 10), fit_result(good[1], 30), short,
                fit_result(reshaped, 10, cid="reshaped")], failures)
    assert new is not None and metrics["lips-mask-round"] == 0
    assert "client short" in caplog.text and "arrays, expected" in caplog.text
    assert "client reshaped" in caplog.text and "'conv3.weight' has shape" in caplog.text
    assert failures == []  # the caller's list is not modified


def test_param_names_that_do_not_fit_the_model_are_a_clear_error():
    strategy = LegacyLIPS(FedAvg(), param_names=NAMES[:-1], num_rounds=3)
    match = f"`param_names` has {len(NAMES) - 1} names but the model has {len(NAMES)} arrays"
    with pytest.raises(ValueError, match=match):
        strategy.configure_fit(1, initial(), client_manager(3))


def test_num_rounds_is_required():
    with pytest.raises(ValueError, match="`num_rounds` is required"):
        LegacyLIPS(FedAvg())
    with pytest.raises(ValueError, match="`num_rounds` is required"):
        LegacyLIPSFedAvg()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tau0": 1.5}, r"`tau0` must be in \[0, 1\)"),
        ({"every": 0}, r"`every` must be an integer >= 1"),
        ({"num_rounds": -3}, r"`num_rounds` must be an integer >= 1"),
        ({"score": "grad"}, r"`score` must be one of"),
        ({"layers": 3}, r"`layers` must be one of"),
        ({"param_names": ["a", "a"]}, r"`param_names` must be a list of distinct strings"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs, match):
    kwargs = {"num_rounds": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        LegacyLIPS(FedAvg(), **kwargs)


def test_message_strategy_is_refused():
    with pytest.raises(ValueError, match="use LIPS"):
        LegacyLIPS(MessageFedAvg(), num_rounds=3)


def test_dp_noise_wrapper_over_fedadam_keeps_the_zeros_in_fedadam_cache():
    inner = FedAdam(initial_parameters=initial())
    strategy = LegacyLIPS(DifferentialPrivacyServerSideFixedClipping(inner, 0.5, 100.0, 3),
                          param_names=NAMES, num_rounds=NUM_ROUNDS)
    masked = run_rounds(strategy, num_rounds=1)[0][1]
    cache = dict(zip(NAMES, inner.current_weights))
    for name in MIDDLE:
        zeros = masked[name] == 0
        assert zeros.sum() > 0 and np.all(cache[name][zeros] == 0), name


def test_the_wrapped_strategys_attributes_are_reached_through_strategy():
    strategy = LegacyLIPS(FedAvg(min_fit_clients=7), num_rounds=3)
    assert strategy.strategy.min_fit_clients == 7
    with pytest.raises(AttributeError, match=r"the wrapped FedAvg has it: \.strategy\.min_fit_clients"):
        strategy.min_fit_clients  # noqa: B018  (delegation is explicit: no attribute falls through)


def test_bad_param_names_and_parameters_are_clear_errors():
    with pytest.raises(ValueError, match="not one string"):
        LegacyLIPS(FedAvg(), param_names="conv1.weight", num_rounds=3)
    odd = ndarrays_to_parameters(list(tiny_model().values()))
    odd.tensor_type = "torch.Tensor"
    with pytest.raises(ValueError, match="tensor_type"):
        LegacyLIPS(FedAvg(), num_rounds=3).configure_fit(1, odd, client_manager(3))


def test_inertia_metrics_match_the_message_api():
    history = run_rounds(LegacyLIPS(FedAvg(), param_names=NAMES, num_rounds=NUM_ROUNDS, inertia_t0=1),
                         num_rounds=3)
    m3 = history[2][2]
    # Inertia is observed on the unmasked aggregate: round 1's is the dense run's
    # (same start, same updates); round 3 is no mask round, so its broadcast is its aggregate.
    after1, after3 = run_rounds(FedAvg(), num_rounds=1)[0][1], history[2][1]
    a, b = after3["conv2.weight"].ravel(), after1["conv2.weight"].ravel()
    expected = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert m3["inertia-cos-t0/conv2.weight"] == pytest.approx(expected, rel=1e-5)
