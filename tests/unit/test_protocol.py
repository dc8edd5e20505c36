"""lips_flwr.protocol: the lips-* keys of a train config, built and parsed (moved from test_local.py)."""

from __future__ import annotations


import pytest

from core_models import small_net  # noqa: F401 (fixture)

from lips_flwr.core.lips import LIPSCore
from lips_flwr.protocol import ClientRoundConfig, train_config
from lips_flwr.protocol import parse_train_config as parse_round_config

MIDDLE = ["conv2.weight", "shortcut.weight"]


# --------------------------------------------------------------------------- parse_round_config
def test_parse_none_without_round():
    assert parse_round_config({}) is None
    assert parse_round_config({"lr": 0.1, "lips-tau": 0.5}) is None


def test_parse_server_mode_minimal():
    cfg = parse_round_config({"lips-round": 3, "lips-mode": "server"})
    assert cfg == ClientRoundConfig(server_round=3, mode="server")
    assert not cfg.masks
    assert cfg.tau == 0.0 and cfg.layers == ()


def test_parse_client_mode_full():
    cfg = parse_round_config(
        {
            "lips-round": 6,
            "lips-mode": "client",
            "lips-tau": 0.25,
            "lips-score": "random",
            "lips-seed": 5,
            "lips-layers": "[7, 13]",
            "other": "ignored",
        }
    )
    assert cfg == ClientRoundConfig(6, "client", 0.25, "random", 5, (7, 13))
    assert cfg.masks


def client_config(core, server_round, model):
    return train_config(server_round, core.mode, None, **core.client_plan(server_round, model))


def test_parse_round_trip_with_core(small_net):
    sp = LIPSCore(num_rounds=10, mode="client", score="magnitude", seed=2)
    cfg = parse_round_config(client_config(sp, 1, small_net))
    assert cfg.masks
    assert cfg.server_round == 1 and cfg.tau == 0.5 and cfg.score == "magnitude" and cfg.seed == 2
    assert [list(small_net)[i] for i in cfg.layers] == MIDDLE
    non_mask = parse_round_config(client_config(sp, 2, small_net))
    assert not non_mask.masks


def test_masks_property():
    assert ClientRoundConfig(1, "client", 0.1).masks
    assert not ClientRoundConfig(1, "client", 0.0).masks
    assert not ClientRoundConfig(1, "server", 0.5).masks


@pytest.mark.parametrize(
    "config",
    [
        {"lips-round": "abc"},
        {"lips-round": None},
        {"lips-round": 1, "lips-tau": "lots"},
        {"lips-round": 1, "lips-seed": "x"},
        {"lips-round": 1, "lips-layers": "[1, 2"},  # bad JSON
        {"lips-round": 1, "lips-layers": "not json"},
        {"lips-round": 1, "lips-layers": "[\"a\"]"},
        {"lips-round": 1, "lips-layers": "5"},  # not a list
        {"lips-round": 1, "lips-layers": "[null]"},
    ],
)
def test_parse_malformed_raises(config):
    with pytest.raises(ValueError, match="malformed"):
        parse_round_config(config)


@pytest.mark.parametrize("tau", [1.0, 1.5, -0.1, float("nan"), float("inf")])
def test_parse_rejects_a_tau_outside_zero_to_one(tau):
    """The server requires tau0 < 1; a client must not accept what no LIPS server sends."""
    with pytest.raises(ValueError, match="lips-tau"):
        parse_round_config({"lips-round": 1, "lips-mode": "client", "lips-tau": tau})


@pytest.mark.parametrize("tau", [0.0, 0.5, 0.999])
def test_parse_accepts_a_tau_in_zero_to_one(tau):
    assert parse_round_config({"lips-round": 1, "lips-mode": "client", "lips-tau": tau}).tau == tau


