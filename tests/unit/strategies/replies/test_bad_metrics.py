"""Issue 28, defect 5: NaN, Inf and 1e308 metric values are left out of the aggregated metrics.

Before, they passed into the aggregated train and evaluate metrics without a
word (legacy means multiply by ``num_examples`` first: 1e308 overflows them).
Now each is named in a WARNING with its node and key, and given the weighted
mean of the other replies' values, which leaves the weighted mean of all
replies theirs; the reply's arrays still count.
"""

from __future__ import annotations

import logging
import math
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, EvaluateRes, Status, ndarrays_to_parameters
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from flower_fakes import (
    client_manager,
    client_models,
    grid,
    legacy_result,
    params_to_model,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
)
from lips_flwr.strategies import LIPS, LegacyLIPS
from lips_flwr.strategies.replies.checks import MAX_METRIC, metric_ok

pytestmark = pytest.mark.usefixtures("task_identity")
NAMES = list(tiny_model())
WEIGHTS = (10, 30, 60)
BAD = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "1e308": 1e308}


def weighted_average(pairs):
    """The legacy apps' metric mean: ``sum(n * value) / sum(n)`` (1e308 * n overflows)."""
    total = sum(n for n, _ in pairs)
    return {key: sum(n * m[key] for n, m in pairs) / total for key in pairs[0][1]}


def message(content: RecordDict, node: int) -> Message:
    msg = Mock(spec=Message)
    msg.content = content
    msg.has_error.return_value = False
    msg.metadata.src_node_id = node
    return msg


def train_round(api: str, metrics: list[dict]):
    """One round of 3 replies with these metrics: ``(aggregated arrays, aggregated metrics, models)``."""
    model = tiny_model()
    trained = client_models(model, 3, seed=1)
    if api == "message":
        strategy = LIPS(FedAvg(), num_rounds=10, tau0=0.0)
        list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
        replies = [message(RecordDict({"arrays": to_record(m), "metrics": MetricRecord(
            {"num-examples": n, **extra})}), i + 1) for i, (m, n, extra) in enumerate(zip(trained, WEIGHTS, metrics))]
        new, aggregated = strategy.aggregate_train(1, replies)
        return to_numpy(new), dict(aggregated), trained
    strategy = LegacyLIPS(LegacyFedAvg(fit_metrics_aggregation_fn=weighted_average), param_names=NAMES,
                          num_rounds=10, tau0=0.0)
    strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
    new, aggregated = strategy.aggregate_fit(
        1, [legacy_result(m, str(i + 1), n, **extra)
            for i, (m, n, extra) in enumerate(zip(trained, WEIGHTS, metrics))], [])
    return params_to_model(new, NAMES), aggregated, trained


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_train_metric_is_left_out_and_the_arrays_still_count(api, bad, caplog):
    metrics = [{"loss": 0.5, "acc": 0.1}, {"loss": BAD[bad], "acc": 0.2}, {"loss": 0.8, "acc": 0.3}]
    with caplog.at_level(logging.WARNING):
        new, aggregated, trained = train_round(api, metrics)
    who = "node 2" if api == "message" else "client 2"
    assert f"LIPS: leaving the metric 'loss' of {who} ({BAD[bad]!r}) out of the aggregate" in caplog.text
    assert aggregated["loss"] == pytest.approx((10 * 0.5 + 60 * 0.8) / 70)  # nodes 1 and 3
    assert aggregated["acc"] == pytest.approx((10 * 0.1 + 30 * 0.2 + 60 * 0.3) / 100)  # all three
    expected = sum(m["fc.weight"] * n for m, n in zip(trained, WEIGHTS)) / 100  # node 2's arrays count
    np.testing.assert_allclose(new["fc.weight"], expected, rtol=1e-6)


