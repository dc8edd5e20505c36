"""What the runner keeps beyond the Grid's messages: Flower's log lines, rounds that did not move the model.

The observer hears the strategy's metrics, the ServerApp's evaluation and its
warnings through a handler on the ``flwr`` logger (``strategy_log.py``); a
run whose global model did not move in most rounds fails with those warnings.
"""

from __future__ import annotations

from logging import ERROR, INFO, WARNING

import numpy as np
import pytest
from flower_fakes import task_identity  # noqa: F401
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log

from lips_flwr.experiments.runner.observe import RunFailed, RunObserver, stalled_rounds, zero_fractions

MODEL = {"first.weight": np.ones((2, 3), np.float32), "mid.weight": np.full((3, 3), 2.0, np.float32),
         "last.weight": np.ones((3, 2), np.float32), "last.bias": np.zeros(2, np.float32)}


def instruction(kind: str, rnd: int, node: int, arrays: dict) -> Message:
    content = RecordDict({"config": ConfigRecord({"server-round": rnd}),
                          "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()})})
    msg = Message(content, dst_node_id=node, message_type=kind)
    msg.metadata.__dict__["_message_id"] = f"{kind}-{rnd}-{node}"
    return msg


def reply(to: Message, metrics: dict) -> Message:
    out = Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=to)
    out.metadata.__dict__["_src_node_id"] = to.metadata.dst_node_id
    return out


def play(observer: RunObserver, models: list[dict], said=lambda rnd: None) -> None:
    """Rounds 1..len(models)-1 of one node: train with models[r-1], evaluate with models[r]."""
    for rnd in range(1, len(models)):
        train = instruction("train", rnd, 1000, models[rnd - 1])
        observer.pushed([train])
        observer.replied([reply(train, {"loss": 1.0, "num-examples": 1})])
        said(rnd)
        evaluate = instruction("evaluate", rnd, 1000, models[rnd])
        observer.pushed([evaluate])
        observer.replied([reply(evaluate, {"acc": 0.5, "num-examples": 1})])


def scaled(factor: float) -> dict:
    return {**MODEL, "mid.weight": MODEL["mid.weight"] * factor}


def test_rounds_without_an_aggregate_fail_a_run_with_the_strategys_reasons(task_identity):  # noqa: F811
    """``lr=nan``: every reply dropped, every round; compare still wrote a verdict (+0.0000)."""
    observer = RunObserver()

    def no_aggregate(rnd: int) -> None:
        if rnd >= 2:
            log(WARNING, "LIPS: round %d has no aggregate (no usable reply): nothing masked; "
                "the global model stays as it was", rnd)

    play(observer, [scaled(1.0), scaled(2.0), scaled(2.0), scaled(2.0), scaled(2.0)], no_aggregate)
    rounds = observer.record()["rounds"]
    assert stalled_rounds(rounds) == {"no_aggregate": [2, 3, 4], "unchanged": [2, 3, 4], "nonfinite": []}
    assert rounds["3"]["no_aggregate"] is True
    assert observer.record()["stalled_rounds"] == stalled_rounds(rounds)  # kept in the result file
    assert "round 3 has no aggregate" in observer.record()["warnings"][1]
    with pytest.raises(RunFailed, match=r"3 of its 4 trained rounds did not move the global model \(no "
                                        r"aggregate: rounds 2, 3, 4; the model unchanged: rounds 2, 3, 4\)"
                                        r"(.|\n)*round 4 has no aggregate"):
        observer.check(require_evaluate=True)
    half = RunObserver()  # half the rounds: flagged, not failed
    play(half, [scaled(1.0), scaled(2.0), scaled(2.0), scaled(3.0), scaled(3.0)])
    assert stalled_rounds(half.record()["rounds"])["unchanged"] == [2, 4]
    half.check(require_evaluate=True)
    bad = RunObserver()
    play(bad, [scaled(1.0), scaled(float("nan")), scaled(float("nan"))])
    assert stalled_rounds(bad.record()["rounds"])["nonfinite"] == [1, 2]
    with pytest.raises(RunFailed, match="a non-finite model: rounds 1, 2"):
        bad.check(require_evaluate=True)


def test_the_strategys_lips_metrics_mask_rounds_and_server_evaluation_are_kept(task_identity):  # noqa: F811
    observer = RunObserver()
    log(INFO, "Initial global evaluation results: %s", MetricRecord({"accuracy": 0.1}))
    masked = {**MODEL, "mid.weight": np.array([[0, 0, 2], [0, 2, 2], [2, 2, 2]], np.float32)}

    def strategy_says(rnd: int) -> None:
        if rnd == 2:
            log(INFO, "LIPS: round %d masked %d weights in %d layers (tau=%.4f, %.3fs)",
                2, 3, 1, 0.3333, 0.01)
        log(INFO, "\t└──> Aggregated MetricRecord: %s",
            MetricRecord({"lips-tau": 0.3333 if rnd == 2 else 0.0, "lips-mask-round": int(rnd == 2),
                          "loss": 1.0}))
        log(ERROR, "some other trouble in round %d", rnd)

    play(observer, [scaled(1.0), scaled(0.5), masked], strategy_says)
    log(INFO, "\t└──> MetricRecord: %s", {"accuracy": 0.7, "note": True})
    rounds = observer.record()["rounds"]
    assert rounds["0"]["server_evaluate"] == {"metrics": {"accuracy": 0.1}}  # the initial model's
    assert rounds["2"]["server_evaluate"] == {"metrics": {"accuracy": 0.7}}
    assert rounds["2"]["strategy"] == {"lips-tau": pytest.approx(0.3333), "lips-mask-round": 1.0}
    assert rounds["2"]["lips"] == {"tau": pytest.approx(0.3333), "zeros": 3, "layers": 1}
    assert rounds["1"]["strategy"]["lips-mask-round"] == 0.0 and "lips" not in rounds["1"]
    assert rounds["2"]["zeros"] == {"first": 0.0, "middle": pytest.approx(3 / 9), "last": 0.0}
    assert observer.record()["warnings"] == ["(round 1) some other trouble in round 1",
                                             "(round 2) some other trouble in round 2"]


def test_zero_fractions_are_per_layer_group():
    weights = {"a": np.zeros(4), "b": np.array([0.0, 1.0]), "c": np.array([1.0, 0.0, 0.0, 0.0]),
               "d": np.ones(3)}
    layers = {"all": ["a", "b", "c", "d"], "middle": ["b", "c"]}
    assert zero_fractions(weights, layers) == {"first": 1.0, "middle": pytest.approx(4 / 6), "last": 0.0}
