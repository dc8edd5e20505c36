"""Unit tests for lips_flwr.core.lips.LIPSCore: its settings and the one call per round."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core_models import small_net  # noqa: F401 (fixture)

from lips_flwr.core.layers import select_layers
from lips_flwr.core.masking import num_zeros
from lips_flwr.core.checks import arrays_mismatch
from lips_flwr.core.lips import MODES, LIPSCore
from lips_flwr.core.lips import OPTIONS as LIPS_OPTIONS
from lips_flwr.protocol import (
    KEY_LAYERS,
    KEY_MODE,
    KEY_ROUND,
    KEY_SCORE,
    KEY_SEED,
    KEY_TAU,
    train_config,
)

MIDDLE = ["conv2.weight", "shortcut.weight"]


def after_aggregation(core, server_round, aggregate, previous):
    """``(model to broadcast or None, metrics)`` of the core's one call for a round."""
    outcome = core.round(server_round, aggregate, previous)
    return outcome.model, outcome.metrics


def client_config(core, server_round, model):
    """The ``lips-*`` train config keys the adapters send for this round (no run key)."""
    return train_config(server_round, core.mode, None, **core.client_plan(server_round, model))


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
        "inertia_t0", "mask_last_round",
    }


def test_defaults():
    sp = LIPSCore()
    assert (sp.tau0, sp.every, sp.start_round, sp.decay) == (0.5, 5, 1, "linear")
    assert (sp.score, sp.layers, sp.mode, sp.seed) == ("sensitivity", "middle", "server", 0)
    assert sp.num_rounds is None


# --------------------------------------------------------------------------- round
def test_the_final_round_masks_only_with_mask_last_round(small_net):
    """Server mode: round num_rounds is no mask round by default (issue 35); the option restores it,
    and a checkpoint's settings name it only when set (old checkpoints resume as before)."""
    aggregate = perturbed(small_net)
    spared = LIPSCore(num_rounds=6, every=5).round(6, aggregate, small_net)
    assert spared.model is None and spared.metrics["lips-mask-round"] == 0
    assert spared.metrics["lips-tau"] == 0.0 and spared.metrics["lips-zeros"] == 0
    told = LIPSCore(num_rounds=6, every=5, mask_last_round=True)
    outcome = told.round(6, aggregate, small_net)
    assert outcome.model is not None and outcome.metrics["lips-zeros"] > 0
    assert told.settings()["mask_last_round"] is True
    assert "mask_last_round" not in LIPSCore(num_rounds=6).settings()
    assert LIPSCore(num_rounds=6, every=5, mode="client").schedule.mask_rounds() == [1, 6]
    with pytest.raises(ValueError, match="mask_last_round"):
        LIPSCore(mask_last_round=1)


def test_after_aggregation_masks_only_on_mask_rounds(small_net):
    T = 12
    sp = LIPSCore(num_rounds=T, tau0=0.5, every=5)
    previous = small_net
    aggregate = perturbed(small_net)
    for server_round in range(1, T + 1):
        masked, metrics = after_aggregation(sp, server_round, aggregate, previous)
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
    sp = LIPSCore(num_rounds=10, tau0=0.7, every=5, score="magnitude")
    aggregate = perturbed(small_net)
    copies = {k: v.copy() for k, v in aggregate.items()}
    masked, metrics = after_aggregation(sp, 6, aggregate, small_net)
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
    sp = LIPSCore(num_rounds=10, tau0=0.5, score="sensitivity")
    aggregate = perturbed(small_net, scale=0.1)
    masked, metrics = after_aggregation(sp, 1, aggregate, small_net)
    for name in MIDDLE:
        # dw in float32 as the core computes it; the float64 product of float32
        # values is exact, rounded once to float32 like the core's product
        dw = (aggregate[name] - small_net[name]).astype(np.float64)
        scores = np.abs(dw * aggregate[name].astype(np.float64)).astype(np.float32).reshape(-1)
        k = metrics[f"lips-zeros/{name}"]
        expected = set(np.argsort(scores, kind="stable")[:k].tolist())
        assert set(np.flatnonzero(masked[name].reshape(-1) == 0).tolist()) == expected


def test_after_aggregation_sensitivity_needs_previous(small_net):
    sp = LIPSCore(num_rounds=10, score="sensitivity")
    with pytest.raises(RuntimeError, match="previous"):
        after_aggregation(sp, 1, small_net, None)
    # not a mask round: nothing needed
    masked, _ = after_aggregation(sp, 2, small_net, None)
    assert masked is None


@pytest.mark.parametrize("score", ["magnitude", "random"])
def test_after_aggregation_other_scores_need_no_previous(small_net, score):
    sp = LIPSCore(num_rounds=10, score=score, seed=3)
    masked, metrics = after_aggregation(sp, 1, small_net, None)
    assert masked is not None
    assert metrics["lips-layers-masked"] == 2


