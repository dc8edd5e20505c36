"""LIPS around Message API strategies, on mocked replies (no Ray)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
)

from flower_fakes import (
    MIDDLE,
    client_models,
    grid,
    reply,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
    zeros_placed,
)
from lips_flwr.strategies import LIPS, LIPSFedAvg

pytestmark = pytest.mark.usefixtures("task_identity")
NUM_ROUNDS = 7
EXAMPLES = [10, 30, 60]


def run_rounds(strategy, num_rounds=NUM_ROUNDS, seed=0):
    """Drive configure/aggregate like ``Strategy.start``; return per-round (before, after, metrics)."""
    model = tiny_model(seed)
    arrays = to_record(model)
    history = []
    for rnd in range(1, num_rounds + 1):
        list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid()))
        current = to_numpy(arrays)
        trained = client_models(current, len(EXAMPLES), seed=100 * seed + rnd)
        replies = [reply(m, n, node_id=i + 1) for i, (m, n) in enumerate(zip(trained, EXAMPLES))]
        new, metrics = strategy.aggregate_train(rnd, replies)
        history.append((current, to_numpy(new), metrics))
        arrays = new
    return history


def fedavg_of(models, weights):
    total = sum(weights)
    return {k: sum(m[k] * (w / total) for m, w in zip(models, weights)) for k in models[0]}


def test_masks_exactly_on_schedule_and_only_middle_layers():
    strategy = LIPS(FedAvg(), num_rounds=NUM_ROUNDS, tau0=0.5, every=5)
    reference = FedAvg()
    history = run_rounds(strategy)
    ref_history = run_rounds(reference)
    for rnd, ((before, after, metrics), (_, _, _)) in enumerate(zip(history, ref_history), start=1):
        mask_round = rnd in (1, 6)
        assert metrics["lips-mask-round"] == int(mask_round)
        tau = 0.5 * (1 - (rnd - 1) / NUM_ROUNDS) if mask_round else 0.0
        assert metrics["lips-tau"] == pytest.approx(tau)
        # The unmasked aggregate: FedAvg of this round's client models.
        trained = client_models(before, len(EXAMPLES), seed=rnd)
        aggregate = fedavg_of(trained, EXAMPLES)
        for name, value in after.items():
            if name in MIDDLE and mask_round:
                k = math.ceil(value.size * tau)
                assert zeros_placed(aggregate[name], value) == k
                assert metrics[f"lips-zeros/{name}"] == k
                kept = value != 0
                np.testing.assert_allclose(value[kept], aggregate[name][kept], rtol=1e-6)
                score = np.abs((aggregate[name] - before[name]) * aggregate[name])
                assert score[~kept].max() <= score[kept].min()
            else:
                np.testing.assert_allclose(value, aggregate[name], rtol=1e-6, atol=1e-7)
        if not mask_round:
            assert metrics["lips-zeros"] == 0
    assert history[0][2]["lips-layers-masked"] == len(MIDDLE)


@pytest.mark.parametrize("mask_last_round", [False, True])
def test_the_model_after_the_final_round_is_not_freshly_masked_unless_told(mask_last_round):
    """Issue 35: every=5 over 6 rounds masked rounds 1 and 6, so the model returned after the last
    round had a fraction of its middle weights zeroed, with no round left to regrow them."""
    strategy = LIPS(FedAvg(), num_rounds=6, tau0=0.5, every=5, mask_last_round=mask_last_round)
    history = run_rounds(strategy, num_rounds=6)
    assert [m["lips-mask-round"] for _, _, m in history] == [1, 0, 0, 0, 0, int(mask_last_round)]
    before, after, metrics = history[-1]
    aggregate = fedavg_of(client_models(before, len(EXAMPLES), seed=6), EXAMPLES)
    fresh = sum(zeros_placed(aggregate[name], after[name]) for name in MIDDLE)
    assert fresh == metrics["lips-zeros"]
    assert (fresh > 0) == mask_last_round


def test_client_mode_still_masks_its_last_scheduled_round():
    """The clients train after their mask: the final round's mask is not the returned model's."""
    strategy = LIPS(FedAvg(), num_rounds=6, every=5, mode="client")
    arrays = to_record(tiny_model(0))
    for rnd in (1, 6):
        config = next(iter(strategy.configure_train(rnd, arrays, ConfigRecord(), grid()))).content["config"]
        assert config["lips-tau"] > 0, rnd


def test_metrics_of_inner_strategy_are_kept():
    strategy = LIPS(FedAvg(), num_rounds=3)
    _, _, metrics = run_rounds(strategy, num_rounds=1)[0]
    assert isinstance(metrics, MetricRecord)
    assert metrics["train-loss"] == pytest.approx(0.5)
    assert metrics["lips-seconds"] >= 0


@pytest.mark.parametrize(
    "make_inner",
    [
        FedAvg,
        lambda: FedProx(proximal_mu=0.1),
        lambda: FedAdam(),
        lambda: FedAvgM(server_momentum=0.9),
        lambda: DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 10.0, 3),
    ],
    ids=["fedavg", "fedprox", "fedadam", "fedavgm", "dp-fixed-clipping"],
)
def test_tau0_zero_reproduces_inner_strategy_bit_for_bit(make_inner):
    plain = run_rounds(make_inner())
    wrapped = run_rounds(LIPS(make_inner(), num_rounds=NUM_ROUNDS, tau0=0.0))
    for (_, a, _), (_, b, _) in zip(plain, wrapped):
        assert list(a) == list(b)
        for name in a:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize(
    ("make_inner", "server_lr"),
    [
        (FedAvg, 1.0),
        (lambda: FedProx(proximal_mu=0.1), 1.0),
        (lambda: FedAvgM(server_learning_rate=0.5), 0.5),
        (lambda: DifferentialPrivacyServerSideFixedClipping(FedAvg(), 0.0, 100.0, 3), 1.0),
    ],
    ids=["fedavg", "fedprox", "fedavgm-server-lr", "dp-fixed-clipping"],
)
def test_next_round_builds_on_the_masked_model(make_inner, server_lr):
    """Round 2 must start from the sparsified model, not from a cached dense copy."""
    history = run_rounds(LIPS(make_inner(), num_rounds=NUM_ROUNDS), num_rounds=2)
    masked, round2 = history[0][1], history[1][1]
    assert any(np.count_nonzero(masked[n] == 0) for n in MIDDLE)
    trained = client_models(masked, len(EXAMPLES), seed=2)
    mean = fedavg_of(trained, EXAMPLES)
    for name in round2:
        expected = masked[name] + server_lr * (mean[name] - masked[name])
        np.testing.assert_allclose(round2[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("make_inner", [lambda: FedAvgM(server_momentum=0.9), FedAdam],
                         ids=["fedavgm", "fedadam"])
def test_cached_model_of_inner_strategy_is_the_masked_one(make_inner):
    inner = make_inner()
    strategy = LIPS(inner, num_rounds=NUM_ROUNDS)
    masked = run_rounds(strategy, num_rounds=1)[0][1]
    list(strategy.configure_train(2, to_record(masked), ConfigRecord(), grid()))
    cache = inner.current_arrays
    cache = to_numpy(cache) if isinstance(cache, ArrayRecord) else cache
    for name in masked:
        np.testing.assert_array_equal(cache[name], masked[name])


class MomentumKeeper(FedAvgM):
    """Flower's FedAvgM that remembers the record it returned (its cache, before LIPS syncs it)."""

    def aggregate_train(self, server_round, replies):
        self.returned, metrics = super().aggregate_train(server_round, replies)
        return self.returned, metrics