def test_a_key_no_reply_has_a_good_value_for_is_left_out_of_the_aggregate(caplog):
    metrics = [{"loss": float("nan"), "acc": [0.1, 0.2]}, {"loss": float("inf"), "acc": [0.2, math.nan]},
               {"loss": 1e308, "acc": [0.3, 0.4]}]
    with caplog.at_level(logging.WARNING):
        _, aggregated, _ = train_round("message", metrics)
    assert "loss" not in aggregated
    assert caplog.text.count("LIPS: leaving the metric 'loss'") == 3
    assert "LIPS: leaving the metric 'acc' of node 2 ([0.2, nan])" in caplog.text
    assert aggregated["acc"] == pytest.approx([(10 * 0.1 + 60 * 0.3) / 70, (10 * 0.2 + 60 * 0.4) / 70])


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_bad_evaluate_metric_is_left_out(api, caplog):
    accs = (0.5, float("nan"), 0.8)
    with caplog.at_level(logging.WARNING):
        if api == "message":
            strategy = LIPS(FedAvg(), num_rounds=10)
            replies = [message(RecordDict({"metrics": MetricRecord({"num-examples": n, "acc": a})}), i + 1)
                       for i, (n, a) in enumerate(zip(WEIGHTS, accs))]
            acc = strategy.aggregate_evaluate(1, replies)["acc"]
        else:
            strategy = LegacyLIPS(LegacyFedAvg(evaluate_metrics_aggregation_fn=weighted_average),
                                  param_names=NAMES, num_rounds=10)
            results = []
            for i, (n, a) in enumerate(zip(WEIGHTS, accs)):
                proxy = Mock(spec=ClientProxy)
                proxy.cid = str(i + 1)
                results.append((proxy, EvaluateRes(Status(Code.OK, ""), loss=1.0, num_examples=n,
                                                   metrics={"acc": a})))
            acc = strategy.aggregate_evaluate(1, results, [])[1]["acc"]
    assert acc == pytest.approx((10 * 0.5 + 60 * 0.8) / 70)
    assert f"LIPS: leaving the metric 'acc' of {'node' if api == 'message' else 'client'} 2 (nan)" in caplog.text


def test_the_bound_keeps_a_legacy_weighted_sum_finite():
    """MAX_METRIC times the largest count LIPS accepts (2**53), a million times over, is finite."""
    assert math.isfinite(MAX_METRIC * 2.0**53 * 2**20)
    assert metric_ok(MAX_METRIC) and metric_ok(-MAX_METRIC) and metric_ok(10**20) and metric_ok("text")
    assert not metric_ok(1e308) and not metric_ok(10**400) and not metric_ok([0.1, float("nan")])
    assert not metric_ok(np.float32("inf")) and metric_ok(np.float32(0.5))  # legacy metrics may be numpy


def legacy_evaluate(losses, metrics, aggregate=weighted_average):
    """One legacy evaluate round of 3 results: ``(aggregated loss, aggregated metrics)``."""
    strategy = LegacyLIPS(LegacyFedAvg(evaluate_metrics_aggregation_fn=aggregate), param_names=NAMES,
                          num_rounds=10)
    results = []
    for i, (n, loss, extra) in enumerate(zip(WEIGHTS, losses, metrics)):
        proxy = Mock(spec=ClientProxy)
        proxy.cid = str(i + 1)
        results.append((proxy, EvaluateRes(Status(Code.OK, ""), loss=loss, num_examples=n, metrics=dict(extra))))
    return strategy.aggregate_evaluate(1, results, [])


def legacy_train_metrics(metrics, aggregate):
    """One legacy train round of 3 results with these metrics (``aggregate``: the metric aggregation)."""
    model = tiny_model()
    strategy = LegacyLIPS(LegacyFedAvg(fit_metrics_aggregation_fn=aggregate), param_names=NAMES,
                          num_rounds=10, tau0=0.0)
    strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
    results = [legacy_result(m, str(i + 1), n) for i, (m, n) in enumerate(zip(client_models(model, 3, 1), WEIGHTS))]
    for (_, res), extra in zip(results, metrics):
        res.metrics.update(extra)  # (a key "num_examples" too)
    return strategy.aggregate_fit(1, results, [])


