"""No single client can end a run, and no reply corrupts the aggregate silently.

Each malformed reply below ended a plain ``LIPS(FedAvg()).start(...)`` run, or
corrupted its aggregate, before the robustness issue. Runs use Flower's real
``Strategy.start`` loop on a fake grid whose clients answer deterministically
(no Ray); legacy checks use Flower's own strategies on real ``FitRes``.
"""

from __future__ import annotations

import logging
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, EvaluateRes, Status, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg, FedAvgM, FedMedian

from flower_fakes import (
    client_manager,
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

pytestmark = pytest.mark.usefixtures("task_identity")
ROUNDS, EVERY, BAD_NODE, BAD_ROUND = 4, 2, 2, 2
NAMES = list(tiny_model())


def update(model: dict, node: int, server_round: int) -> dict:
    rng = np.random.default_rng(100 * node + server_round)
    return {k: v + rng.normal(scale=0.05, size=v.shape).astype(v.dtype)
            if np.issubdtype(v.dtype, np.floating) else v.copy() for k, v in model.items()}


def message(content: RecordDict, node: int) -> Message:
    msg = Mock(spec=Message)
    msg.content = content
    msg.has_error.return_value = False
    msg.metadata.src_node_id = node
    return msg


# How a hostile or buggy client spoils its train reply: (arrays, metrics) -> RecordDict.
TRAIN_SPOILERS = {
    "extra metric key": lambda a, m: RecordDict({"arrays": a, "metrics": MetricRecord({**m, "extra": 1.0})}),
    "list-valued metric": lambda a, m: RecordDict(
        {"arrays": a, "metrics": MetricRecord({**m, "train-loss": [0.1, 0.2]})}),
    "other MetricRecord name": lambda a, m: RecordDict({"arrays": a, "other": MetricRecord(m)}),
    "other ArrayRecord name": lambda a, m: RecordDict({"weights": a, "metrics": MetricRecord(m)}),
}
EVALUATE_SPOILERS = {
    "extra metric key": lambda m: MetricRecord({**m, "extra": 1.0}),
    "negative num-examples": lambda m: MetricRecord({**m, "num-examples": -10}),
    "list-valued metric": lambda m: MetricRecord({**m, "acc": [0.1, 0.2]}),
}


def fake_grid(train_spoiler=None, evaluate_spoiler=None):
    g = grid(3)

    def answer(messages, timeout):
        out = []
        for msg in messages:
            server_round = int(msg.content["config"]["server-round"])
            node = msg.metadata.dst_node_id
            bad = node == BAD_NODE and server_round == BAD_ROUND
            if msg.metadata.message_type == "train":
                arrays = to_record(update(to_numpy(msg.content["arrays"]), node, server_round))
                metrics = {"num-examples": 10 * node, "train-loss": 0.5}
                if bad and train_spoiler is not None:
                    out.append(message(train_spoiler(arrays, metrics), node))
                else:
                    out.append(message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}), node))
            else:
                metrics = {"num-examples": 5, "acc": node / 10}
                record = evaluate_spoiler(metrics) if bad and evaluate_spoiler else MetricRecord(metrics)
                out.append(message(RecordDict({"metrics": record}), node))
        return out

    g.send_and_receive.side_effect = answer
    return g


def run(grid_, inner=None):
    strategy = LIPS(inner or FedAvg(), tau0=0.5, every=EVERY)
    return strategy.start(grid=grid_, initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)


@pytest.mark.parametrize("spoiler", sorted(TRAIN_SPOILERS))
def test_one_malformed_train_reply_does_not_end_the_run(spoiler, caplog):
    with caplog.at_level(logging.WARNING):
        result = run(fake_grid(train_spoiler=TRAIN_SPOILERS[spoiler]))
    train = result.train_metrics_clientapp
    assert sorted(train) == list(range(1, ROUNDS + 1))
    assert [train[r]["lips-mask-round"] for r in sorted(train)] == [1, 0, 1, 0]
    assert f"LIPS: ignoring reply from node {BAD_NODE}: records or metric keys differ" in caplog.text