def test_the_cache_sync_serializes_only_the_masked_layers():
    """Issue 36: FedAvgM's cached model keeps its own Arrays for every layer the mask leaves alone
    (before, the whole record was copied and serialized again), and the masked layers are the
    broadcast model's own: FedAvgM caches the record it returns, so its cache becomes the masked
    model LIPS broadcasts (serialized once, as unwrapped FedAvgM's cache is the model it sends)."""
    inner = MomentumKeeper(server_momentum=0.9)
    strategy = LIPS(inner, num_rounds=NUM_ROUNDS)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    replies = [reply(m, n, node_id=i + 1)
               for i, (m, n) in enumerate(zip(client_models(model, len(EXAMPLES), seed=1), EXAMPLES))]
    broadcast, metrics = strategy.aggregate_train(1, replies)
    masked = {name for name in inner.returned if metrics.get(f"lips-zeros/{name}")}
    assert masked and inner.current_arrays is not inner.returned
    assert inner.current_arrays is broadcast
    for name, array in inner.current_arrays.items():  # (an ArrayRecord wraps its Arrays anew, bytes kept)
        assert (array.data is inner.returned[name].data) == (name not in masked), name


class KeepsItsAggregate(FedAvg):
    """A strategy that caches the very record it returns (as Message FedAvgM does), declared."""

    lips_cached_model = ("kept",)

    def aggregate_train(self, server_round, replies):
        self.kept, metrics = super().aggregate_train(server_round, replies)
        self.returned = self.kept
        return self.kept, metrics