@pytest.mark.parametrize("kind", ["train", "evaluate"])
def test_a_bad_legacy_metric_beside_text_or_bools_is_stood_in_for_by_the_numbers_only(kind, caplog):
    """Legacy metrics may hold text: before, a NaN beside "ok" got ``float("ok")`` as its stand-in,
    a ValueError out of aggregate_fit/aggregate_evaluate that ended the run (and a bool counted as 1).
    Now the stand-in is the mean of the real numbers; a key with none goes from the bad replies only."""
    seen: list = []

    def record(pairs):
        seen.extend(pairs)
        return {}

    metrics = [{"k": math.nan, "t": math.nan, "b": math.inf, "l": [math.nan, 1.0]},
               {"k": "ok", "t": "fine", "b": True, "l": [0.2, "x"]},
               {"k": 0.8, "t": "good", "b": 0.4, "l": [0.3, 0.6]}]
    with caplog.at_level(logging.WARNING):
        if kind == "train":
            legacy_train_metrics(metrics, record)
        else:
            legacy_evaluate((1.0, 1.0, 1.0), metrics, record)
    for key in "ktbl":
        assert f"LIPS: leaving the metric {key!r} of client 1" in caplog.text
    assert seen == [(10, {"k": 0.8, "b": 0.4, "l": [0.3, 0.6]}),  # "t": no number to stand in: left out
                    (30, {"k": "ok", "t": "fine", "b": True, "l": [0.2, "x"]}),  # text and bools untouched
                    (60, {"k": 0.8, "t": "good", "b": 0.4, "l": [0.3, 0.6]})]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_legacy_loss_is_left_out_of_the_aggregated_loss(bad, caplog):
    """Before: ``EvaluateRes.loss`` was not checked; NaN, Inf or 1e308 went into Flower's
    ``weighted_loss_avg`` (a NaN or Inf round loss). Now it is treated as a bad metric is."""
    with caplog.at_level(logging.WARNING):
        loss, metrics = legacy_evaluate((0.5, BAD[bad], 0.8), [{"acc": 0.1}, {"acc": 0.2}, {"acc": 0.3}])
    assert f"LIPS: leaving the metric 'EvaluateRes.loss' of client 2 ({BAD[bad]!r}) out" in caplog.text
    assert loss == pytest.approx((10 * 0.5 + 60 * 0.8) / 70)  # clients 1 and 3
    assert metrics["acc"] == pytest.approx((10 * 0.1 + 30 * 0.2 + 60 * 0.3) / 100)  # its metrics count


def test_a_legacy_round_without_a_good_loss_has_no_loss(caplog):
    """No result has a good loss: the round's loss is None (Flower's server records none), its
    metrics still aggregated."""
    with caplog.at_level(logging.WARNING):
        loss, metrics = legacy_evaluate((math.nan, math.inf, 1e308), [{"acc": 0.1}, {"acc": 0.2}, {"acc": 0.3}])
    assert loss is None
    assert caplog.text.count("LIPS: leaving the metric 'EvaluateRes.loss'") == 3
    assert metrics["acc"] == pytest.approx((10 * 0.1 + 30 * 0.2 + 60 * 0.3) / 100)


@pytest.mark.parametrize("kind", ["train", "evaluate"])
def test_a_legacy_metric_named_num_examples_is_checked_as_any_other(kind, caplog):
    """Before: a metric named like the weight (legacy ``num_examples``, a field of its own) skipped the
    check, and its NaN reached the aggregated metrics."""
    metrics = [{"num_examples": 5}, {"num_examples": math.nan}, {"num_examples": 7}]
    with caplog.at_level(logging.WARNING):
        if kind == "train":
            aggregated = legacy_train_metrics(metrics, weighted_average)[1]
        else:
            aggregated = legacy_evaluate((1.0, 1.0, 1.0), metrics)[1]
    assert "LIPS: leaving the metric 'num_examples' of client 2 (nan) out" in caplog.text
    assert aggregated["num_examples"] == pytest.approx((10 * 5 + 60 * 7) / 70)
