"""prereg.py's runs through the one runner: their specs, what a stopped or changed run finds, the regimes' env.

The real stop-and-continue, with the paper app, is
tests/integration/test_paper_app.py::test_a_stopped_study_run_continues_from_its_last_round_with_the_same_numbers;
the runner's own behaviour is in test_runner_sweep.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[3] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import prereg  # noqa: E402

from lips_flwr.experiments.runner.resume import claim_staging  # noqa: E402
from lips_flwr.experiments.runner.runs import prepare  # noqa: E402
from lips_flwr.experiments.runner.store import write_result  # noqa: E402
from lips_flwr.experiments.runner.sweep import run_sweep  # noqa: E402
from runner_apps import make_app  # noqa: E402


def test_the_regimes_runs_go_stage_by_stage_and_seed_by_seed():
    specs = prereg.run_specs("cpu", "sequential", (1000, 1001))
    names = [s.name for s in specs]
    assert names[:5] == ["prereg-fmnist-dir0.1/fedbn-seed1000", "prereg-fmnist-dir0.1/lips-seed1000",
                         "prereg-fmnist-dir0.1/lips-random-seed1000", "prereg-fmnist-dir0.1/lips-inertia-seed1000",
                         "prereg-fmnist-dir0.1/fedbn-seed1001"]
    assert names[8] == "prereg-fmnist-dir1.0/fedbn-seed1000" and len(specs) == 2 * (4 + 2 + 5)
    assert all(s.num_nodes == 20 and s.location_keys == ("dataset-path",) and s.env == {} for s in specs)
    assert specs[0].overrides["algorithm"] == "fedbn" and specs[0].overrides["num-server-rounds"] == 100
    trial = prereg.run_specs("gpu", "stacked", (1000,), ["num-server-rounds=6", "dataset-path='/d'"], 8)
    assert [s.num_nodes for s in trial] == [8] * 4 and trial[0].overrides["num-server-rounds"] == 6
    assert trial[0].engine == "stacked" and trial[0].overrides["dataset-path"] == "/d"


def test_the_gpu_regime_runs_its_runs_in_processes_with_one_blas_thread():
    """One run per core: numpy's OpenBLAS must not start a thread per core in each run's process."""
    assert prereg.RUN_ENV["gpu"]["OPENBLAS_NUM_THREADS"] == "1" and prereg.RUN_ENV["cpu"] == {}
    assert all(s.env == prereg.RUN_ENV["gpu"] for s in prereg.run_specs("gpu", "sequential", (1000,)))


def test_the_data_path_is_where_the_data_is_not_part_of_a_runs_identity(tmp_path):
    """A stopped GPU-regime run continues on a machine that keeps the data elsewhere."""
    here, there = (prepare(prereg.run_specs("gpu", "sequential", (1000,), [f"dataset-path='{p}'"])[0], tmp_path)
                   for p in ("/data/a", "/elsewhere"))
    assert here.identity == there.identity and "dataset-path" not in here.identity["run_config"]
    assert here.locations == {"dataset-path": "/data/a"}


def test_a_stopped_run_continues_only_with_its_own_identity(tmp_path):
    app = make_app(tmp_path / "app", resumable=True)
    out = tmp_path / "out"
    lines: list[str] = []
    first = prepare(prereg.RunSpec(app, "lips-seed1000", 1000, {"tau0": 0.5}, num_nodes=2), out)
    assert claim_staging(first, lines.append) is False  # nothing to continue: round 1
    (first.staging / "log").write_text("stopped before its first checkpoint\n")  # what a stopped run leaves
    assert claim_staging(first, lines.append) is True and "continuing its stopped run" in lines[-1]
    assert (first.staging / "log").exists()
    (first.staging / "checkpoint.npz").write_bytes(b"x")  # a damaged checkpoint: never continued from
    assert claim_staging(first, lines.append) is False
    assert "checkpoint.npz' is unreadable or damaged" in lines[-1] and "starting at round 1" in lines[-1]
    other = prepare(prereg.RunSpec(app, "lips-seed1000", 1000, {"tau0": 0.3}, num_nodes=2), out)
    assert claim_staging(other, lines.append) is False
    assert "another identity" in lines[-1] and "starting at round 1" in lines[-1]
    assert sorted(p.name for p in other.staging.iterdir()) == ["identity.json"]
    assert json.loads((other.staging / "identity.json").read_text())["run_config"]["tau0"] == 0.3
    plain = prepare(prereg.RunSpec(make_app(tmp_path / "plain"), "x", 1, num_nodes=2), out)
    plain.staging.mkdir(parents=True)
    (plain.staging / "identity.json").write_text(json.dumps(plain.identity))
    assert claim_staging(plain, lines.append) is False and "the app cannot resume" in lines[-1]


def test_a_staging_folder_left_beside_a_finished_result_is_removed(tmp_path):
    """A run stopped between writing its result and removing its staging folder."""
    app = make_app(tmp_path / "app", resumable=True)
    out = tmp_path / "out"
    spec = prereg.RunSpec(app, "conf/lips-seed1000", 1000, num_nodes=2, engine="sequential")
    job = prepare(spec, out)
    write_result(job.result, job.identity, {}, {}, None)
    (job.staging / "clients").mkdir(parents=True)
    (job.staging / "identity.json").write_text(json.dumps(job.identity))  # (claim_staging's first file)
    lines: list[str] = []
    run_sweep([spec], out, progress=lines.append)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["conf", "conf/lips-seed1000.json"]
    assert any("its run finished" in line for line in lines) and any("reused" in line for line in lines)


@pytest.mark.parametrize("regime", ["cpu", "gpu"])
def test_run_refuses_a_folder_holding_another_trial(tmp_path, regime):
    """Issue 26, defect 3: `prereg.py run` into a small trial's folder reported `0 runs to do`."""
    trial = prereg.run_specs(regime, "sequential", (1000,), ["dataset='digits'", "num-server-rounds=2"], 2)
    for spec in trial:
        job = prepare(spec, tmp_path)
        write_result(job.result, job.identity, {}, {}, None)
    with pytest.raises(ValueError) as err:
        prereg.run(regime, tmp_path, 1, "sequential", (1000,))
    text = str(err.value)
    assert 'run_config.dataset: file "digits", now "fashion-mnist"' in text
    assert "run_config.num-server-rounds: file 2, now" in text and "num_nodes: file 2, now" in text
    assert text.count("was computed with other settings") == len(trial)
    assert not (tmp_path / ".staging").exists() and os.listdir(tmp_path)