def test_a_cached_aggregate_in_another_order_than_the_model_is_zeroed_in_its_own():
    """A cache is paired with the next aggregate by position (FedAvgM does), so a cache that is the
    aggregate (in the first reply's order) becomes the masked model (in the global model's order)
    only when the two orders agree; otherwise it keeps its order and gets the zeros."""
    inner = KeepsItsAggregate()
    strategy = LIPS(inner, num_rounds=NUM_ROUNDS)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    permuted = [dict(reversed(list(m.items()))) for m in client_models(model, len(EXAMPLES), seed=1)]
    replies = [reply(m, n, node_id=i + 1) for i, (m, n) in enumerate(zip(permuted, EXAMPLES))]
    broadcast, metrics = strategy.aggregate_train(1, replies)
    assert metrics["lips-zeros"] > 0
    assert list(inner.returned) == list(reversed(list(model))) and list(broadcast) == list(model)
    assert inner.kept is not broadcast and list(inner.kept) == list(inner.returned)
    cache, sent = to_numpy(inner.kept), to_numpy(broadcast)
    for name in model:
        np.testing.assert_array_equal(cache[name], sent[name])
    # In the model's order, the cache is the broadcast model itself.
    inner = KeepsItsAggregate()
    strategy = LIPS(inner, num_rounds=NUM_ROUNDS)
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    replies = [reply(m, n, node_id=i + 1)
               for i, (m, n) in enumerate(zip(client_models(model, len(EXAMPLES), seed=1), EXAMPLES))]
    broadcast, _ = strategy.aggregate_train(1, replies)
    assert inner.kept is broadcast


class CachingFedAvg(FedAvg):
    """A strategy of one's own that builds on a copy of its aggregate, declared as a cached model."""

    lips_cached_model = ("last_model",)

    def __init__(self) -> None:
        super().__init__()
        self.last_model: dict | None = None

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.last_model = to_numpy(arrays)
        return arrays, metrics


def test_a_declared_cached_model_of_ones_own_gets_the_zeros():
    inner = CachingFedAvg()
    masked = run_rounds(LIPS(inner, num_rounds=NUM_ROUNDS), num_rounds=1)[0][1]
    assert any(np.count_nonzero(masked[n] == 0) for n in MIDDLE)
    for name in masked:
        np.testing.assert_array_equal(inner.last_model[name], masked[name])


def test_fedavg_subclass_equals_wrapper():
    a = run_rounds(LIPS(FedAvg(), num_rounds=NUM_ROUNDS, tau0=0.3, every=2))
    b = run_rounds(LIPSFedAvg(num_rounds=NUM_ROUNDS, tau0=0.3, every=2))
    for (_, x, mx), (_, y, my) in zip(a, b):
        assert mx["lips-zeros"] == my["lips-zeros"]
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])


def test_client_mode_sends_config_and_leaves_aggregate_dense():
    strategy = LIPS(FedAvg(), num_rounds=NUM_ROUNDS, mode="client", score="magnitude")
    model = tiny_model()
    messages = list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    config = messages[0].content["config"]
    assert config["lips-mode"] == "client" and config["lips-round"] == 1
    assert config["lips-tau"] == pytest.approx(0.5)
    assert config["lips-score"] == "magnitude"
    names = list(model)
    assert [names[i] for i in json.loads(config["lips-layers"])] == MIDDLE
    trained = client_models(model, 3, seed=1)
    new, metrics = strategy.aggregate_train(1, [reply(m, n) for m, n in zip(trained, EXAMPLES)])
    assert metrics["lips-mask-round"] == 1 and metrics["lips-zeros"] == 0
    for name, value in to_numpy(new).items():
        np.testing.assert_allclose(value, fedavg_of(trained, EXAMPLES)[name], rtol=1e-6, atol=1e-7)
    messages = list(strategy.configure_train(2, new, ConfigRecord(), grid()))
    assert messages[0].content["config"]["lips-tau"] == 0.0
    assert "lips-layers" not in messages[0].content["config"]


