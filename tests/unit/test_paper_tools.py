"""The paper app's grid table and plot, on synthetic results files (no Flower run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[2] / "examples" / "paper"


def load(name):
    sys.path.insert(0, str(PAPER))
    spec = importlib.util.spec_from_file_location(name, PAPER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(folder: Path, algorithm: str, seed: int, accs: list[float]) -> None:
    rounds = {str(r + 1): {"train": {"acc-before": a + 0.1}, "evaluate": {"acc-after": a}}
              for r, a in enumerate(accs)}
    summary = {"acc-after-last": accs[-1], "acc-after-best": max(accs),
               "acc-before-last": accs[-1] + 0.1, "acc-before-best": max(accs) + 0.1}
    data = {"run_config": {"algorithm": algorithm, "seed": seed}, "rounds": rounds, "summary": summary}
    (folder / f"{algorithm}-seed{seed}.json").write_text(json.dumps(data))


def test_table_reports_mean_std_and_paired_differences(tmp_path):
    write_run(tmp_path, "fedbn", 0, [0.5, 0.6])
    write_run(tmp_path, "fedbn", 1, [0.5, 0.7])
    write_run(tmp_path, "lips", 0, [0.5, 0.65])
    write_run(tmp_path, "lips", 1, [0.8, 0.75])
    text = load("run_grid").table(tmp_path)
    lips = next(line for line in text.splitlines() if line.startswith("lips"))
    assert "0.7000 +- 0.0500" in lips  # last-round mean +- std over the two seeds
    assert "+0.0500 (n=2)" in lips  # paired: (0.05 + 0.05) / 2


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path, "fedbn", 0, [0.5, 0.6, 0.7])
    write_run(tmp_path, "lips", 0, [0.5, 0.65, 0.72])
    out = load("plot").plot_accuracy(tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_config_string_quotes_strings():
    grid = load("run_grid")
    assert grid.run_config_string({"a": 1, "b": "x", "c": 0.5, "d": True}) == "a=1 b='x' c=0.5 d=true"
    assert grid.parse_overrides(["num-server-rounds=10", "dataset='digits'", "tau0=0.7"]) == {
        "num-server-rounds": 10, "dataset": "digits", "tau0": 0.7}


def test_heatmap_from_a_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    rounds = {str(r): {"train": {"inertia-cos-t0/conv1.weight": 1 - 0.01 * r,
                                 "inertia-cos-t0/fc.weight": 1 - 0.05 * r}} for r in range(3, 8)}
    path = tmp_path / "lips-seed0.json"
    path.write_text(json.dumps({"run_config": {"algorithm": "lips", "seed": 0, "inertia-t0": 2},
                                "rounds": rounds, "summary": {}}))
    out = load("plot").plot_heatmap(path)
    assert out.name == "lips-seed0-heatmap.png" and out.read_bytes()[:4] == b"\x89PNG"
    path.write_text(json.dumps({"run_config": {}, "rounds": {"1": {"train": {}}}, "summary": {}}))
    with pytest.raises(ValueError, match="no inertia-cos-t0"):
        load("plot").plot_heatmap(path)


def test_a_recording_from_a_later_round_keeps_the_results_files_earlier_rounds(tmp_path):
    """What a resumed run does: its first round is the checkpoint's + 1 (4 here, the crash lost 5)."""
    sys.path.insert(0, str(PAPER))
    from flwr.serverapp.strategy import FedAvg
    from lips_paper.server_app import RecordingLIPS

    results = tmp_path / "run.json"
    rounds = {str(r): {"train": {"acc-before": r / 10}} for r in range(1, 6)}
    results.write_text(json.dumps({"run_config": {}, "rounds": rounds, "summary": {}}))

    def recorder():
        return RecordingLIPS(FedAvg(), results_path=str(results), run_config={"x": 1}, eval_every=1,
                             num_rounds=10)

    recorder()._save(4, "train", {"acc-before": 0.9})
    data = json.loads(results.read_text())
    assert sorted(data["rounds"], key=int) == ["1", "2", "3", "4"]
    assert data["rounds"]["3"]["train"]["acc-before"] == 0.3
    assert data["rounds"]["4"]["train"]["acc-before"] == 0.9
    recorder()._save(1, "train", {"acc-before": 0.1})  # a run from round 1 keeps nothing of an old file
    assert list(json.loads(results.read_text())["rounds"]) == ["1"]
