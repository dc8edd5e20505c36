"""Issue 28, defects 1 and 2: the non-finite guard covers the wrapped strategy's state, not only the aggregate.

One of 5 clients sends 1e21 on 10% of a middle layer. The aggregate stays
finite, but ``delta**2`` overflows an adaptive optimizer's second moment
(``v_t``) to Inf: before, nothing was logged, the attacked weights never moved
again and every mask round zeroed them (their ``dw`` is 0); with the same
client every round, FedYogi's aggregate turned NaN from round 2 on and every
round was thrown away with "no reply explains it". Now the chain's declared
state is checked with the aggregate: the reply is found, dropped with a
reason, and the round aggregated again from the state before it, bit for bit
the round without that reply. When no single reply explains a non-finite
state, the fewest replies (the largest values first, at most half) that do
are dropped.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import strategy as legacy
from flwr.serverapp import strategy as message

from flower_fakes import (
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
)
from lips_flwr.strategies import LIPS, LegacyLIPS

pytestmark = [
    pytest.mark.usefixtures("task_identity"),
    # The point of these tests: the attacked round makes Flower's optimizer overflow its v_t
    # (numpy's "overflow encountered" RuntimeWarning, raised in Flower's code) before LIPS drops
    # the reply and aggregates the round again; the tests check that outcome, not numpy's warning.
    # (Only Flower's: an overflow in LIPS's own code would still show.)
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning:flwr"),
]
ROUNDS, CLIENTS, LAYER = 6, 5, "conv2.weight"
NAMES = list(tiny_model())
OPTIMIZERS = {"FedAdam": (message.FedAdam, legacy.FedAdam), "FedYogi": (message.FedYogi, legacy.FedYogi),
              "FedAdagrad": (message.FedAdagrad, legacy.FedAdagrad)}
TARGETS = np.random.default_rng(0).random(tiny_model()[LAYER].shape) < 0.1


def make(api: str, inner, **lips):
    if api == "message":
        return LIPS(inner(), num_rounds=ROUNDS, tau0=0.5, every=2, **lips)
    initial = ndarrays_to_parameters(list(tiny_model().values()))
    return LegacyLIPS(inner(initial_parameters=initial), param_names=NAMES, num_rounds=ROUNDS, tau0=0.5,
                      every=2, **lips)


def run(api: str, strategy, spoil, leave_out=()) -> dict[str, np.ndarray]:
    """``ROUNDS`` rounds of 5 clients; ``spoil(round, models)`` changes what they send; the replies
    of ``(round, node)`` in ``leave_out`` are not sent at all. The final global model."""
    current = tiny_model()
    for rnd in range(1, ROUNDS + 1):
        trained = spoil(rnd, client_models(current, CLIENTS, seed=rnd))
        sent = [(m, i + 1) for i, m in enumerate(trained) if (rnd, i + 1) not in leave_out]
        if api == "message":
            list(strategy.configure_train(rnd, to_record(current), ConfigRecord(), grid(CLIENTS)))
            new, _ = strategy.aggregate_train(rnd, [reply(m, 10, node_id=n) for m, n in sent])
            current = to_numpy(new) if new is not None else current
        else:
            strategy.configure_fit(rnd, ndarrays_to_parameters(list(current.values())), client_manager(CLIENTS))
            new, _ = strategy.aggregate_fit(rnd, [fit_result(m, 10, cid=str(n)) for m, n in sent], [])
            current = params_to_model(new, NAMES) if new is not None else current
    return current


def attack(rounds):
    """Node 1 sends 1e21 on 10% of a middle layer in ``rounds``."""
    def spoil(rnd, trained):
        if rnd in rounds:
            layer = trained[0][LAYER]
            trained[0][LAYER] = np.where(TARGETS, np.asarray(1e21, layer.dtype), layer)
        return trained
    return spoil


def honest(rnd, trained):
    return trained


def state_of(strategy) -> list[np.ndarray]:
    inner = strategy.strategy
    v_t = inner.v_t
    return list(v_t.values()) if isinstance(v_t, dict) else list(v_t)


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_one_round_of_huge_values_is_dropped_before_it_poisons_an_adaptive_optimizer(api, optimizer, caplog):
    """Defect 1: before, v_t was Inf from round 1 and every attacked weight ended exactly 0, unlogged."""
    inner = OPTIMIZERS[optimizer][api == "legacy"]
    strategy = make(api, inner)
    with caplog.at_level(logging.WARNING):
        got = run(api, strategy, attack({1}))
    who = "node 1" if api == "message" else "client 1"
    assert f"LIPS: ignoring reply from {who}: its values (up to 1e+21) overflow when squared" in caplog.text
    assert all(np.isfinite(v).all() for v in state_of(strategy))
    assert np.count_nonzero(got[LAYER][TARGETS] == 0) == 0  # before: all of them
    want = run(api, make(api, inner), honest, leave_out={(1, 1)})  # the same run without that reply
    for name in NAMES:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_the_same_client_every_round_is_named_and_dropped_and_no_round_is_lost(api, caplog):
    """Defect 2: before, FedYogi's aggregate was NaN from round 2 on and every round was lost."""
    inner = OPTIMIZERS["FedYogi"][api == "legacy"]
    strategy = make(api, inner)
    with caplog.at_level(logging.WARNING):
        got = run(api, strategy, attack(range(1, ROUNDS + 1)))
    who = "node 1" if api == "message" else "client 1"
    assert caplog.text.count(f"LIPS: ignoring reply from {who}: its values (up to 1e+21) overflow") == ROUNDS
    assert "no reply explains it" not in caplog.text and "has no aggregate" not in caplog.text
    want = run(api, make(api, inner), honest, leave_out={(r, 1) for r in range(1, ROUNDS + 1)})
    for name in NAMES:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# ----------------------------------------------------------------- no single culprit
