"""examples/paper/resnet8.py: the ResNet8 study's runs and report, on the pilot's runs and hand-made ones."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import resnet8  # noqa: E402

PILOT = PAPER.parents[1] / "docs" / "results" / "pilot"
LAYERS = ["conv1.weight", "layer1.0.conv1.weight", "layer1.0.conv2.weight", "layer2.0.conv1.weight",
          "layer2.0.conv2.weight", "layer2.0.shortcut.0.weight", "layer3.0.conv1.weight",
          "layer3.0.conv2.weight", "layer3.0.shortcut.0.weight", "fc.weight"]


def study_run(arm: str, seed: int, acc: float, middle_cos: float = 0.998, edge_cos: float = 0.9,
              rounds: int = 20) -> dict:
    """A ResNet8 run of the study's shape: ``acc`` every round; at the last round the middle layers'
    cosine to round 2 is ``middle_cos`` and the first and last layers' ``edge_cos``."""
    out = {}
    for t in range(1, rounds + 1):
        train = {f"inertia-rel-step/{n}": 0.1 for n in LAYERS}
        if t >= 3:
            share = (t - 2) / (rounds - 2)  # from 1 at round 2 to the final value at the last round
            train.update({f"inertia-cos-t0/{n}": 1 - share * (1 - (edge_cos if n in (LAYERS[0], LAYERS[-1])
                                                                   else middle_cos)) for n in LAYERS})
        masks = arm != "fedbn" and (t - 1) % 5 == 0
        train.update({"acc-before": acc + 0.01, "lips-mask-round": int(masks), "lips-zeros": 100 * masks})
        out[str(t)] = {"train": train, "evaluate": {"acc-after": acc}, "seconds": 10.0 * t}
    conf = {"algorithm": arm, "seed": seed, "num-server-rounds": rounds, "every": 5, "tau0": 0.5,
            "model": "resnet8", "dataset": "fashion-mnist"}
    return {"run_config": conf, "rounds": out}


