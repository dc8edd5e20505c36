"""Unit tests for lips_flwr.sparsifier.TransientSparsifier (spec sections 2-5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core_models import small_net  # noqa: F401 (fixture)

from lips_flwr.layers import select_layers
from lips_flwr.masking import num_zeros
from lips_flwr.sparsifier import (
    KEY_LAYERS,
    KEY_MODE,
    KEY_ROUND,
    KEY_SCORE,
    KEY_SEED,
    KEY_TAU,
    LIPS_OPTIONS,
    MODES,
    TransientSparsifier,
    arrays_mismatch,
)

MIDDLE = ["conv2.weight", "shortcut.weight"]


def perturbed(model: dict[str, np.ndarray], seed: int = 1, scale: float = 0.01) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, array in model.items():
        if np.issubdtype(array.dtype, np.floating):
            out[name] = (array + scale * rng.normal(size=array.shape)).astype(array.dtype)
        else:
            out[name] = array + 1
    return out


def test_key_names():
    assert (KEY_ROUND, KEY_MODE, KEY_TAU, KEY_SCORE, KEY_SEED, KEY_LAYERS) == (
        "lips-round", "lips-mode", "lips-tau", "lips-score", "lips-seed", "lips-layers",
    )
    assert MODES == ("server", "client")
    assert set(LIPS_OPTIONS) == {
        "num_rounds", "tau0", "every", "start_round", "decay", "score", "layers", "mode", "seed",
        "inertia_t0",
    }


def test_defaults():
    sp = TransientSparsifier()
    assert (sp.tau0, sp.every, sp.start_round, sp.decay) == (0.5, 5, 1, "linear")
    assert (sp.score, sp.layers, sp.mode, sp.seed) == ("sensitivity", "middle", "server", 0)
    assert sp.num_rounds is None


# --------------------------------------------------------------------------- after_aggregation
def test_after_aggregation_masks_only_on_mask_rounds(small_net):
    T = 12
    sp = TransientSparsifier(num_rounds=T, tau0=0.5, every=5)
    previous = small_net
    aggregate = perturbed(small_net)
    for server_round in range(1, T + 1):
        masked, metrics = sp.after_aggregation(server_round, aggregate, previous)
        if server_round in (1, 6, 11):
            assert masked is not None
            assert metrics["lips-mask-round"] == 1
            tau = 0.5 * (1 - (server_round - 1) / T)
            assert metrics["lips-tau"] == pytest.approx(tau)
        else:
            assert masked is None
            assert metrics["lips-mask-round"] == 0
            assert metrics["lips-tau"] == 0.0
            assert metrics["lips-zeros"] == 0
            assert metrics["lips-layers-masked"] == 0
            assert not any(k.startswith("lips-zeros/") for k in metrics)


def test_after_aggregation_metrics_and_masked_model(small_net):
    sp = TransientSparsifier(num_rounds=10, tau0=0.7, every=5, score="magnitude")
    aggregate = perturbed(small_net)
    copies = {k: v.copy() for k, v in aggregate.items()}
    masked, metrics = sp.after_aggregation(6, aggregate, small_net)
    tau = 0.7 * (1 - 5 / 10)
    assert metrics["lips-tau"] == pytest.approx(tau)
    expected = {n: num_zeros(aggregate[n].size, tau) for n in MIDDLE}
    expected_ceil = {n: int(np.ceil(aggregate[n].size * 0.35 - 1e-9)) for n in MIDDLE}
    assert expected == expected_ceil
    for name in MIDDLE:
        assert metrics[f"lips-zeros/{name}"] == expected[name]
        assert int((masked[name] == 0).sum()) == expected[name]
    assert metrics["lips-zeros"] == sum(expected.values())
    assert metrics["lips-layers-masked"] == 2
    assert metrics["lips-mask-round"] == 1
    assert metrics["lips-seconds"] >= 0.0
    assert {k for k in metrics if k.startswith("lips-zeros/")} == {f"lips-zeros/{n}" for n in MIDDLE}
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    # non-middle tensors untouched (same objects), key order kept, input not mutated
    assert list(masked) == list(aggregate)
    for name in aggregate:
        if name not in MIDDLE:
            assert masked[name] is aggregate[name]
        np.testing.assert_array_equal(aggregate[name], copies[name])


def test_after_aggregation_sensitivity_uses_aggregate_update(small_net):
    sp = TransientSparsifier(num_rounds=10, tau0=0.5, score="sensitivity")
    aggregate = perturbed(small_net, scale=0.1)
    masked, metrics = sp.after_aggregation(1, aggregate, small_net)
    for name in MIDDLE:
        # dw in float32 as the core computes it; the float64 product of float32
        # values is exact, rounded once to float32 like the core's product
        dw = (aggregate[name] - small_net[name]).astype(np.float64)
        scores = np.abs(dw * aggregate[name].astype(np.float64)).astype(np.float32).reshape(-1)
        k = metrics[f"lips-zeros/{name}"]
        expected = set(np.argsort(scores, kind="stable")[:k].tolist())
        assert set(np.flatnonzero(masked[name].reshape(-1) == 0).tolist()) == expected


def test_after_aggregation_sensitivity_needs_previous(small_net):
    sp = TransientSparsifier(num_rounds=10, score="sensitivity")
    with pytest.raises(RuntimeError, match="previous"):
        sp.after_aggregation(1, small_net, None)
    # not a mask round: nothing needed
    masked, _ = sp.after_aggregation(2, small_net, None)
    assert masked is None


@pytest.mark.parametrize("score", ["magnitude", "random"])
def test_after_aggregation_other_scores_need_no_previous(small_net, score):
    sp = TransientSparsifier(num_rounds=10, score=score, seed=3)
    masked, metrics = sp.after_aggregation(1, small_net, None)
    assert masked is not None
    assert metrics["lips-layers-masked"] == 2


def test_after_aggregation_random_reproducible_per_round(small_net):
    a = TransientSparsifier(num_rounds=20, score="random", seed=4, every=1)
    b = TransientSparsifier(num_rounds=20, score="random", seed=4, every=1)
    m1, _ = a.after_aggregation(3, small_net, None)
    a.after_aggregation(2, small_net, None)  # history does not matter
    m2, _ = b.after_aggregation(3, small_net, None)
    m3, _ = a.after_aggregation(3, small_net, None)
    m4, _ = a.after_aggregation(4, small_net, None)
    for name in MIDDLE:
        np.testing.assert_array_equal(m1[name], m2[name])
        np.testing.assert_array_equal(m1[name], m3[name])
    assert any(not np.array_equal(m1[n] == 0, m4[n] == 0) for n in MIDDLE)


def test_after_aggregation_tau0_zero_returns_none(small_net):
    sp = TransientSparsifier(num_rounds=10, tau0=0.0, every=1)
    for server_round in range(1, 11):
        masked, metrics = sp.after_aggregation(server_round, small_net, small_net)
        assert masked is None
        assert metrics["lips-tau"] == 0.0
        assert metrics["lips-zeros"] == 0
        assert metrics["lips-layers-masked"] == 0


def test_after_aggregation_client_mode_returns_none(small_net):
    sp = TransientSparsifier(num_rounds=10, tau0=0.5, mode="client")
    masked, metrics = sp.after_aggregation(1, small_net, small_net)
    assert masked is None
    assert metrics["lips-mask-round"] == 1  # scheduled with tau > 0: clients mask
    assert metrics["lips-tau"] == 0.5
    assert metrics["lips-zeros"] == 0
    assert metrics["lips-layers-masked"] == 0
    assert not sp.masks_aggregate(1)


def test_masks_aggregate(small_net):
    sp = TransientSparsifier(num_rounds=10, every=5)
    assert [r for r in range(1, 11) if sp.masks_aggregate(r)] == [1, 6]


@pytest.mark.parametrize("layers", ["all", "reference", ["conv*"], (lambda n, a: n == "fc.weight")])
def test_after_aggregation_respects_layers(small_net, layers):
    sp = TransientSparsifier(num_rounds=10, score="magnitude", layers=layers)
    masked, metrics = sp.after_aggregation(1, small_net, None)
    chosen = select_layers(small_net, layers)
    assert metrics["lips-layers-masked"] == len(chosen)
    assert {k[len("lips-zeros/"):] for k in metrics if k.startswith("lips-zeros/")} == set(chosen)
    for name in small_net:
        if name not in chosen:
            assert masked[name] is small_net[name]


def test_layer_names_cache_follows_model_signature(small_net):
    sp = TransientSparsifier(num_rounds=10)
    assert sp.layer_names(small_net) == MIDDLE
    assert sp.layer_names(dict(small_net)) == MIDDLE
    other = {"a": np.ones((2, 2)), "b": np.ones((3, 3)), "c": np.ones((4, 4))}
    assert sp.layer_names(other) == ["b"]
    changed = dict(small_net)
    changed["extra.weight"] = np.ones((3, 3), np.float32)
    assert sp.layer_names(changed) == ["conv2.weight", "shortcut.weight", "fc.weight"]


# --------------------------------------------------------------------------- client_config
def test_client_config_server_mode(small_net):
    sp = TransientSparsifier(num_rounds=10, mode="server")
    for server_round in (1, 2, 6):
        assert sp.client_config(server_round, small_net) == {
            "lips-round": server_round,
            "lips-mode": "server",
        }


def test_client_config_server_mode_without_num_rounds(small_net):
    sp = TransientSparsifier(mode="server")
    assert sp.client_config(1, small_net) == {"lips-round": 1, "lips-mode": "server"}


def test_client_config_client_mode_mask_round(small_net):
    sp = TransientSparsifier(num_rounds=10, tau0=0.6, mode="client", score="random", seed=9)
    config = sp.client_config(6, small_net)
    assert set(config) == {"lips-round", "lips-mode", "lips-tau", "lips-layers", "lips-score", "lips-seed"}
    assert config["lips-round"] == 6
    assert config["lips-mode"] == "client"
    assert config["lips-tau"] == pytest.approx(0.6 * (1 - 5 / 10))
    assert config["lips-score"] == "random"
    assert config["lips-seed"] == 9
    assert isinstance(config["lips-layers"], str)
    positions = json.loads(config["lips-layers"])
    names = list(small_net)
    assert positions == [names.index(n) for n in MIDDLE]
    assert [names[i] for i in positions] == MIDDLE
    # every value is a plain type a Flower ConfigRecord accepts
    assert all(type(v) in (int, float, str) for v in config.values())


def test_client_config_client_mode_non_mask_round(small_net):
    sp = TransientSparsifier(num_rounds=10, mode="client")
    config = sp.client_config(2, small_net)
    assert config == {"lips-round": 2, "lips-mode": "client", "lips-tau": 0.0}


def test_client_config_client_mode_needs_num_rounds(small_net):
    sp = TransientSparsifier(mode="client")
    with pytest.raises(ValueError, match="num_rounds"):
        sp.client_config(1, small_net)
    sp.set_num_rounds(10)
    assert sp.client_config(1, small_net)["lips-tau"] == 0.5


# --------------------------------------------------------------------------- schedule property
def test_schedule_without_num_rounds_raises_clear_error(small_net):
    sp = TransientSparsifier()
    with pytest.raises(ValueError, match="num_rounds"):
        sp.schedule
    with pytest.raises(ValueError, match="num_rounds"):
        sp.after_aggregation(1, small_net, small_net)


def test_set_num_rounds():
    sp = TransientSparsifier(tau0=0.4, every=3, start_round=2, decay="cosine")
    sp.set_num_rounds(30)
    assert sp.num_rounds == 30
    sched = sp.schedule
    assert (sched.num_rounds, sched.tau0, sched.every, sched.start_round, sched.decay) == (
        30, 0.4, 3, 2, "cosine",
    )
    with pytest.raises(ValueError, match="num_rounds"):
        sp.set_num_rounds(0)


def test_describe():
    sp = TransientSparsifier(num_rounds=100, layers=lambda n, a: True)
    described = dict(sp.describe())
    assert described["Mode"] == "server"
    assert described["Layers"] == "custom predicate"
    assert "20 rounds" in described["Mask rounds"]
    assert dict(TransientSparsifier().describe())["Mask rounds"] == "after start()"
    assert dict(TransientSparsifier(num_rounds=6).describe())["Mask rounds"] == [1, 6]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs,word",
    [
        ({"mode": "both"}, "mode"),
        ({"mode": None}, "mode"),
        ({"score": "taylor"}, "score"),
        ({"score": None}, "score"),
        ({"layers": "middel"}, "layers"),
        ({"layers": []}, "layers"),
        ({"layers": 3}, "layers"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": "0"}, "seed"),
        ({"tau0": 1.0}, "tau0"),
        ({"tau0": -0.1}, "tau0"),
        ({"tau0": float("nan")}, "tau0"),
        ({"every": 0}, "every"),
        ({"start_round": 0}, "start_round"),
        ({"decay": "exp"}, "decay"),
        ({"num_rounds": 0}, "num_rounds"),
        ({"num_rounds": 2.5}, "num_rounds"),
    ],
)
def test_constructor_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TransientSparsifier(**kwargs)


def test_constructor_validates_without_num_rounds():
    # schedule arguments are checked even when num_rounds comes later
    with pytest.raises(ValueError, match="every"):
        TransientSparsifier(every=0)
    with pytest.raises(ValueError, match="tau0"):
        TransientSparsifier(tau0=2.0)


# --------------------------------------------------------------------------- arrays_mismatch
def test_arrays_mismatch_none_when_matching():
    expected = {"a": (2, 3), "b": (4,), "c": ()}
    assert arrays_mismatch(expected, {"a": (2, 3), "b": (4,), "c": ()}) is None
    # order is not checked; lists and tuples compare equal
    assert arrays_mismatch(expected, {"c": (), "b": [4], "a": [2, 3]}) is None


def test_arrays_mismatch_missing():
    reason = arrays_mismatch({"a": (2,), "b": (3,)}, {"a": (2,)})
    assert reason is not None and "missing" in reason and "'b'" in reason


def test_arrays_mismatch_extra():
    reason = arrays_mismatch({"a": (2,)}, {"a": (2,), "z": (1,)})
    assert reason is not None and "unexpected" in reason and "'z'" in reason


def test_arrays_mismatch_missing_and_extra():
    reason = arrays_mismatch({"a": (2,)}, {"z": (2,)})
    assert "missing" in reason and "unexpected" in reason


def test_arrays_mismatch_shape():
    reason = arrays_mismatch({"a": (2, 3), "b": (4,)}, {"a": (2, 3), "b": (5,)})
    assert reason is not None
    assert "'b'" in reason and "(5,)" in reason and "(4,)" in reason