class MessageEnergy(message.FedAvg):
    """FedAvg that also keeps, as its declared state, the sum of the squares of all replies so far."""

    lips_state = ("energy",)

    def __init__(self) -> None:
        super().__init__()
        self.energy: dict[str, np.ndarray] = {}

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.energy = squares_added(self.energy, [to_numpy(m.content["arrays"]) for m in replies])
        return super().aggregate_train(server_round, replies)


class LegacyEnergy(legacy.FedAvg):
    lips_state = ("energy",)

    def __init__(self) -> None:
        super().__init__()
        self.energy: dict[str, np.ndarray] = {}

    def aggregate_fit(self, server_round, results, failures):
        models = [dict(zip(NAMES, parameters_to_ndarrays(res.parameters))) for _, res in results]
        self.energy = squares_added(self.energy, models)
        return super().aggregate_fit(server_round, results, failures)


def squares_added(energy: dict, models: list[dict]) -> dict:
    with np.errstate(over="ignore"):  # the overflow is the point
        return {name: energy.get(name, 0) + sum(np.square(m[name], dtype=np.float32) for m in models)
                for name in models[0]}


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize(("attackers", "dropped"), [(3, 2), (5, None)])
def test_the_fewest_replies_that_explain_a_non_finite_state_are_dropped(api, attackers, dropped, caplog):
    """Three of six replies at 1.35e19-1.37e19: any two of them overflow the state's float32 squares,
    none alone (nor its square) explains it. The two largest go; with five, half is not enough."""
    model = tiny_model()
    sent = client_models(model, 6, seed=1)
    for i in range(attackers):
        sent[i]["fc.bias"] = np.full_like(sent[i]["fc.bias"], 1.35e19 + i * 1e17)
    if api == "message":
        strategy = LIPS(MessageEnergy(), num_rounds=ROUNDS, tau0=0.0)
        list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid(6)))
        with caplog.at_level(logging.WARNING):
            new, _ = strategy.aggregate_train(1, [reply(m, 10, node_id=i + 1) for i, m in enumerate(sent)])
        new = None if new is None else to_numpy(new)
    else:
        strategy = LegacyLIPS(LegacyEnergy(), param_names=NAMES, num_rounds=ROUNDS, tau0=0.0)
        strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(6))
        with caplog.at_level(logging.WARNING):
            params, _ = strategy.aggregate_fit(1, [fit_result(m, 10, cid=str(i + 1))
                                                   for i, m in enumerate(sent)], [])
        new = None if params is None else params_to_model(params, NAMES)
    who = "node" if api == "message" else "client"
    energy = strategy.strategy.energy
    if dropped is None:
        assert new is None
        assert ("has NaN or Inf in ['LegacyEnergy.energy'" if api == "legacy" else
                "has NaN or Inf in ['MessageEnergy.energy'") in caplog.text
        assert "(nor does leaving out up to 3 of the 6 replies, the largest values first)" in caplog.text
        assert energy == {}  # the state as it was before the round
        return
    reason = "leaving out the 2 of 6 replies with the largest values makes it finite"
    for node in (2, 3):
        assert f"LIPS: ignoring reply from {who} {node}: " in caplog.text
    assert f"{who} 1:" not in caplog.text and caplog.text.count(reason) == 2
    assert all(np.isfinite(a).all() for a in energy.values())
    kept = [sent[0]] + sent[3:]
    for name in NAMES:
        if model[name].dtype.kind == "f":
            np.testing.assert_allclose(new[name], sum(m[name] for m in kept) / len(kept), rtol=1e-6)