def test_mismatched_replies_are_dropped_with_a_reason(caplog):
    strategy = LIPS(FedAvg(), num_rounds=3)
    model = tiny_model()
    list(strategy.configure_train(2, to_record(model), ConfigRecord(), grid()))
    good = client_models(model, 2, seed=3)
    missing = dict(good[0])
    del missing["fc.weight"]
    reshaped = dict(good[0])
    reshaped["conv2.weight"] = reshaped["conv2.weight"].reshape(-1)
    replies = [reply(good[0], 10), reply(good[1], 30), reply(missing, 10, node_id=7),
               reply(reshaped, 10, node_id=8)]
    with caplog.at_level(logging.WARNING):
        new, metrics = strategy.aggregate_train(2, replies)
    assert strategy.core.num_rounds == 3 and metrics["lips-mask-round"] == 0
    assert "node 7" in caplog.text and "missing arrays ['fc.weight']" in caplog.text
    assert "node 8" in caplog.text and "'conv2.weight' has shape" in caplog.text
    np.testing.assert_allclose(to_numpy(new)["fc.weight"], fedavg_of(good, [10, 30])["fc.weight"],
                               rtol=1e-6)


def test_start_takes_num_rounds_and_runs_the_schedule(caplog):
    """The whole ``Strategy.start`` loop with a fake grid that answers each message."""
    strategy = LIPS(FedAvg(fraction_evaluate=0.0), tau0=0.4, every=3)
    g = grid(2)

    def answer(messages, timeout):
        out = []
        for i, msg in enumerate(messages):
            current = to_numpy(msg.content["arrays"])
            out.append(reply(client_models(current, 1, seed=i)[0], 20, node_id=i + 1))
        return out

    g.send_and_receive.side_effect = answer
    with caplog.at_level(logging.INFO):
        result = strategy.start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=5)
    assert strategy.core.num_rounds == 5
    masked = [r for r, m in result.train_metrics_clientapp.items() if m["lips-mask-round"]]
    assert masked == [1, 4]
    assert "LIPS settings" in caplog.text
    assert "LIPS: round 4 masked" in caplog.text


def test_missing_num_rounds_is_a_clear_error():
    strategy = LIPS(FedAvg())
    with pytest.raises(ValueError, match="num_rounds"):
        run_rounds(strategy, num_rounds=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tau0": 1.0}, r"`tau0` must be in \[0, 1\)"),
        ({"tau0": -0.1}, r"`tau0` must be in \[0, 1\)"),
        ({"every": 0}, r"`every` must be an integer >= 1"),
        ({"num_rounds": 0}, r"`num_rounds` must be an integer >= 1"),
        ({"start_round": 0}, r"`start_round` must be an integer >= 1"),
        ({"score": "taylor"}, r"`score` must be one of"),
        ({"layers": "middles"}, r"`layers` must be one of"),
        ({"mode": "both"}, r"`mode` must be one of"),
        ({"decay": "step"}, r"`decay` must be one of"),
        ({"seed": -1}, r"`seed` must be a non-negative integer"),
    ],
)
def test_invalid_hyperparameters_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LIPS(FedAvg(), **kwargs)
    with pytest.raises(ValueError, match=match):
        LIPSFedAvg(**kwargs)


def test_wrapping_a_legacy_strategy_is_refused():
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    with pytest.raises(ValueError, match="LegacyLIPS"):
        LIPS(LegacyFedAvg())


def test_dp_noise_wrapper_over_fedavgm_keeps_the_zeros_in_fedavgm_cache():
    """Below a DP wrapper the cache holds the pre-noise aggregate: the mask's positions are zeroed there."""
    inner = FedAvgM(server_momentum=0.9)
    strategy = LIPS(DifferentialPrivacyServerSideFixedClipping(inner, 0.5, 100.0, 3),
                    num_rounds=NUM_ROUNDS)
    masked = run_rounds(strategy, num_rounds=1)[0][1]
    cache = to_numpy(inner.current_arrays)
    for name in MIDDLE:
        zeros = masked[name] == 0
        assert zeros.sum() > 0
        assert np.all(cache[name][zeros] == 0), name
        assert np.count_nonzero(cache[name][~zeros]) > 0.9 * (~zeros).sum()  # not replaced


def test_layers_follow_the_global_models_order_not_the_first_reply():
    strategy = LIPS(FedAvg(), num_rounds=NUM_ROUNDS)
    model = tiny_model()
    list(strategy.configure_train(1, to_record(model), ConfigRecord(), grid()))
    trained = client_models(model, 2, seed=1)
    reversed_first = dict(reversed(list(trained[0].items())))
    new, metrics = strategy.aggregate_train(1, [reply(reversed_first, 10), reply(trained[1], 10)])
    assert sorted(k for k in metrics if k.startswith("lips-zeros/")) == [f"lips-zeros/{n}" for n in MIDDLE]
    assert list(new.keys()) == list(model)