@pytest.mark.parametrize("spoiler", sorted(EVALUATE_SPOILERS))
def test_one_malformed_evaluate_reply_does_not_end_the_run(spoiler, caplog):
    with caplog.at_level(logging.WARNING):
        result = run(fake_grid(evaluate_spoiler=EVALUATE_SPOILERS[spoiler]))
    assert sorted(result.train_metrics_clientapp) == list(range(1, ROUNDS + 1))
    assert sorted(result.evaluate_metrics_clientapp) == list(range(1, ROUNDS + 1))
    assert f"LIPS: ignoring reply from node {BAD_NODE}" in caplog.text
    assert all(np.isfinite(m["acc"]) for m in result.evaluate_metrics_clientapp.values())


def test_legacy_evaluate_results_with_a_bad_count_become_failures(caplog):
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=NAMES, num_rounds=ROUNDS)
    results = []
    for cid, count in (("1", 5), ("2", 5), ("3", -10)):
        proxy = Mock(spec=ClientProxy)
        proxy.cid = cid
        results.append((proxy, EvaluateRes(Status(Code.OK, ""), loss=1.0, num_examples=count, metrics={})))
    with caplog.at_level(logging.WARNING):
        loss, _ = strategy.aggregate_evaluate(1, results, [])
    assert loss == pytest.approx(1.0)  # ZeroDivisionError before: 5 + 5 - 10
    assert "LIPS: ignoring reply from client 3: 'num_examples' is -10" in caplog.text


# ----------------------------------------------------------------- dtypes and overflow
def spoil_dtype(model: dict, dtype) -> dict:
    return {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in model.items()}


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_message_aggregate_keeps_the_models_dtypes_with_an_odd_reply_first(dtype):
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[0] = spoil_dtype(trained[0], dtype)  # node 1: listed first
    strategy = LIPS(FedAvg(), num_rounds=ROUNDS, tau0=0.0)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    new, _ = strategy.aggregate_train(1, [reply(m, 10, node_id=i + 1) for i, m in enumerate(trained)])
    got = to_numpy(new)
    expected = {k: sum(np.asarray(m[k], dtype=np.float64) for m in trained) / 3 for k in model}
    for name, array in model.items():
        if array.dtype == np.float32:
            assert got[name].dtype == np.float32, name
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_legacy_aggregate_keeps_the_models_dtypes_with_an_odd_reply_first(dtype, caplog):
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[0] = spoil_dtype(trained[0], dtype)
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=NAMES, num_rounds=ROUNDS)
    strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
    new, metrics = strategy.aggregate_fit(
        1, [fit_result(m, 10, cid=str(i + 1)) for i, m in enumerate(trained)], [])
    got = params_to_model(new, NAMES)
    for name, array in model.items():
        if array.dtype == np.float32:
            assert got[name].dtype == np.float32, name
    # A mask round: the zeros LIPS reports are the zeros it placed (not an int32 model's).
    assert metrics["lips-mask-round"] == 1 and metrics["lips-zeros"] > 0
    assert all(np.count_nonzero(got[n]) > 0.3 * got[n].size for n in ("conv2.weight", "conv3.weight"))


def test_a_large_float32_value_after_a_float16_reply_does_not_overflow():
    """The issue's case: float16 listed first made the sum float16, and 9e4 overflowed it to Inf."""
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[0] = spoil_dtype(trained[0], np.float16)
    trained[1]["fc.weight"] = np.full_like(trained[1]["fc.weight"], 9e4)
    strategy = LIPS(FedAvg(), num_rounds=ROUNDS, tau0=0.0)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    new, _ = strategy.aggregate_train(1, [reply(m, n, node_id=i + 1)
                                          for i, (m, n) in enumerate(zip(trained, (10, 80, 10)))])
    got = to_numpy(new)
    assert got["fc.weight"].dtype == np.float32
    np.testing.assert_allclose(got["fc.weight"], 0.8 * 9e4 + 0.1 * (trained[0]["fc.weight"].astype(np.float32)
                                                                 + trained[2]["fc.weight"]), rtol=1e-3)


class SumStrategy(FedAvg):
    """Adds the replies instead of averaging them (an aggregate that can overflow)."""

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        if not replies:
            return None, None
        arrays = [to_numpy(next(iter(m.content.array_records.values()))) for m in replies]
        with np.errstate(over="ignore"):  # the overflow is the point
            return to_record({k: sum(a[k] for a in arrays) for k in arrays[0]}), MetricRecord()


