"""examples/paper/pilot.py: the inertia pilot's analysis, on the study's committed runs and hand-made ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import pilot  # noqa: E402

PREREG = PAPER.parents[1] / "docs" / "results" / "prereg"
FIRST, MIDDLE, LAST_LAYER = "conv1.0.weight", [f"conv{i}.0.weight" for i in (2, 3, 4, 5)], "fc.weight"


def fedbn_run(seed: int, rounds: int = 20, middle_late: float = 0.01, seconds: float = 3600.0) -> dict:
    """A FedBN run of fashion-cnn whose first and last layers step 0.1 every round; the middle ones
    step 0.1 up to round 6 and ``middle_late`` after (0.1: no layer slows down)."""
    out = {}
    for t in range(1, rounds + 1):
        steps = {f"inertia-rel-step/{n}": 0.1 for n in (FIRST, LAST_LAYER)}
        steps.update({f"inertia-rel-step/{n}": 0.1 if t <= 6 else middle_late for n in MIDDLE})
        out[str(t)] = {"train": {**steps, "lips-mask-round": 0, "lips-zeros": 0},
                       "evaluate": {"acc-after": 0.9}, "seconds": seconds * t / rounds}
    conf = {"algorithm": "fedbn", "seed": seed, "num-server-rounds": rounds, "every": 5, "tau0": 0.5,
            "model": "fashion-cnn", "dataset": "fashion-mnist"}
    return {"run_config": conf, "rounds": out}


def write_cell(folder: Path, runs: list[dict]) -> Path:
    folder.mkdir(parents=True)
    for data in runs:
        (folder / f"fedbn-seed{data['run_config']['seed']}.json").write_text(json.dumps(data))
    return folder


def test_the_replay_makes_the_decisions_the_study_s_lips_inertia_runs_recorded():
    """The offline replay against LIPS's own: the recorded ratios and stagnant counts of every mask round."""
    checked = 0
    for path in sorted((PREREG / "prereg-fmnist-dir0.1").glob("lips-inertia-seed*.json")):
        data = json.loads(path.read_text())
        for decision in pilot.replay_trigger(data):
            train = data["rounds"][str(decision["round"])]["train"]
            assert len(decision["stagnant"]) == train["lips-trigger-stagnant"], (path.name, decision["round"])
            recorded = {k.split("/", 1)[1]: v for k, v in train.items()
                        if k.startswith("lips-trigger-ratio/")}
            assert decision["ratios"] == pytest.approx(recorded, rel=1e-12, abs=0)
            if decision["ready"]:
                assert decision["edge"] == pytest.approx(train["lips-trigger-edge-ratio"], rel=1e-12)
                checked += 1
        masked = [d["round"] for d in pilot.replay_trigger(data) if d["stagnant"]]
        zeroed = sorted(int(r) for r, m in data["rounds"].items() if m["train"].get("lips-zeros", 0) > 0)
        assert masked == zeroed
    assert checked == 6 * 19  # every ready mask round (6, 11, ..., 96) of the six runs


def test_on_the_study_s_fedbn_runs_it_gives_the_study_s_inertia_numbers():
    cell = pilot.analyse_cell(PREREG / "prereg-fmnist-dir0.1")
    study = json.loads((PREREG / "summary.json").read_text())["prereg-fmnist-dir0.1"]["inertia"]
    assert cell["seeds"] == cell["measured"] == 6 and cell["arises_in"] == study["arises_in"] == 0
    assert not cell["arises"]
    for run, expected in zip(cell["runs"], study["rho"]):
        assert run["inertia"]["rho"] == pytest.approx(expected["rho"], rel=1e-12)
        assert run["groups"]["middle"] == pytest.approx(expected["middle"], rel=1e-12)
        assert run["groups"]["first"] == run["inertia"]["rho"]["conv1.0.weight"]
        assert run["groups"]["last"] == run["inertia"]["rho"]["fc.weight"]
    assert cell["layers"] == ["conv1.0.weight", *MIDDLE, "fc.weight"]
    assert cell["trigger"] == {"ready": 114, "fired": 5, "rate": 5 / 114}


