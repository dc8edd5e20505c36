"""examples/paper/setbacks.py: set-backs counted on hand-made runs (known falls, recoveries, censoring)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import setbacks  # noqa: E402

# A 14-round run, acc-after per round. Set-backs (>= 10 points below the round before):
#   round 4  (0.70 -> 0.55): back within 1 point (>= 0.69) at round 6, 2 rounds; depth 0.15
#   round 8  (0.80 -> 0.70, exactly 10 points): back at round 9 (0.795 >= 0.79); depth 0.10
#   round 12 (0.86 -> 0.70): never back to 0.85: censored, 2 rounds seen; depth 0.86 - 0.60
#   round 13 (0.70 -> 0.60): a second fall inside round 12's episode; back at 14 (0.70); depth 0.10
#            (0.70 - 0.60 is 0.09999999999999998 in floating point: exactly 10 points all the same)
# Not set-backs: round 10 (0.795 -> 0.7051, 8.99 points); round 6 regains 0.695, 0.5 point short.
ACC = [0.50, 0.60, 0.70, 0.55, 0.65, 0.695, 0.80, 0.70, 0.795, 0.7051, 0.86, 0.70, 0.60, 0.70]
LAST = len(ACC)


def acc_series(values=ACC) -> dict[int, float]:
    return {t: a for t, a in enumerate(values, start=1)}


def run(seed: int, values=ACC, zeros_at=(), algorithm="lips") -> dict:
    rounds = {str(t): {"train": {"lips-zeros": 7 if t in zeros_at else 0}, "evaluate": {"acc-after": a}}
              for t, a in acc_series(values).items()}
    conf = {"num-server-rounds": len(values), "seed": seed, "every": 5, "tau0": 0.5, "algorithm": algorithm}
    return {"run_config": conf, "rounds": rounds}


def test_setbacks_their_falls_depths_and_recoveries():
    found = setbacks.find_setbacks(acc_series(), LAST)
    assert [e.round for e in found] == [4, 8, 12, 13]
    assert [e.recovery for e in found] == [2, 1, 2, 1]
    assert [e.censored for e in found] == [False, False, True, False]
    assert [round(e.fall, 6) for e in found] == [0.15, 0.10, 0.16, 0.10]
    assert [round(e.depth, 6) for e in found] == [0.15, 0.10, 0.26, 0.10]


def test_a_set_back_never_regained_is_censored_at_the_last_round():
    found = setbacks.find_setbacks(acc_series([0.9, 0.9, 0.5, 0.6, 0.7]), 5)
    assert [(e.round, e.recovery, e.censored, round(e.depth, 6)) for e in found] == [(3, 2, True, 0.4)]
    last_round = setbacks.find_setbacks(acc_series([0.9, 0.7]), 2)
    assert [(e.round, e.recovery, e.censored) for e in last_round] == [(2, 0, True)]


def test_the_secondary_threshold_counts_smaller_falls_too():
    found = setbacks.find_setbacks(acc_series(), LAST, threshold=0.05)
    assert [e.round for e in found] == [4, 8, 10, 12, 13]


def test_a_round_without_accuracy_is_not_judged_nor_the_round_after_it():
    acc = acc_series()
    del acc[3]  # round 4's fall from round 3 cannot be judged; round 3 cannot end a recovery
    assert [e.round for e in setbacks.find_setbacks(acc, LAST)] == [8, 12, 13]


def test_counts_per_stratum_with_recorded_masks():
    data = run(0, zeros_at={6, 11})
    counted = setbacks.count_run(data, setbacks.masked_rounds(data))
    counts = counted["counts"]
    assert counts["all"] == {"rounds": 13, "setbacks": 4}
    assert counts["mask"] == {"rounds": 2, "setbacks": 0}
    assert counts["after-mask"] == {"rounds": 2, "setbacks": 1}  # round 12, after the mask of 11
    assert counts["other"] == {"rounds": 9, "setbacks": 3}
    assert counts["early"] == {"rounds": 13, "setbacks": 4}  # (every round of 14 is <= 50)
    assert counts["late"] == {"rounds": 0, "setbacks": 0}
    assert [e["round"] for e in counted["events"]] == [4, 8, 12, 13]
    assert [e["place"] for e in counted["events"]] == ["other", "other", "after-mask", "other"]
    # the last mask at or before each, with tau(t) = 0.5 * (1 - (t - 1) / 14)
    assert counted["events"][0]["last_mask"] is None
    assert counted["events"][1]["last_mask"] == {"round": 6, "tau": pytest.approx(0.5 * (1 - 5 / 14))}
    assert counted["events"][2]["last_mask"] == {"round": 11, "tau": pytest.approx(0.5 * (1 - 10 / 14))}
    placebo = setbacks.count_run(data, setbacks.schedule_rounds(14, 5), placebo=True)
    assert all(e["last_mask"] is None for e in placebo["events"])


def test_the_reading_states_lips_mask_round_set_backs_and_their_fractions():
    masked = run(0, [0.5, 0.6, 0.7, 0.7, 0.7, 0.55, 0.7, 0.7], zeros_at={1, 6})  # a fall at the mask of 6
    flat = run(0, [0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7], algorithm="fedbn")
    lips = setbacks.count_run(masked, setbacks.masked_rounds(masked))
    fedbn = setbacks.count_run(flat, setbacks.schedule_rounds(8, 5), placebo=True)
    primary = {"regime": {"fedbn": {"runs": [fedbn], "summary": setbacks.summarize_method([fedbn])},
                          "lips": {"runs": [lips], "summary": setbacks.summarize_method([lips])}}}
    text = "\n".join(setbacks.reading(primary))
    assert "100.00% (1/1) of its mask rounds" in text and "FedBN in 0.00% (0/7)" in text
    assert f"tau(t) was {0.5 * (1 - 5 / 8):.3f}" in text and "not regained" not in text


def test_a_method_that_never_masks_gets_the_schedule_as_a_placebo():
    assert setbacks.schedule_rounds(14, 5) == {1, 6, 11}
    assert setbacks.method_masks("lips") and setbacks.method_masks("lips-inertia")
    assert not setbacks.method_masks("fedbn") and not setbacks.method_masks("freeze")


def test_bootstrap_over_runs_and_no_interval_without_a_set_back():
    none = setbacks.bootstrap_frequency([0, 0, 0], [99, 99, 99])
    assert none["frequency"] == 0.0 and none["ci_low"] is None and none["ci_high"] is None
    same = setbacks.bootstrap_frequency([2, 2, 2], [100, 100, 100])
    assert same["frequency"] == pytest.approx(0.02)
    assert same["ci_low"] == pytest.approx(0.02) and same["ci_high"] == pytest.approx(0.02)
    spread = setbacks.bootstrap_frequency([0, 0, 0, 0, 10], [100] * 5)
    assert spread["frequency"] == pytest.approx(0.02)
    assert spread["ci_low"] == 0.0 and 0.02 < spread["ci_high"] <= 0.10
    assert spread == setbacks.bootstrap_frequency([0, 0, 0, 0, 10], [100] * 5)  # default_rng(0): the same


def test_median_recovery_counts_a_censored_one_as_the_longest():
    events = [{"recovery": 1, "censored": False}, {"recovery": 3, "censored": False},
              {"recovery": 1, "censored": True}]
    assert setbacks.median_recovery(events) == "3"
    assert setbacks.median_recovery(events + [{"recovery": 2, "censored": True}]) == "> 3"
    assert setbacks.median_recovery(events[:2]) == "2"
    assert setbacks.median_recovery([]) == "-"


def test_the_paired_control_is_fedbn_of_the_same_seed():
    flat = [0.5, 0.6, 0.7] + [0.7] * (LAST - 3)  # no set-back
    lips = [setbacks.count_run(run(s, ACC), set()) for s in (0, 1)]
    fedbn = [setbacks.count_run(run(s, flat, algorithm="fedbn"), set()) for s in (1, 0)]
    diff = setbacks.against_control(lips, fedbn)["all"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(4 / 13)
    assert diff["differences"] == pytest.approx([4 / 13, 4 / 13])


def test_the_committed_study_has_19_mask_rounds_per_lips_run_and_19_placebo_rounds_per_fedbn_run():
    folder = PAPER.parents[1] / "docs" / "results" / "prereg" / "prereg-fmnist-dir1.0"
    methods = setbacks.count_regime(folder, setbacks.THRESHOLD)
    assert sorted(methods) == ["fedbn", "lips"]
    for method in ("fedbn", "lips"):
        assert len(methods[method]["runs"]) == 6
        for counted in methods[method]["runs"]:
            assert counted["counts"]["all"]["rounds"] == 99
            assert counted["counts"]["mask"]["rounds"] == 19  # rounds 6, 11, ..., 96
    assert "vs_fedbn" in methods["lips"] and "vs_fedbn" not in methods["fedbn"]
    assert json.dumps(methods)  # what setbacks.json holds


def test_a_difference_the_same_for_every_seed_has_no_interval_in_the_report():
    from lips_flwr.experiments.stats import paired

    assert setbacks._diff(paired([0.0, 0.0, 0.0])) == "+0.00 (every seed the same)"  # not "[+nan, +nan]"
    assert setbacks._diff(paired([0.01, 0.03])).startswith("+2.00 [")
    assert setbacks._diff(None) == "-"