def test_the_wrapped_strategys_attributes_are_reached_through_strategy():
    strategy = LIPS(FedAvg(fraction_train=0.3), num_rounds=3)
    assert strategy.strategy.fraction_train == 0.3
    with pytest.raises(AttributeError, match=r"the wrapped FedAvg has it: \.strategy\.fraction_train"):
        strategy.fraction_train  # noqa: B018  (delegation is explicit: no attribute falls through)
    with pytest.raises(AttributeError):
        strategy.no_such_attribute  # noqa: B018


def test_tau0_zero_has_no_mask_rounds():
    history = run_rounds(LIPS(FedAvg(), num_rounds=NUM_ROUNDS, tau0=0.0), num_rounds=6)
    assert all(m["lips-mask-round"] == 0 and m["lips-zeros"] == 0 for _, _, m in history)


def test_client_mode_without_client_side_is_reported(caplog):
    strategy = LIPS(FedAvg(), num_rounds=NUM_ROUNDS, mode="client")
    with caplog.at_level(logging.WARNING):
        run_rounds(strategy, num_rounds=1)
    assert "client mode needs lips_mod" in caplog.text


def test_unknown_layer_names_fail_before_training():
    strategy = LIPS(FedAvg(), num_rounds=3, layers=["conv9.*"])
    with pytest.raises(ValueError, match="'conv9.\\*' matches no eligible tensor"):
        strategy.configure_train(1, to_record(tiny_model()), ConfigRecord(), grid())


def test_zero_dimensional_arrays_keep_their_shape_through_the_cache_sync(caplog):
    """``num_batches_tracked`` is 0-d: rebuilding FedAvgM's cache must not make it (1,).

    Clients send the model's own shapes; a (1,) global would no longer fit them.
    """
    strategy = LIPS(FedAvgM(server_momentum=0.9), num_rounds=NUM_ROUNDS, every=1)
    model = tiny_model()
    assert model["bn1.num_batches_tracked"].shape == ()
    arrays = to_record(model)
    for rnd in (1, 2, 3):
        list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid()))
        sent = {k: v.reshape(model[k].shape) for k, v in to_numpy(arrays).items()}
        with caplog.at_level(logging.WARNING):
            arrays, metrics = strategy.aggregate_train(
                rnd, [reply(m, n) for m, n in zip(client_models(sent, 3, seed=rnd), EXAMPLES)])
        assert "ignoring reply" not in caplog.text
        assert metrics["lips-mask-round"] == 1
        assert arrays["bn1.num_batches_tracked"].numpy().shape == ()
        assert to_numpy(strategy.strategy.current_arrays)["bn1.num_batches_tracked"].shape == ()


def test_inertia_metrics_per_round_and_layer():
    history = run_rounds(LIPS(FedAvg(), num_rounds=NUM_ROUNDS, inertia_t0=2), num_rounds=4)
    layers = ["conv1.weight", *MIDDLE, "fc.weight"]
    # Round 1: no earlier aggregate to compare; only the relative step from the initial model.
    assert not any(k.startswith("inertia-") and not k.startswith("inertia-rel-step/") for k in history[0][2])
    assert sorted(k for k in history[0][2] if k.startswith("inertia-rel-step/")) == sorted(
        f"inertia-rel-step/{n}" for n in layers)
    m3 = history[2][2]
    assert sorted(k for k in m3 if k.startswith("inertia-cos-t0/")) == sorted(
        f"inertia-cos-t0/{n}" for n in layers)
    after2, after3 = history[1][1], history[2][1]
    cos = float((after3["fc.weight"] * after2["fc.weight"]).sum()
                / (np.linalg.norm(after3["fc.weight"]) * np.linalg.norm(after2["fc.weight"])))
    assert m3["inertia-cos-t0/fc.weight"] == pytest.approx(cos, rel=1e-5)
    assert m3["inertia-step/fc.weight"] == pytest.approx(
        np.linalg.norm((after3["fc.weight"] - after2["fc.weight"]).astype(np.float64)), rel=1e-5)
    assert all(0.0 < history[3][2][f"inertia-cos-prev/{n}"] <= 1.0 + 1e-9 for n in layers)