def test_middle_layers_that_stop_moving_are_inertia_and_the_trigger_fires_on_them():
    run = pilot.analyse_run(fedbn_run(2000))
    assert run["inertia"]["arises"]  # middle rho 0.1 < half the edges' 1.0
    assert run["groups"] == pytest.approx({"first": 1.0, "middle": 0.1, "last": 1.0})
    # Baseline rounds 2-4; at round 6 the last 5 steps are still 0.1 (ratio 1); at 11 and 16 they are 0.01
    # (ratio 0.1 < 0.5 x the edges' 1): every middle layer stagnates.
    assert run["trigger"] == {"ready": 3, "fired": 2, "fired_rounds": [11, 16], "rate": 2 / 3,
                              "stagnant_layer_rounds": 8, "layer_rounds": 12}
    converging = pilot.analyse_run(fedbn_run(2001, middle_late=0.1))
    assert not converging["inertia"]["arises"] and converging["trigger"]["fired"] == 0


def test_a_cell_needs_inertia_in_every_seed_and_then_gets_a_costed_proposal(tmp_path):
    both = pilot.analyse_cell(write_cell(tmp_path / "both", [fedbn_run(2000), fedbn_run(2001)]))
    mixed = [fedbn_run(2000), fedbn_run(2001, middle_late=0.1)]
    one = pilot.analyse_cell(write_cell(tmp_path / "one", mixed))
    alone = pilot.analyse_cell(write_cell(tmp_path / "alone", [fedbn_run(2000)]))
    assert both["arises"] and both["arises_in"] == 2 and both["run_hours"] == pytest.approx(1.0)
    assert not one["arises"] and one["arises_in"] == 1
    assert not alone["arises"]  # one seed is not enough
    text = "\n".join(pilot.decision_lines({"both": both, "one": one}))
    assert "**both**: inertia arises in every seed" in text and "about 18.0 run-hours (9.0 hours" in text
    assert "one: inertia arises in 1 of 2 seeds only" in text and "did not reproduce" not in text
    plain = "\n".join(pilot.decision_lines({"one": one}))
    assert "did not reproduce offline at these scales" in plain
    partial = "\n".join(pilot.decision_lines({"one": one}, missing=("vgg6-n100", "vgg6-n50")))
    assert "Not run yet: vgg6-n100, vgg6-n50" in partial and "waits for vgg6-n100, vgg6-n50" in partial
    assert "did not reproduce" not in partial  # no conclusion over cells that were not run


def test_the_report_writes_its_tables_heatmaps_and_provenance(tmp_path):
    pytest.importorskip("matplotlib")
    write_cell(tmp_path / "results" / "resnet8-n50", [fedbn_run(2000), fedbn_run(2001)])
    record = pilot.report(tmp_path / "results", tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## resnet8-n50" in text and "it **arises** in this cell" in text
    assert "Not run yet: resnet8-n100, vgg6-n100, vgg6-n50" in text
    assert (tmp_path / "out" / "resnet8-n50-relative-step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["cells"]["resnet8-n50"]["arises_in"] == record["cells"]["resnet8-n50"]["arises_in"] == 2
    assert len(saved["provenance"]["commit"]) == 40 and len(saved["provenance"]["inputs"]) == 2
    assert saved["provenance"]["script"].endswith("pilot.py")


def test_a_continued_run_s_time_sums_its_segments():
    data = fedbn_run(2000, rounds=4, seconds=40.0)  # 10, 20, 30, 40 s
    data["rounds"]["3"]["seconds"], data["rounds"]["4"]["seconds"] = 5.0, 15.0  # continued after round 2
    assert pilot.run_seconds(data) == pytest.approx(20.0 + 15.0)


def test_the_runs_are_fedbn_on_each_cells_conf_seed_by_seed_resnet8_first():
    import torch

    from lips_flwr.experiments.runner.runs import prepare

    specs = pilot.run_specs()
    assert [s.name for s in specs] == [f"{cell}/fedbn-seed{seed}" for cell in pilot.CELLS for seed in (2000, 2001)]
    assert pilot.CELLS[:2] == ("resnet8-n100", "resnet8-n50")
    prepared = {s.name: prepare(s, Path("/nonexistent-out")) for s in specs}
    for name, run in prepared.items():
        cell, config = name.split("/")[0], run.run_config
        model, samples = cell.split("-n")
        assert (config["algorithm"], config["model"], config["samples-per-client"]) == ("fedbn", model, int(samples))
        assert (config["num-server-rounds"], config["alpha"], config["inertia-t0"]) == (100, 0.1, 2)
        assert config["seed"] == run.spec.seed and run.spec.num_nodes == 20
        assert run.identity["engine"] == ("stacked" if torch.cuda.is_available() else "sequential")
        assert not run.identity["lips_forced"]
    with pytest.raises(SystemExit, match="unknown cells"):
        pilot.run_specs(("resnet8-n25",))
