"""Unit tests for lips_flwr.core.schedule."""

from __future__ import annotations

import math

import pytest

from lips_flwr.core.schedule import DECAYS, MaskSchedule, validate_tau0


# --------------------------------------------------------------------------- mask rounds
@pytest.mark.parametrize("num_rounds", [1, 5, 6, 11, 30, 300])
def test_mask_rounds_every_5_are_1_6_11(num_rounds):
    sched = MaskSchedule(num_rounds=num_rounds, tau0=0.5, every=5)
    expected = [r for r in range(1, num_rounds + 1) if (r - 1) % 5 == 0]
    assert sched.mask_rounds() == expected
    assert sched.mask_rounds()[:3] == [1, 6, 11][: len(expected)]


def test_mask_rounds_match_paper_rule_t_mod_k():
    for every in (1, 2, 3, 5, 7):
        sched = MaskSchedule(num_rounds=40, tau0=0.3, every=every)
        for server_round in range(1, 41):
            t = server_round - 1
            assert sched.is_mask_round(server_round) == (t % every == 0)


def test_every_1_masks_every_round():
    sched = MaskSchedule(num_rounds=7, tau0=0.5, every=1)
    assert sched.mask_rounds() == list(range(1, 8))


def test_without_mask_last_round_the_final_round_is_never_a_mask_round():
    """every=5 over 6 rounds: 1 and 6 as the paper's rule reads, 1 only when the last may not mask."""
    assert MaskSchedule(6, every=5).mask_rounds() == [1, 6]
    last_spared = MaskSchedule(6, every=5, mask_last_round=False)
    assert last_spared.mask_rounds() == [1]
    assert (last_spared.is_mask_round(6), last_spared.tau(6)) == (False, 0.0)
    assert MaskSchedule(1, every=1, mask_last_round=False).mask_rounds() == []
    assert MaskSchedule(7, every=5, mask_last_round=False).mask_rounds() == [1, 6]
    with pytest.raises(ValueError, match="mask_last_round"):
        MaskSchedule(6, mask_last_round="no")


def test_round_zero_and_negative_are_not_mask_rounds():
    sched = MaskSchedule(num_rounds=10, every=5)
    assert not sched.is_mask_round(0)
    assert not sched.is_mask_round(-4)
    assert sched.tau(0) == 0.0


def test_default_hyperparameters():
    sched = MaskSchedule(num_rounds=10)
    assert sched.tau0 == 0.5
    assert sched.every == 5
    assert sched.start_round == 1
    assert sched.decay == "linear"
    assert set(DECAYS) == {"linear", "constant", "cosine"}


# --------------------------------------------------------------------------- tau values
@pytest.mark.parametrize("tau0", [0.5, 0.7, 0.123])
def test_tau_at_round_one_is_tau0(tau0):
    sched = MaskSchedule(num_rounds=300, tau0=tau0, every=5)
    assert sched.tau(1) == tau0


@pytest.mark.parametrize("num_rounds,every", [(11, 5), (300, 1), (301, 5), (1, 5), (21, 4)])
def test_tau_at_last_round(num_rounds, every):
    tau0 = 0.7
    sched = MaskSchedule(num_rounds=num_rounds, tau0=tau0, every=every)
    assert sched.is_mask_round(num_rounds)
    expected = tau0 * (1 - (num_rounds - 1) / num_rounds)
    assert sched.tau(num_rounds) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert sched.tau(num_rounds) > 0.0


def test_linear_tau_on_every_mask_round():
    T, tau0 = 300, 0.5
    sched = MaskSchedule(num_rounds=T, tau0=tau0, every=5)
    for server_round in range(1, T + 1):
        t = server_round - 1
        expected = tau0 * (1 - t / T) if t % 5 == 0 else 0.0
        assert sched.tau(server_round) == pytest.approx(expected, abs=1e-15)


def test_tau_is_zero_on_non_mask_rounds():
    sched = MaskSchedule(num_rounds=50, tau0=0.5, every=5)
    for server_round in (2, 3, 4, 5, 7, 10, 12, 50):
        assert sched.tau(server_round) == 0.0


def test_tau_decreases_over_mask_rounds():
    sched = MaskSchedule(num_rounds=100, tau0=0.6, every=5)
    taus = [sched.tau(r) for r in sched.mask_rounds()]
    assert all(a > b for a, b in zip(taus, taus[1:]))
    assert all(0.0 < x <= 0.6 for x in taus)


def test_tau0_zero_never_masks_anything():
    sched = MaskSchedule(num_rounds=20, tau0=0.0, every=5)
    assert all(sched.tau(r) == 0.0 for r in range(1, 21))
    # tau0 == 0 is valid and stays a float
    assert isinstance(sched.tau0, float)


def test_int_tau0_zero_is_accepted_as_float():
    assert MaskSchedule(num_rounds=3, tau0=0).tau0 == 0.0


def test_tau_past_num_rounds_is_clamped_to_zero():
    sched = MaskSchedule(num_rounds=10, tau0=0.5, every=1)
    assert sched.tau(11) == 0.0
    assert sched.tau(1000) == 0.0
    assert sched.decay_factor(1000) == 0.0