def test_state_that_was_not_finite_before_the_round_is_not_blamed_on_its_replies(caplog):
    """An optimizer state already Inf (restored, say) drops no reply: a WARNING, and the round goes on."""
    strategy = LIPS(message.FedAdam(), num_rounds=ROUNDS, tau0=0.0)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    strategy.aggregate_train(1, [reply(m, 10, node_id=i + 1) for i, m in enumerate(client_models(model, 3, 1))])
    strategy.strategy.v_t[LAYER] = np.full_like(strategy.strategy.v_t[LAYER], np.inf)
    list(strategy.configure_train(2, to_record(model), ConfigRecord(), grid()))
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(2, [reply(m, 10, node_id=i + 1)
                                              for i, m in enumerate(client_models(model, 3, 2))])
    assert new is not None and "ignoring reply" not in caplog.text
    assert "LIPS: the state of FedAdam held NaN or Inf before this round (['FedAdam.v_t'])" in caplog.text


def test_a_retry_of_qfedavg_sees_its_model_as_it_was():
    """Message QFedAvg empties its ``current_arrays`` record in place: the retry without a NaN reply
    used to see it empty. Now the retry equals the round without that reply. (Floats only: Flower's
    QFedAvg cannot subtract in place into integer buffers.)"""
    model = {name: array for name, array in tiny_model().items() if array.dtype.kind == "f"}
    trained = client_models(model, 3, seed=4)
    spoiled = [dict(m) for m in trained]
    spoiled[0]["fc.bias"] = np.full_like(spoiled[0]["fc.bias"], np.nan)
    outputs = []
    for models, nodes in ((spoiled, (1, 2, 3)), (trained[1:], (2, 3))):
        strategy = LIPS(message.QFedAvg(client_learning_rate=0.1), num_rounds=ROUNDS, tau0=0.0)
        list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
        replies = [reply(m, 10, node_id=n) for m, n in zip(models, nodes)]
        for msg in replies:
            msg.content["metrics"]["train_loss"] = 0.5  # QFedAvg weighs by the training loss
        new, _ = strategy.aggregate_train(1, replies)
        outputs.append(to_numpy(new))
    assert list(outputs[0]) == list(model)
    for name in model:
        np.testing.assert_array_equal(outputs[0][name], outputs[1][name], err_msg=name)