def write(folder: Path, runs: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for data in runs:
        conf = data["run_config"]
        (folder / f"{conf['algorithm']}-seed{conf['seed']}.json").write_text(json.dumps(data))
    return folder


def whole_study(folder: Path, gain: float = 0.02) -> Path:
    """Six seeds x three arms: LIPS ``gain`` (+- a little per seed) above FedBN and LIPS-random."""
    runs = []
    for i, seed in enumerate(resnet8.SEEDS):
        noise = 0.002 * (i % 3 - 1)
        runs += [study_run("fedbn", seed, 0.90), study_run("lips-random", seed, 0.90 + noise / 2),
                 study_run("lips", seed, 0.90 + gain + noise, middle_cos=0.99 + noise)]
    return write(folder, runs)


def test_the_study_s_conf_is_the_pilot_s_cell_unchanged():
    study = tomllib.loads((PAPER / "conf" / "resnet8-n100.toml").read_text())
    pilot = tomllib.loads((PAPER / "conf" / "pilot-resnet8-n100.toml").read_text())
    assert study == pilot


def test_the_runs_are_three_arms_seed_by_seed_each_in_one_thread():
    specs = resnet8.run_specs()
    assert [s.name for s in specs] == [f"{arm}-seed{seed}" for seed in range(3000, 3006)
                                       for arm in ("fedbn", "lips", "lips-random")]
    for spec in specs:
        assert spec.overrides["algorithm"] in resnet8.ARMS and spec.num_nodes == 20
        assert spec.overrides["model"] == "resnet8" and spec.overrides["samples-per-client"] == 100
        assert dict(spec.env) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    assert [s.name for s in resnet8.run_specs((3002,))] == ["fedbn-seed3002", "lips-seed3002",
                                                            "lips-random-seed3002"]
    with pytest.raises(SystemExit, match="not the study's"):
        resnet8.run_specs((2000,))


def test_the_cosine_rule_sees_the_pilot_s_resnet8_inertia_that_the_pace_rule_missed():
    """RESNET8.md's reason for its measure, recomputed from the committed pilot files."""
    for path in sorted(PILOT.glob("resnet8-n*/fedbn-seed*.json")):
        data = json.loads(path.read_text())["app"]
        measured = resnet8.cosine_inertia(data)
        assert measured["arises"], path
        assert 0.996 <= measured["middle_cosine"] <= 1.0 and measured["ratio"] < 0.03
        assert 0.88 <= measured["cosine"]["conv1.weight"] <= 0.93
    report = json.loads((PILOT / "report.json").read_text())
    assert all(not r["inertia"]["arises"] for c in report["cells"].values() for r in c["runs"])


def test_the_cosine_rule_needs_both_a_still_middle_and_moving_edges():
    assert resnet8.cosine_inertia(study_run("fedbn", 3000, 0.9))["arises"]
    both_moving = resnet8.cosine_inertia(study_run("fedbn", 3000, 0.9, middle_cos=0.9, edge_cos=0.9))
    assert not both_moving["arises"] and both_moving["ratio"] == pytest.approx(1.0)
    middle_below = resnet8.cosine_inertia(study_run("fedbn", 3000, 0.9, middle_cos=0.94, edge_cos=0.5))
    assert not middle_below["arises"]  # moved less than half the edges, but below the 0.95 signature
    assert resnet8.cosine_inertia(study_run("fedbn", 3000, 0.9, rounds=2)) is None


def test_a_whole_study_gets_holm_verdicts_the_mechanism_and_the_decision(tmp_path):
    result = resnet8.analyse(whole_study(tmp_path / "r"))
    assert result["complete"] and not result["missing"]
    h1, h2 = result["hypotheses"]["H1"], result["hypotheses"]["H2"]
    assert h1["n"] == h2["n"] == 6 and h1["mean"] == pytest.approx(0.02)
    assert h1["p_holm"] == pytest.approx(min(1.0, 2 * min(h1["p_t"], h2["p_t"])) if h1["p_t"] <= h2["p_t"]
                                         else max(h1["p_t"], 2 * h2["p_t"]))
    assert h1["verdict"] == h2["verdict"] == "supported"
    assert result["inertia"]["premise"] == {"runs": 6, "arises_in": 6, "holds": True}
    assert result["mechanism"]["tests"]["lips - fedbn"]["mean"] == pytest.approx(0.008)
    assert result["mechanism"]["lips_moves_middle_layers"] is True
    text = "\n".join(resnet8.decision_lines(result))
    assert "1. Premise: cosine inertia arises in 6 of 6 FedBN runs" in text
    assert "2. H1 supported (+2.00 points" in text and "H2 supported" in text
    assert "4. Mechanism: LIPS moved the middle layers, and H1 found a gain." in text


def test_no_effect_is_said_with_its_interval_and_a_still_middle_counts_against_the_mechanism(tmp_path):
    folder = whole_study(tmp_path / "r", gain=0.0)
    for seed in resnet8.SEEDS:  # LIPS leaves the middle layers where FedBN does
        write(folder, [study_run("lips", seed, 0.90 + 0.002 * (seed % 3 - 1))])
    result = resnet8.analyse(folder)
    assert result["hypotheses"]["H1"]["verdict"] == "no effect detected"
    assert result["mechanism"]["lips_moves_middle_layers"] == "no test"  # the same D_mid in every seed
    for i, seed in enumerate(resnet8.SEEDS):  # LIPS's middle layers a little closer to round 2 than FedBN's
        write(folder, [study_run("lips", seed, 0.90 + 0.002 * (seed % 3 - 1), middle_cos=0.9985 + 1e-4 * i)])
    result = resnet8.analyse(folder)
    assert result["mechanism"]["lips_moves_middle_layers"] is False
    text = "\n".join(resnet8.decision_lines(result))
    assert "LIPS did not help where its premise holds" in text
    assert "the paper's mechanism (breaking the inertia) did not act here" in text


def test_an_unfinished_study_names_what_is_missing_and_gives_no_verdict(tmp_path):
    folder = tmp_path / "r"
    write(folder, [study_run(arm, seed, 0.9 + (arm == "lips") * 0.01 * (1 + seed % 2))
                   for seed in (3000, 3001) for arm in resnet8.ARMS])
    result = resnet8.analyse(folder)
    assert not result["complete"] and result["missing"][0] == "fedbn-seed3002" and len(result["missing"]) == 12
    assert result["hypotheses"]["H1"]["n"] == 2
    assert all("verdict" not in t and "p_holm" not in t for t in result["hypotheses"].values())
    assert result["mechanism"]["lips_moves_middle_layers"] is None
    text = "\n".join(resnet8.report_lines(result))
    assert "Not run yet: fedbn-seed3002" in text and "No verdict and no decision" in text
    assert "not yet (runs missing)" in text
    for word in ("supported", "contradicted", "no effect detected", "Premise:"):
        assert word not in text


def test_the_report_writes_its_files_with_provenance(tmp_path):
    pytest.importorskip("matplotlib")
    folder = whole_study(tmp_path / "r")
    record = resnet8.report(folder, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["hypotheses"]["H1"]["mean"] == pytest.approx(record["hypotheses"]["H1"]["mean"])
    assert saved["hypotheses"]["H1"]["differences"] == pytest.approx([0.018, 0.02, 0.022] * 2)
    assert len(saved["provenance"]["commit"]) == 40 and len(saved["provenance"]["inputs"]) == 18
    assert (tmp_path / "out" / "cosine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| H1 | lips - fedbn | 6 |" in text and "## Set-backs" in text


def test_the_committed_report_is_reproduced_from_its_18_result_files(tmp_path):
    """report.json's numbers (issue 37: each hypothesis's mean, CI, t and sign-test p) recompute from
    the committed result files, and the decision is drawn only because all 18 exist."""
    pytest.importorskip("matplotlib")
    committed = PAPER.parents[1] / "docs" / "results" / "resnet8"
    assert len(list(committed.glob("*-seed300[0-5].json"))) == 18
    record = resnet8.report(committed, tmp_path / "out")
    saved = json.loads((committed / "report.json").read_text())
    assert record["complete"] and saved["complete"] and saved["missing"] == []
    for name in ("H1", "H2"):
        for key in ("mean", "ci_low", "ci_high", "t", "p_t", "p_sign", "p_holm", "differences"):
            assert saved["hypotheses"][name][key] == pytest.approx(record["hypotheses"][name][key]), (name, key)
        assert saved["hypotheses"][name]["verdict"] == record["hypotheses"][name]["verdict"]
    assert (committed / "report.md").read_text() == (tmp_path / "out" / "report.md").read_text()