def test_after_aggregation_random_reproducible_per_round(small_net):
    a = LIPSCore(num_rounds=20, score="random", seed=4, every=1)
    b = LIPSCore(num_rounds=20, score="random", seed=4, every=1)
    m1, _ = after_aggregation(a, 3, small_net, None)
    after_aggregation(a, 2, small_net, None)  # history does not matter
    m2, _ = after_aggregation(b, 3, small_net, None)
    m3, _ = after_aggregation(a, 3, small_net, None)
    m4, _ = after_aggregation(a, 4, small_net, None)
    for name in MIDDLE:
        np.testing.assert_array_equal(m1[name], m2[name])
        np.testing.assert_array_equal(m1[name], m3[name])
    assert any(not np.array_equal(m1[n] == 0, m4[n] == 0) for n in MIDDLE)


def test_after_aggregation_tau0_zero_returns_none(small_net):
    sp = LIPSCore(num_rounds=10, tau0=0.0, every=1)
    for server_round in range(1, 11):
        masked, metrics = after_aggregation(sp, server_round, small_net, small_net)
        assert masked is None
        assert metrics["lips-tau"] == 0.0
        assert metrics["lips-zeros"] == 0
        assert metrics["lips-layers-masked"] == 0


def test_after_aggregation_client_mode_returns_none(small_net):
    sp = LIPSCore(num_rounds=10, tau0=0.5, mode="client")
    masked, metrics = after_aggregation(sp, 1, small_net, small_net)
    assert masked is None
    assert metrics["lips-mask-round"] == 1  # scheduled with tau > 0: clients mask
    assert metrics["lips-tau"] == 0.5
    assert metrics["lips-zeros"] == 0
    assert metrics["lips-layers-masked"] == 0
    assert sp.round(1, small_net, small_net).masks == {}


def test_masks_the_aggregate_only_on_server_mask_rounds(small_net):
    sp = LIPSCore(num_rounds=10, every=5)
    assert [r for r in range(1, 11) if sp.round(r, small_net, small_net).model is not None] == [1, 6]


@pytest.mark.parametrize("layers", ["all", "reference", ["conv*"], (lambda n, a: n == "fc.weight")])
def test_after_aggregation_respects_layers(small_net, layers):
    sp = LIPSCore(num_rounds=10, score="magnitude", layers=layers)
    masked, metrics = after_aggregation(sp, 1, small_net, None)
    chosen = select_layers(small_net, layers)
    assert metrics["lips-layers-masked"] == len(chosen)
    assert {k[len("lips-zeros/"):] for k in metrics if k.startswith("lips-zeros/")} == set(chosen)
    for name in small_net:
        if name not in chosen:
            assert masked[name] is small_net[name]


def test_layer_names_cache_follows_model_signature(small_net):
    sp = LIPSCore(num_rounds=10)
    assert sp.layer_names(small_net) == MIDDLE
    assert sp.layer_names(dict(small_net)) == MIDDLE
    other = {"a": np.ones((2, 2)), "b": np.ones((3, 3)), "c": np.ones((4, 4))}
    assert sp.layer_names(other) == ["b"]
    changed = dict(small_net)
    changed["extra.weight"] = np.ones((3, 3), np.float32)
    assert sp.layer_names(changed) == ["conv2.weight", "shortcut.weight", "fc.weight"]


# --------------------------------------------------------------------------- client_config
def test_client_config_server_mode(small_net):
    sp = LIPSCore(num_rounds=10, mode="server")
    for server_round in (1, 2, 6):
        assert client_config(sp, server_round, small_net) == {
            "lips-round": server_round,
            "lips-mode": "server",
        }


def test_client_config_server_mode_without_num_rounds(small_net):
    sp = LIPSCore(mode="server")
    assert client_config(sp, 1, small_net) == {"lips-round": 1, "lips-mode": "server"}


def test_client_config_client_mode_mask_round(small_net):
    sp = LIPSCore(num_rounds=10, tau0=0.6, mode="client", score="random", seed=9)
    config = client_config(sp, 6, small_net)
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
    sp = LIPSCore(num_rounds=10, mode="client")
    config = client_config(sp, 2, small_net)
    assert config == {"lips-round": 2, "lips-mode": "client", "lips-tau": 0.0}


def test_client_config_client_mode_needs_num_rounds(small_net):
    sp = LIPSCore(mode="client")
    with pytest.raises(ValueError, match="num_rounds"):
        client_config(sp, 1, small_net)
    sp.set_num_rounds(10)
    assert client_config(sp, 1, small_net)["lips-tau"] == 0.5


# --------------------------------------------------------------------------- schedule property
def test_schedule_without_num_rounds_raises_clear_error(small_net):
    sp = LIPSCore()
    with pytest.raises(ValueError, match="num_rounds"):
        sp.schedule
    with pytest.raises(ValueError, match="num_rounds"):
        after_aggregation(sp, 1, small_net, small_net)


def test_set_num_rounds():
    sp = LIPSCore(tau0=0.4, every=3, start_round=2, decay="cosine")
    sp.set_num_rounds(30)
    assert sp.num_rounds == 30
    sched = sp.schedule
    assert (sched.num_rounds, sched.tau0, sched.every, sched.start_round, sched.decay) == (
        30, 0.4, 3, 2, "cosine",
    )
    with pytest.raises(ValueError, match="num_rounds"):
        sp.set_num_rounds(0)


