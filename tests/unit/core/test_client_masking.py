"""lips_flwr.core.client_masking: a client's own mask from its last update (moved from test_local.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core_models import small_net  # noqa: F401 (fixture)

from lips_flwr.core.layers import candidate_names
from lips_flwr.core.client_masking import client_mask, local_update, local_update_norms
from lips_flwr.core.inertia import update_norms
from lips_flwr.core.masking import num_zeros
from lips_flwr.protocol import ClientRoundConfig
from lips_flwr.protocol import parse_train_config as parse_round_config

MIDDLE = ["conv2.weight", "shortcut.weight"]


def positions(model, names):
    order = list(model)
    return tuple(order.index(n) for n in names)


def zero_set(array):
    return set(np.flatnonzero(array.reshape(-1) == 0).tolist())


def lowest(scores, k):
    return set(np.argsort(scores.reshape(-1), kind="stable")[:k].tolist())


def trained_copy(model, seed=2, scale=0.05):
    rng = np.random.default_rng(seed)
    return {
        n: (a + scale * rng.normal(size=a.shape)).astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else a + 1
        for n, a in model.items()
    }


# --------------------------------------------------------------------------- local_update
def test_local_update_covers_only_candidates(small_net):
    trained = trained_copy(small_net)
    upd = local_update(small_net, trained)
    assert list(upd) == candidate_names(small_net)
    for name, delta in upd.items():
        np.testing.assert_allclose(delta, trained[name] - small_net[name], rtol=1e-6)
        assert delta.dtype == np.float32


def test_local_update_skips_missing_or_reshaped():
    received = {"a": np.zeros((2, 2), np.float16), "b": np.zeros((3, 3)), "c": np.zeros((2, 2)), "bias": np.zeros(2)}
    trained = {"a": np.ones((2, 2), np.float16), "b": np.ones((9,)), "bias": np.ones(2)}
    upd = local_update(received, trained)
    assert list(upd) == ["a"]
    assert upd["a"].dtype == np.float32


def test_local_update_norms_are_the_updates_norms_bit_for_bit_without_the_updates(small_net):
    rng = np.random.default_rng(6)
    large = {"big.weight": rng.normal(size=(256, 256, 3, 3)).astype(np.float32),  # beyond a block
             "wide.weight": rng.normal(size=(300, 500)),  # float64
             "half.weight": rng.normal(size=(400, 400)).astype(np.float16), "bias": np.zeros(3)}
    received_small = {**small_net, "odd.weight": np.zeros((2, 2))}
    for received in (small_net, received_small, large):
        trained = trained_copy(received, scale=1e-3)
        norms = local_update_norms(received, trained)
        assert norms == update_norms(local_update(received, trained))
        assert list(norms) == list(local_update(received, trained))
    received = {"a": np.zeros((2, 2), np.float16), "b": np.zeros((3, 3)), "c": np.zeros((2, 2)),
                "bias": np.zeros(2)}
    assert list(local_update_norms(received, {"a": np.ones((2, 2), np.float16), "b": np.ones((9,))})) == ["a"]


# --------------------------------------------------------------------------- client_mask
def client_cfg(model, server_round=6, tau=0.4, score="sensitivity", seed=0, names=MIDDLE):
    return ClientRoundConfig(server_round, "client", tau, score, seed, positions(model, names))


def test_client_mask_sensitivity_with_fresh_signal(small_net):
    rng = np.random.default_rng(0)
    signal = {n: rng.normal(size=small_net[n].shape).astype(np.float32) for n in candidate_names(small_net)}
    cfg = client_cfg(small_net, server_round=6)
    masked, zeros, score = client_mask(small_net, cfg, signal, signal_round=5)
    assert score == "sensitivity"
    for name in MIDDLE:
        k = num_zeros(small_net[name].size, 0.4)
        assert zeros[name] == k
        scores = np.abs(signal[name].astype(np.float64) * small_net[name].astype(np.float64)).astype(np.float32)
        assert zero_set(masked[name]) == lowest(scores, k)
    for name in small_net:
        if name not in MIDDLE:
            assert masked[name] is small_net[name]
    assert list(masked) == list(small_net)


@pytest.mark.parametrize("signal_round", [None, 4, 3, 6, 1])
def test_client_mask_stale_signal_falls_back_to_magnitude(small_net, signal_round):
    rng = np.random.default_rng(0)
    signal = {n: rng.normal(size=small_net[n].shape).astype(np.float32) for n in MIDDLE}
    cfg = client_cfg(small_net, server_round=6)
    masked, zeros, score = client_mask(small_net, cfg, signal, signal_round=signal_round)
    assert score == "magnitude"
    for name in MIDDLE:
        assert zero_set(masked[name]) == lowest(np.abs(small_net[name]), zeros[name])


def test_client_mask_missing_signal_falls_back_to_magnitude(small_net):
    cfg = client_cfg(small_net, server_round=1)
    masked, zeros, score = client_mask(small_net, cfg, None, None)
    assert score == "magnitude"
    for name in MIDDLE:
        assert zero_set(masked[name]) == lowest(np.abs(small_net[name]), zeros[name])


def test_client_mask_partial_signal_falls_back(small_net):
    signal = {"conv2.weight": np.ones_like(small_net["conv2.weight"])}  # shortcut missing
    masked, zeros, score = client_mask(small_net, client_cfg(small_net), signal, 5)
    assert score == "magnitude"


def test_client_mask_never_zeroes_whole_tensors(small_net):
    """Unlike the reference code, a client that skipped rounds keeps most of its model."""
    zero_signal = {n: np.zeros_like(small_net[n]) for n in MIDDLE}
    cases = [(None, None), (zero_signal, 2), (zero_signal, 5)]
    for signal, signal_round in cases:
        masked, zeros, _ = client_mask(small_net, client_cfg(small_net, tau=0.5), signal, signal_round)
        for name in MIDDLE:
            n = small_net[name].size
            assert zeros[name] == num_zeros(n, 0.5) < n
            assert int((masked[name] == 0).sum()) == zeros[name]
            assert np.count_nonzero(masked[name]) == n - zeros[name]
        for name in small_net:
            if name not in MIDDLE:
                assert masked[name] is small_net[name]


def test_client_mask_does_not_mutate(small_net):
    before = {k: v.copy() for k, v in small_net.items()}
    signal = {n: np.ones_like(small_net[n]) for n in MIDDLE}
    client_mask(small_net, client_cfg(small_net), signal, 5)
    for k in before:
        np.testing.assert_array_equal(small_net[k], before[k])


def test_client_mask_random_uses_seed_round_and_salt(small_net):
    cfg = client_cfg(small_net, score="random", seed=3)
    a, _, score = client_mask(small_net, cfg, None, None, salt=(1,))
    b, _, _ = client_mask(small_net, cfg, None, None, salt=(1,))
    c, _, _ = client_mask(small_net, cfg, None, None, salt=(2,))
    other_round = client_cfg(small_net, server_round=11, score="random", seed=3)
    d, _, _ = client_mask(small_net, other_round, None, None, salt=(1,))
    assert score == "random"  # random needs no signal: no fallback
    for name in MIDDLE:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(zero_set(a[n]) != zero_set(c[n]) for n in MIDDLE)
    assert any(zero_set(a[n]) != zero_set(d[n]) for n in MIDDLE)


def test_client_mask_magnitude_requested(small_net):
    signal = {n: np.ones_like(small_net[n]) for n in MIDDLE}
    _, _, score = client_mask(small_net, client_cfg(small_net, score="magnitude"), signal, 5)
    assert score == "magnitude"


def test_client_mask_tau_zero(small_net):
    cfg = ClientRoundConfig(2, "client", 0.0, "sensitivity", 0, positions(small_net, MIDDLE))
    masked, zeros, _ = client_mask(small_net, cfg, None, None)
    assert zeros == {}
    assert all(masked[k] is small_net[k] for k in small_net)


@pytest.mark.parametrize("bad", [(99,), (-1,), (1, 16)])
def test_client_mask_positions_out_of_range(small_net, bad):
    assert len(small_net) == 16
    cfg = ClientRoundConfig(1, "client", 0.5, "magnitude", 0, bad)
    with pytest.raises(ValueError, match="lips-layers"):
        client_mask(small_net, cfg, None, None)


def test_client_mask_positions_from_json(small_net):
    config = {
        "lips-round": 6, "lips-mode": "client", "lips-tau": 0.3,
        "lips-score": "magnitude", "lips-seed": 0,
        "lips-layers": json.dumps(list(positions(small_net, ["fc.weight"]))),
    }
    masked, zeros, _ = client_mask(small_net, parse_round_config(config), None, None)
    assert list(zeros) == ["fc.weight"]
    assert zeros["fc.weight"] == num_zeros(160, 0.3) == 48