def test_a_finite_reply_that_overflows_the_aggregate_is_dropped(caplog):
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[1]["fc.weight"] = np.full_like(trained[1]["fc.weight"], 3e38)
    trained[2]["fc.weight"] = np.full_like(trained[2]["fc.weight"], 2e38)
    strategy = LIPS(SumStrategy(), num_rounds=ROUNDS, tau0=0.0)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(1, [reply(m, 10, node_id=i + 1) for i, m in enumerate(trained)])
    got = to_numpy(new)
    assert all(np.isfinite(a).all() for a in got.values() if a.dtype.kind == "f")
    assert "LIPS: ignoring reply from node 2: its values (up to 3e+38) overflow the aggregate" in caplog.text
    assert "ignoring reply from node 3" not in caplog.text


def test_a_retry_restores_what_the_wrapped_strategy_cached():
    """FedAvgM caches its model and momentum: the retry without the NaN reply equals a clean round."""
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    spoiled = [dict(m) for m in trained]
    spoiled[0]["fc.bias"] = np.full_like(spoiled[0]["fc.bias"], np.nan)
    outputs = []
    for replies_models, nodes in ((spoiled, (1, 2, 3)), (trained[1:], (2, 3))):
        strategy = LIPS(FedAvgM(server_momentum=0.9), num_rounds=ROUNDS, every=2)
        arrays = to_record(model)
        for rnd in (1, 2):
            list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid()))
            if rnd == 1:
                replies = [reply(m, 10 * n, node_id=n) for m, n in zip(replies_models, nodes)]
            else:  # the same two clients in both runs
                replies = [reply(update(to_numpy(arrays), n, rnd), 10 * n, node_id=n) for n in (2, 3)]
            arrays, _ = strategy.aggregate_train(rnd, replies)
        outputs.append((to_numpy(arrays), to_numpy(strategy.strategy.current_arrays)))
    (got, got_cache), (want, want_cache) = outputs
    for name in model:
        np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(got_cache[name], want_cache[name])


def test_legacy_overflow_through_a_large_weight_is_blamed_on_that_result(caplog):
    """Legacy FedAvg multiplies by num_examples before it divides: 1e33 x 1e6 overflows float32."""
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[1]["fc.weight"] = np.full_like(trained[1]["fc.weight"], 1e33)
    strategy = LegacyLIPS(LegacyFedAvg(inplace=False), param_names=NAMES, num_rounds=ROUNDS, tau0=0.0)
    strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
    counts = (10, 10**6, 10)
    with caplog.at_level(logging.WARNING), np.errstate(over="ignore"):
        new, _ = strategy.aggregate_fit(
            1, [fit_result(m, n, cid=str(i + 1)) for i, (m, n) in enumerate(zip(trained, counts))], [])
    got = params_to_model(new, NAMES)
    assert all(np.isfinite(a).all() for a in got.values() if a.dtype.kind == "f")
    # Whether Flower's own aggregate overflows depends on numpy: 2.x keeps float32 (NEP 50),
    # 1.x sums in float64. The result above is finite either way; the drop happens when needed.
    with np.errstate(over="ignore"):
        plain, _ = LegacyFedAvg(inplace=False).aggregate_fit(
            1, [fit_result(m, n, cid=str(i + 1)) for i, (m, n) in enumerate(zip(trained, counts))], [])
    overflows = not all(np.isfinite(a).all() for a in params_to_model(plain, NAMES).values())
    dropped = "LIPS: ignoring reply from client 2: its values (up to 1e+33) overflow the aggregate"
    assert (dropped in caplog.text) == overflows
    assert overflows or np.lib.NumpyVersion(np.__version__) < "2.0.0"  # numpy 2: the case is real


def test_a_reply_listing_its_arrays_in_another_order_is_kept(caplog):
    model = tiny_model()
    trained = [update(model, node, 1) for node in (1, 2, 3)]
    trained[2] = dict(reversed(list(trained[2].items())))
    strategy = LIPS(FedAvg(), num_rounds=ROUNDS, tau0=0.0)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(1, [reply(m, 10, node_id=i + 1) for i, m in enumerate(trained)])
    assert "ignoring reply" not in caplog.text
    got = to_numpy(new)
    np.testing.assert_allclose(got["fc.weight"], sum(m["fc.weight"] for m in trained) / 3, rtol=1e-5)


# ----------------------------------------------------------------- ties in the vote
def train_reply(model: dict, node: int, **metrics) -> Message:
    record = MetricRecord({"num-examples": 10, "train-loss": 0.5, **metrics})
    return message(RecordDict({"arrays": to_record(model), "metrics": record}), node)