# --------------------------------------------------------------------------- start_round
def test_start_round_shifts_mask_rounds_but_not_decay():
    T, tau0 = 20, 0.5
    sched = MaskSchedule(num_rounds=T, tau0=tau0, every=5, start_round=3)
    assert sched.mask_rounds() == [3, 8, 13, 18]
    assert not sched.is_mask_round(1)
    assert not sched.is_mask_round(2)
    assert sched.tau(1) == 0.0
    # the decay still uses t = server_round - 1
    assert sched.tau(3) == pytest.approx(tau0 * (1 - 2 / T))
    assert sched.tau(18) == pytest.approx(tau0 * (1 - 17 / T))


def test_start_round_beyond_num_rounds_is_rejected():
    """A schedule without a single mask round is a configuration mistake, not a no-op."""
    with pytest.raises(ValueError, match=r"`start_round` must be <= num_rounds \(5\), got 9"):
        MaskSchedule(num_rounds=5, tau0=0.5, every=2, start_round=9)
    assert MaskSchedule(num_rounds=5, tau0=0.5, every=2, start_round=5).mask_rounds() == [5]


# --------------------------------------------------------------------------- decays
def test_cosine_decay():
    T, tau0 = 40, 0.5
    sched = MaskSchedule(num_rounds=T, tau0=tau0, every=5, decay="cosine")
    assert sched.tau(1) == tau0
    for server_round in sched.mask_rounds():
        t = server_round - 1
        expected = tau0 * 0.5 * (1 + math.cos(math.pi * t / T))
        assert sched.tau(server_round) == pytest.approx(expected, rel=1e-12)
    assert sched.tau(2) == 0.0
    # cosine decays slower than linear early on, faster late
    lin = MaskSchedule(num_rounds=T, tau0=tau0, every=5)
    assert sched.tau(6) > lin.tau(6)
    assert sched.tau(36) < lin.tau(36)


def test_constant_decay():
    sched = MaskSchedule(num_rounds=30, tau0=0.4, every=5, decay="constant")
    for server_round in range(1, 31):
        expected = 0.4 if (server_round - 1) % 5 == 0 else 0.0
        assert sched.tau(server_round) == expected


@pytest.mark.parametrize("decay", DECAYS)
def test_decay_factor_in_unit_interval(decay):
    sched = MaskSchedule(num_rounds=13, tau0=0.5, every=1, decay=decay)
    assert sched.decay_factor(1) == 1.0
    for server_round in range(-3, 30):
        assert 0.0 <= sched.decay_factor(server_round) <= 1.0


def test_schedule_is_frozen():
    sched = MaskSchedule(num_rounds=10)
    with pytest.raises(Exception):
        sched.tau0 = 0.9  # type: ignore[misc]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("tau0", [1.0, 1, -0.1, 1.5, float("nan"), float("inf"), -float("inf")])
def test_invalid_tau0_value(tau0):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=10, tau0=tau0)
    msg = str(err.value)
    assert "tau0" in msg
    assert "[0, 1)" in msg


@pytest.mark.parametrize("tau0", [True, False, "0.5", None, [0.5], 0.5j])
def test_invalid_tau0_type(tau0):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=10, tau0=tau0)
    msg = str(err.value)
    assert "tau0" in msg
    assert "[0, 1)" in msg


@pytest.mark.parametrize("tau0", [0.0, 0, 1e-12, 0.5, 0.999999])
def test_valid_tau0(tau0):
    assert validate_tau0(tau0) == float(tau0)
    assert MaskSchedule(num_rounds=3, tau0=tau0).tau0 == float(tau0)


@pytest.mark.parametrize("every", [0, -1, -5])
def test_every_below_one(every):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=10, every=every)
    msg = str(err.value)
    assert "every" in msg and ">= 1" in msg


@pytest.mark.parametrize("num_rounds", [0, -1])
def test_num_rounds_below_one(num_rounds):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=num_rounds)
    msg = str(err.value)
    assert "num_rounds" in msg and ">= 1" in msg


@pytest.mark.parametrize("start_round", [0, -3])
def test_start_round_below_one(start_round):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=10, start_round=start_round)
    msg = str(err.value)
    assert "start_round" in msg and ">= 1" in msg


@pytest.mark.parametrize("field", ["num_rounds", "every", "start_round"])
@pytest.mark.parametrize("value", [2.0, 2.5, "3", None, True, False])
def test_non_int_integer_arguments(field, value):
    kwargs = {"num_rounds": 10, "every": 5, "start_round": 1}
    kwargs[field] = value
    with pytest.raises(ValueError) as err:
        MaskSchedule(**kwargs)
    msg = str(err.value)
    assert field in msg
    assert "integer >= 1" in msg


@pytest.mark.parametrize("decay", ["exp", "Linear", "", None, 1])
def test_unknown_decay(decay):
    with pytest.raises(ValueError) as err:
        MaskSchedule(num_rounds=10, decay=decay)
    msg = str(err.value)
    assert "decay" in msg
    for name in DECAYS:
        assert name in msg


def test_numpy_scalars_are_accepted():
    """Values read from configs or arrays are often numpy scalars."""
    import numpy as np

    s = MaskSchedule(np.int64(10), np.float32(0.5), np.int32(5))
    assert s.num_rounds == 10 and s.every == 5 and isinstance(s.num_rounds, int)
    assert s.tau(1) == pytest.approx(0.5)