def test_describe():
    sp = LIPSCore(num_rounds=100, layers=lambda n, a: True)
    described = dict(sp.describe())
    assert described["Mode"] == "server"
    assert described["Layers"] == "custom predicate"
    assert "20 rounds" in described["Mask rounds"]
    assert dict(LIPSCore().describe())["Mask rounds"] == "after start()"
    # (was [1, 6]: the defect of issue 35, the final round freshly masked)
    assert dict(LIPSCore(num_rounds=6).describe())["Mask rounds"] == [1]
    assert dict(LIPSCore(num_rounds=6, mask_last_round=True).describe())["Mask rounds"] == [1, 6]


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
        LIPSCore(**kwargs)


def test_constructor_validates_without_num_rounds():
    # schedule arguments are checked even when num_rounds comes later
    with pytest.raises(ValueError, match="every"):
        LIPSCore(every=0)
    with pytest.raises(ValueError, match="tau0"):
        LIPSCore(tau0=2.0)


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


def test_masks_are_the_zeros_of_the_masked_layers_read_when_asked(small_net):
    """outcome.masks: one boolean array per masked layer, True where the broadcast model is 0 (its
    earlier zeros included); computed on first read, the same array on the next."""
    core = LIPSCore(num_rounds=10, every=5, score="magnitude")
    aggregate = perturbed(small_net)
    aggregate[MIDDLE[0]].reshape(-1)[:3] = 0.0  # zeros before the mask: also True
    outcome = core.round(1, aggregate, small_net)
    assert list(outcome.masks) == list(MIDDLE) and len(outcome.masks) == len(MIDDLE)
    assert dict(outcome.masks).keys() == set(MIDDLE)
    for name in MIDDLE:
        mask = outcome.masks[name]
        assert mask.dtype == bool and mask.shape == aggregate[name].shape
        np.testing.assert_array_equal(mask, outcome.model[name] == 0)
        assert outcome.masks[name] is mask
    assert outcome.masks[MIDDLE[0]].reshape(-1)[:3].all()
    assert MIDDLE[0] in outcome.masks and "no such layer" not in outcome.masks
    with pytest.raises(KeyError):
        outcome.masks[next(n for n in aggregate if n not in MIDDLE)]


# --------------------------------------------------------------------------- inertia
def test_inertia_sees_the_unmasked_aggregate(small_net):
    """The diagnostics follow the aggregates, not the masked models; the mask's change is apart."""
    core = LIPSCore(num_rounds=10, every=5, inertia_t0=1)
    first = perturbed(small_net, seed=1, scale=0.1)
    outcome = core.round(1, first, small_net)  # a mask round
    assert outcome.model is not None
    for name in MIDDLE:
        removed = np.where(outcome.masks[name], first[name], 0).astype(np.float64)
        expected = np.linalg.norm(removed) / np.linalg.norm(first[name].astype(np.float64))
        assert outcome.metrics[f"lips-mask-change/{name}"] == pytest.approx(expected, rel=1e-6)
        assert 0.0 < expected < 1.0
    second = perturbed(first, seed=2, scale=0.1)
    metrics = core.round(2, second, outcome.model).metrics  # no mask round
    assert not any(k.startswith("lips-mask-change/") for k in metrics)
    for name in MIDDLE:
        a, b = second[name].astype(np.float64).ravel(), first[name].astype(np.float64).ravel()
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert metrics[f"inertia-cos-t0/{name}"] == pytest.approx(cos, rel=1e-9)
        assert metrics[f"inertia-step/{name}"] == pytest.approx(np.linalg.norm(a - b), rel=1e-6)
        masked = outcome.model[name].astype(np.float64).ravel()
        assert abs(float(a @ masked / (np.linalg.norm(a) * np.linalg.norm(masked))) - cos) > 1e-3


def test_no_inertia_metrics_without_inertia_t0(small_net):
    outcome = LIPSCore(num_rounds=10).round(1, perturbed(small_net), small_net)
    assert not any(k.startswith(("inertia-", "lips-mask-change/")) for k in outcome.metrics)


@pytest.mark.parametrize("t0", [0, -1, 1.5, True, "2"])
def test_inertia_t0_errors_name_the_argument(t0):
    with pytest.raises(ValueError, match="`inertia_t0` must be None or an integer >= 1"):
        LIPSCore(num_rounds=10, inertia_t0=t0)


def test_inertia_t0_beyond_num_rounds_is_refused():
    with pytest.raises(ValueError, match="`inertia_t0` must be <= num_rounds=5, got 6"):
        LIPSCore(num_rounds=5, inertia_t0=6)
    later = LIPSCore(inertia_t0=6)  # T comes with start(): checked then
    with pytest.raises(ValueError, match="`inertia_t0` must be <= num_rounds=5"):
        later.set_num_rounds(5)
    LIPSCore(num_rounds=6, inertia_t0=6)  # the last round is a valid reference
