"""The pre-registered study's statistics and endpoint, on known numbers (lips_flwr.experiments.stats, prereg.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

scipy = pytest.importorskip("scipy")
PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import prereg  # noqa: E402

from lips_flwr.experiments.stats import NO_TEST_ZERO_VARIANCE, holm, paired, sign_test, verdict  # noqa: E402


def test_paired_t_test_ci_and_sign_test_match_their_definitions():
    d = [0.01, 0.03, -0.01, 0.02, 0.04, 0.00]
    out = paired(d)
    mean = sum(d) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 5)  # ddof = 1
    assert out["mean"] == pytest.approx(mean) and out["sd"] == pytest.approx(sd)
    half = scipy.stats.t.ppf(0.975, 5) * sd / math.sqrt(6)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((mean - half, mean + half))
    assert out["p_t"] == pytest.approx(scipy.stats.ttest_1samp(d, 0.0).pvalue)
    # 4 wins, 1 loss, 1 tie dropped: P(X <= 1 | n=5) * 2 = 2 * 6/32
    assert out["p_sign"] == pytest.approx(12 / 32) and (out["wins"], out["losses"]) == (4, 1)


def test_sign_test_extremes_and_degenerate_inputs():
    assert sign_test([1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 64)  # the smallest p with 6 seeds
    assert sign_test([0, 0]) == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        paired([0.1])
    with pytest.raises(ValueError, match=r"must be finite numbers, got \[0\.1, nan\]"):
        paired([0.1, math.nan])


@pytest.mark.parametrize("differences", [[0.02, 0.02], [0.02] * 6, [-0.01] * 3, [0.0, 0.0]])
def test_zero_variance_gets_no_t_test_and_no_verdict_from_it(differences):
    """Every seed the same difference: the t statistic is undefined, not infinite; a CI [m, m] from two
    seeds would claim certainty, and p_t = 0 made the verdict "supported"."""
    same = paired(differences)
    assert same["sd"] == 0.0 and same["mean"] == pytest.approx(differences[0])
    assert math.isnan(same["t"]) and math.isnan(same["p_t"])
    assert math.isnan(same["ci_low"]) and math.isnan(same["ci_high"])
    assert same["p_sign"] == sign_test(differences)  # the sign test still says what it can
    assert verdict(same, same["p_t"]) == verdict(same, 0.001) == NO_TEST_ZERO_VARIANCE
    assert NO_TEST_ZERO_VARIANCE == "no test (zero variance)"
    adjusted = holm({"H1": same["p_t"], "H2": 0.01, "H3": 0.04})  # a test not made still counts in the family
    assert math.isnan(adjusted["H1"]) and adjusted["H2"] == pytest.approx(0.03)
    assert adjusted["H3"] == pytest.approx(0.08)


def test_holm_is_step_down_monotone_and_capped():
    assert holm({"H1": 0.01, "H2": 0.04, "H3": 0.03}) == pytest.approx({"H1": 0.03, "H2": 0.06, "H3": 0.06})
    assert holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}


def run(after: dict[int, float], rounds: int = 20, every: int = 5, masks: dict[int, int] | None = None) -> dict:
    masks = masks or {}
    return {"run_config": {"num-server-rounds": rounds, "every": every},
            "rounds": {str(r): {"evaluate": {"acc-after": a},
                                "train": {"lips-mask-round": int(r in masks), "lips-zeros": masks.get(r, 0)}}
                       for r, a in after.items()}}


def test_endpoint_is_the_mean_of_the_last_ten_rounds_and_needs_all_of_them():
    data = run({r: r / 100 for r in range(1, 21)})
    assert prereg.endpoint(data) == pytest.approx(sum(range(11, 21)) / 1000)
    del data["rounds"]["15"]
    assert prereg.endpoint(data) is None


def test_verdicts_follow_the_protocol_words():
    assert prereg.verdict({"ci_low": 0.01, "ci_high": 0.03}, 0.01) == "supported"
    assert prereg.verdict({"ci_low": -0.03, "ci_high": -0.01}, 0.01) == "contradicted"
    assert prereg.verdict({"ci_low": 0.01, "ci_high": 0.03}, 0.2) == "no effect detected"


def test_setbacks_compare_a_mask_round_with_the_round_before_and_count_recovery():
    after = {r: 0.5 for r in range(1, 21)}
    after.update({6: 0.45, 7: 0.48, 8: 0.51, 11: 0.52})
    out = prereg.setbacks(run(after, masks={1: 10, 6: 10, 11: 10, 16: 0}))
    assert out == [(pytest.approx(-0.05), 2), (pytest.approx(0.02), 0)]  # round 1: before 6; 16: zeroed nothing


def test_inertia_rule_middle_against_first_and_last_layers():
    def steps(early, late):
        return {r: (early if r <= 6 else late) for r in range(1, 21)}

    layers = {"first": steps(0.1, 0.05), "mid": steps(0.1, 0.01), "last": steps(0.1, 0.05)}
    data = {"run_config": {"num-server-rounds": 20},
            "rounds": {str(r): {"train": {f"inertia-rel-step/{n}": s[r] for n, s in layers.items()}}
                       for r in range(1, 21)}}
    out = prereg.inertia_rho(data, ["mid"], ["first", "last"])
    assert out["rho"]["mid"] == pytest.approx(0.1) and out["edges"] == pytest.approx(0.5) and out["arises"]
    layers["mid"] = steps(0.1, 0.05)  # everything slows together: convergence, not inertia
    data["rounds"] = {str(r): {"train": {f"inertia-rel-step/{n}": s[r] for n, s in layers.items()}}
                      for r in range(1, 21)}
    assert not prereg.inertia_rho(data, ["mid"], ["first", "last"])["arises"]


def _write_runs(folder, shift, seeds=range(1000, 1004)):
    import json

    import numpy as np

    layers = ["conv1.0.weight", "conv2.0.weight", "fc.weight"]
    folder.mkdir()
    rng = np.random.default_rng(0)
    for method, delta in shift.items():
        for seed in seeds:
            masks = method.startswith("lips") and method != "lips-inertia"
            rounds = {}
            for r in range(1, 13):
                masked = masks and r % 5 == 1
                train = {"num-examples": 2000, "acc-before": 0.6, "lips-mask-round": int(masked),
                         "lips-zeros": 100 if masked else 0, **{f"inertia-rel-step/{n}": 0.1 / r for n in layers}}
                after = 0.5 + r / 100 + delta + rng.normal(scale=0.002)
                rounds[str(r)] = {"train": train, "evaluate": {"acc-after": after}}
            conf = {"algorithm": method, "seed": seed, "num-server-rounds": 12, "samples-per-client": 100,
                    "alpha": 0.1, "local-epochs": 5, "every": 5}
            data = {"run_config": conf, "rounds": rounds}
            (folder / f"{method}-seed{seed}.json").write_text(json.dumps(data))


def test_report_writes_the_tables_verdicts_and_figures(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import json

    groups = (["conv2.0.weight"], ["conv1.0.weight", "fc.weight"])  # middle, first and last
    monkeypatch.setattr(prereg, "layer_groups", lambda conf: groups)
    folder = tmp_path / "prereg-fmnist-dir0.1"
    _write_runs(folder, {"fedbn": 0.0, "lips": 0.01, "lips-random": -0.05, "lips-inertia": 0.0, "freeze": -0.01})
    prereg.report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| H1 | lips - fedbn | 4 |" in text and "| H2 | lips - lips-random | 4 |" in text
    assert "| H3 | lips-inertia - fedbn | 4 |" in text and "| freeze - fedbn | acc-after | 4 |" in text
    assert "inertia arises in 0 of 4 runs" in text  # every layer slows together
    for name in ("accuracy.png", "secondary.png", "differences.png", "relative-step.png"):
        assert (folder / name).read_bytes()[:4] == b"\x89PNG" and f"`{name}`" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["prereg-fmnist-dir0.1"]["hypotheses"]["H2"]["mean"] == pytest.approx(0.06, abs=0.005)


def test_the_dir1_regime_is_reported_as_exploratory_without_a_verdict(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    groups = (["conv2.0.weight"], ["conv1.0.weight", "fc.weight"])
    monkeypatch.setattr(prereg, "layer_groups", lambda conf: groups)
    _write_runs(tmp_path / "prereg-fmnist-dir1.0", {"fedbn": 0.0, "lips": 0.02})
    prereg.report(tmp_path)
    text = (tmp_path / "report.md").read_text().split("## prereg-fmnist-dir1.0")[1]
    assert "| hypothesis |" not in text and "supported" not in text  # PROTOCOL.md: secondary, uncorrected
    assert "| lips - fedbn | acc-after | 4 | +2.0" in text and "| lips - fedbn | acc-before | 4 |" in text
    assert (tmp_path / "prereg-fmnist-dir1.0" / "differences.png").read_bytes()[:4] == b"\x89PNG"


def test_the_method_table_gives_mean_and_sd_and_one_seed_as_it_is():
    assert prereg._mean_sd([0.9, 0.92]) == f"0.9100 +- {np.std([0.9, 0.92], ddof=1):.4f}"
    assert prereg._mean_sd([0.93]) == "0.9300 (one seed)"
    assert prereg._mean_sd([]) == "-"


def test_the_committed_studys_report_is_reproduced_from_its_files(tmp_path):
    """`prereg.py report` on docs/results/prereg: the committed report and summary, number for number.

    Those result files predate provenance (issue 26): they are read as they
    are, and the report says so.
    """
    pytest.importorskip("matplotlib")
    import shutil

    committed = PAPER.parents[1] / "docs" / "results" / "prereg"
    shutil.copytree(committed, tmp_path / "prereg", ignore=shutil.ignore_patterns("*.png"))
    prereg.report(tmp_path / "prereg")
    text = (tmp_path / "prereg" / "report.md").read_text()
    assert text == (committed / "report.md").read_text()
    assert "66 of the 66 result files predate provenance" in text
    assert (tmp_path / "prereg" / "summary.json").read_text() == (committed / "summary.json").read_text()