def test_a_tie_in_the_vote_never_goes_to_the_replies_that_came_first(caplog):
    """Issue 28, 4: two replies with an extra metric key and wild weights arrive before two honest ones.

    Before: a tie went to the first reply's signature, and FedMedian aggregated
    only the odd two. Now it goes to the previous round's signature, else to
    the fewest keys: here the honest replies, in round 1 and after it.
    """
    model = tiny_model()
    strategy = LIPS(FedMedian(), num_rounds=ROUNDS, tau0=0.0)
    for rnd in (1, 2):
        honest = [update(model, node, rnd) for node in (3, 4)]
        wild = [{k: v + 100.0 if v.dtype.kind == "f" else v for k, v in update(model, node, rnd).items()}
                for node in (1, 2)]
        list(strategy.configure_train(rnd, to_record(model), ConfigRecord(), grid(4)))
        odd = [train_reply(m, node, extra=1.0) for m, node in zip(wild, (1, 2))]
        with caplog.at_level(logging.WARNING):
            new, _ = strategy.aggregate_train(rnd, odd + [train_reply(m, node) for m, node in zip(honest, (3, 4))])
        for name in ("conv2.weight", "fc.weight"):
            np.testing.assert_allclose(to_numpy(new)[name], (honest[0][name] + honest[1][name]) / 2, rtol=1e-6)
        for node in (1, 2):
            assert f"ignoring reply from node {node}: records or metric keys differ" in caplog.text
        caplog.clear()


def test_a_tie_goes_to_the_previous_rounds_signature_even_against_fewer_keys(caplog):
    """After an honest round, two odd replies lacking a key (so: fewer keys) still lose the tie,
    train and evaluate."""
    model = tiny_model()
    strategy = LIPS(FedMedian(), num_rounds=ROUNDS, tau0=0.0)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid(4)))
    strategy.aggregate_train(1, [train_reply(update(model, node, 1), node) for node in (1, 2, 3, 4)])
    evaluate = lambda node, **m: message(RecordDict({"metrics": MetricRecord(  # noqa: E731
        {"num-examples": 5, "acc": node / 10, **m})}), node)
    strategy.aggregate_evaluate(1, [evaluate(node, loss=1.0) for node in (1, 2, 3, 4)])
    honest = [update(model, node, 2) for node in (3, 4)]
    wild = [{k: v + 100.0 if v.dtype.kind == "f" else v for k, v in update(model, node, 2).items()}
            for node in (1, 2)]
    lacking = [message(RecordDict({"arrays": to_record(m), "metrics": MetricRecord({"num-examples": 10})}), n)
               for m, n in zip(wild, (1, 2))]
    list(strategy.configure_train(2, to_record(model), ConfigRecord(), grid(4)))
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(2, lacking + [train_reply(m, node) for m, node in zip(honest, (3, 4))])
        metrics = strategy.aggregate_evaluate(2, [evaluate(1), evaluate(2), evaluate(3, loss=1.0),
                                                  evaluate(4, loss=1.0)])
    np.testing.assert_allclose(to_numpy(new)["fc.weight"], (honest[0]["fc.weight"] + honest[1]["fc.weight"]) / 2,
                               rtol=1e-6)
    assert metrics["acc"] == pytest.approx(0.35)  # nodes 3 and 4
    assert caplog.text.count("records or metric keys differ") == 4


def test_a_tie_in_round_one_goes_to_the_record_the_model_was_sent_in(caplog):
    """With no earlier round, replies whose ArrayRecord has the name the model went out under win a
    tie against the same count under another name (here one that sorts first)."""
    model = tiny_model()
    strategy = LIPS(FedMedian(), num_rounds=ROUNDS, tau0=0.0)
    honest = [update(model, node, 1) for node in (3, 4)]
    wild = [{k: v + 100.0 if v.dtype.kind == "f" else v for k, v in update(model, node, 1).items()}
            for node in (1, 2)]
    odd = [message(RecordDict({"aaa": to_record(m), "metrics": MetricRecord({"num-examples": 10,
                                                                            "train-loss": 0.5})}), n)
           for m, n in zip(wild, (1, 2))]
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid(4)))
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(1, odd + [train_reply(m, node) for m, node in zip(honest, (3, 4))])
    np.testing.assert_allclose(to_numpy(new)["fc.weight"], (honest[0]["fc.weight"] + honest[1]["fc.weight"]) / 2,
                               rtol=1e-6)
    assert "ignoring reply from node 1: records or metric keys differ" in caplog.text
