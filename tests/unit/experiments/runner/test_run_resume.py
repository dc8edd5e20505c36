"""A stopped sweep continued: bit for bit as the uninterrupted run, or from round 1 with a line saying why.

Issue 35, defect 1 (a continued run of ``examples/quickstart-message`` ended
elsewhere: its clients' FedBN state did not survive the stop) and defect 6
(damaged staging files were continued as if whole), and the sweep-level
Ctrl-C (:class:`SweepStopped`). A Ctrl-C is made by the sweep's progress
callback raising ``KeyboardInterrupt`` once round 2 is reported, as Python
raises it in the sweep's process at a Ctrl-C.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from runner_apps import make_app

from lips_flwr.experiments.runner.resume import CONTEXTS, claim_staging
from lips_flwr.experiments.runner.runs import RunSpec, prepare
from lips_flwr.experiments.runner.store import read_result
from lips_flwr.experiments.runner.sweep import SweepStopped, run_sweep

REPO = Path(__file__).resolve().parents[4]


def stop_at_round_2(lines: list[str]):
    def progress(line: str) -> None:
        lines.append(line)
        if "round 2/" in line:
            raise KeyboardInterrupt  # as Python raises it in the sweep's process at a Ctrl-C
    return progress


def quiet(line: str) -> None:
    pass


def untimed(per_round: dict) -> dict:
    """The strategy's per-round metrics without its timings (``lips-seconds``: wall time, never equal)."""
    return {r: {k: v for k, v in metrics.items() if not k.endswith("-seconds")}
            for r, metrics in per_round.items()}


@pytest.mark.integration  # three sweeps of a torch app (~30 s on 2 loaded cores): not in `make test-fast`
def test_a_continued_run_of_quickstart_message_equals_the_uninterrupted_run(tmp_path):
    """Defect 1: its clients' FedBN state is the runner's to keep; the result says from where it went on."""
    spec = RunSpec(REPO / "examples" / "quickstart-message", "b-seed2", 2,
                   {"num-server-rounds": 3, "samples-per-client": 60, "local-epochs": 1}, num_nodes=2,
                   engine="sequential")
    whole = read_result(run_sweep([spec], tmp_path / "whole", jobs=1, progress=quiet)[0])
    lines: list[str] = []
    with pytest.raises(SweepStopped, match="stopped; run the same command to continue"):
        run_sweep([spec], tmp_path / "stopped", jobs=1, progress=stop_at_round_2(lines))
    lines.clear()
    again = read_result(run_sweep([spec], tmp_path / "stopped", jobs=1, progress=lines.append)[0])
    assert any("continuing its stopped run" in line for line in lines)
    assert again.observed["rounds"] == whole.observed["rounds"]  # every metric, every step, bit for bit
    assert untimed(again.app["train_metrics"]) == untimed(whole.app["train_metrics"])
    assert untimed(again.app["evaluate_metrics"]) == untimed(whole.app["evaluate_metrics"])
    assert whole.provenance["resumed_from_round"] is None
    # stopped once round 2 trained: its checkpoint is round 1's (or round 2's, when the stop came later)
    assert again.provenance["resumed_from_round"] in (2, 3)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> tuple[RunSpec, Path, Path]:
    """The tiny LIPS app's sweep stopped in round 2: ``(spec, its out folder, the uninterrupted result)``."""
    root = tmp_path_factory.mktemp("stopped")
    app = make_app(root / "app", lips=True, resumable=True, state_dir=True, rounds=4)
    spec = RunSpec(app, "b-seed1", 1, {"sleep": 0.3}, num_nodes=2, engine="sequential")
    whole = run_sweep([spec], root / "whole", jobs=1, progress=quiet)[0]
    lines: list[str] = []
    with pytest.raises(SweepStopped) as err:
        run_sweep([spec], root / "out", jobs=1, progress=stop_at_round_2(lines))
    assert err.value.runs == ["b-seed1"] and isinstance(err.value, KeyboardInterrupt)
    staging = root / "out" / ".staging" / "b-seed1"
    assert (staging / "checkpoint.npz").is_file() and (staging / CONTEXTS / "round-1.npz").is_file()
    assert not (root / "out" / "b-seed1.json").exists() and not (root / "out" / ".sweep.lock").exists()
    return spec, root / "out", whole


def copy_of(stopped, tmp_path: Path) -> tuple[RunSpec, Path, Path]:
    spec, out, whole = stopped
    shutil.copytree(out, tmp_path / "out")
    return spec, tmp_path / "out", whole


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def client_state_file(staging: Path) -> Path:
    """The app's own client-state file (``lips-state-dir``): the tiny app keeps none, so one is made."""
    from lips_flwr.persistence.npz_store import write_groups

    path = staging / "clients" / "lips-client-0123456789abcdef0123456789abcdef-0.npz"
    write_groups(path, {"lips-local": {"bn": np.ones(3, np.float32)}}, {"format": "lips-flwr-client-state",
                                                                       "configs": {}, "round": 1})
    return path


def checkpoint_round(staging: Path) -> int:
    from lips_flwr.persistence.checkpoint import load_checkpoint

    return load_checkpoint(staging / "checkpoint.npz").round


@pytest.mark.slow
@pytest.mark.parametrize("damaged", ["observed.json", "last-global.npz", "checkpoint.npz", CONTEXTS,
                                     "clients"])
def test_a_damaged_staging_file_starts_the_run_again_at_round_1_naming_the_file(stopped, tmp_path, damaged):
    """Defect 6: never continued partially; the line names the file."""
    spec, out, _ = copy_of(stopped, tmp_path)
    job = prepare(spec, out)
    paths = {"clients": lambda: client_state_file(job.staging),
             CONTEXTS: lambda: job.staging / CONTEXTS / f"round-{checkpoint_round(job.staging)}.npz"}
    path = paths.get(damaged, lambda: job.staging / damaged)()
    lines: list[str] = []
    assert claim_staging(prepare(spec, out), lines.append) is True  # whole, it would be continued
    truncate(path)
    assert claim_staging(job, lines.append) is False
    assert repr(str(path)) in lines[-1] and lines[-1].endswith("starting at round 1")
    assert sorted(p.name for p in job.staging.iterdir()) == ["identity.json"]


@pytest.mark.slow
def test_observations_that_lack_a_round_the_checkpoint_holds_are_not_continued(stopped, tmp_path):
    import json

    spec, out, _ = copy_of(stopped, tmp_path)
    job = prepare(spec, out)
    observed = json.loads((job.staging / "observed.json").read_text())
    del observed["rounds"]["1"]  # whole JSON, but not the run the checkpoint continues
    (job.staging / "observed.json").write_text(json.dumps(observed))
    lines: list[str] = []
    assert claim_staging(job, lines.append) is False
    assert "observed.json' lacks round 1, which the checkpoint holds (round " in lines[-1]


@pytest.mark.slow
def test_a_truncated_last_global_model_gives_the_uninterrupted_result_not_a_bad_zip_file(stopped, tmp_path):
    """Today: ``BadZipFile`` and the progress deleted; now a fresh run, equal to the uninterrupted one."""
    spec, out, whole = copy_of(stopped, tmp_path)
    truncate(out / ".staging" / "b-seed1" / "last-global.npz")
    lines: list[str] = []
    result = read_result(run_sweep([spec], out, jobs=1, progress=lines.append)[0])
    assert any("last-global.npz' is unreadable or damaged" in line and "starting at round 1" in line
               for line in lines)
    assert result.observed["rounds"] == read_result(whole).observed["rounds"]
    assert result.provenance["resumed_from_round"] is None


@pytest.mark.slow
def test_a_continued_tiny_run_equals_the_uninterrupted_one(stopped, tmp_path):
    spec, out, whole = copy_of(stopped, tmp_path)
    held = checkpoint_round(out / ".staging" / "b-seed1")
    result = read_result(run_sweep([spec], out, jobs=1, progress=quiet)[0])
    assert result.observed["rounds"] == read_result(whole).observed["rounds"]
    assert result.provenance["resumed_from_round"] == held + 1
    assert sorted(p.name for p in out.iterdir()) == ["b-seed1.json"]


def test_a_run_under_flwr_run_is_started_again_saying_why(tmp_path):
    app = make_app(tmp_path / "app", lips=True, resumable=True)
    job = prepare(RunSpec(app, "x", 1, num_nodes=2, engine="flwr"), tmp_path / "out")
    assert claim_staging(job, quiet) is False and not job.resumable
    lines: list[str] = []
    assert claim_staging(job, lines.append) is False
    assert "runs under `flwr run` are not continued" in lines[-1] and "starting at round 1" in lines[-1]


RESTART = [  # docs/restart.md's lines on top of the README's: LIPS checkpoints, the runner resumes
    ("pyproject.toml", 'data-path = "sequences.npz"\n',
     'data-path = "sequences.npz"\ncheckpoint-path = ""\nresume = "no"\n'),
    ("gru_fedavgm/server_app.py", "    strategy = LIPS(strategy, tau0=0.5, every=5)\n",
     '    strategy = LIPS(strategy, tau0=0.5, every=2, checkpoint_path=str(cfg["checkpoint-path"]) or None,\n'
     '                    resume=resume_option(cfg["resume"]))\n'),
    ("gru_fedavgm/server_app.py", "from lips_flwr.strategies import LIPS\n",
     "from lips_flwr.strategies import LIPS\nfrom lips_flwr.persistence.checkpoint import resume_option\n"),
]


@pytest.mark.integration  # three sweeps of a torch app (~30 s on 2 loaded cores)
def test_a_continued_gru_run_under_fedavgm_equals_the_uninterrupted_run(tmp_path):
    """FedAvgM's momentum (in LIPS's checkpoint) and the GRU's FedBN state (the runner's) both continue."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from test_compare_jobs_and_stop import SWAP, make_sequences
    from test_swap_in import APPS, _apply

    app = tmp_path / "gru-fedavgm"
    shutil.copytree(APPS / "gru-fedavgm", app, ignore=shutil.ignore_patterns("__pycache__"))
    _apply(app, [*SWAP, *RESTART])
    make_sequences(tmp_path / "sequences.npz")
    spec = RunSpec(app, "b-seed3", 3, {"num-server-rounds": 4, "data-path": str(tmp_path / "sequences.npz")},
                   num_nodes=2, engine="sequential")
    whole = read_result(run_sweep([spec], tmp_path / "whole", progress=quiet)[0])
    with pytest.raises(SweepStopped):
        run_sweep([spec], tmp_path / "stopped", progress=stop_at_round_2([]))
    lines: list[str] = []
    again = read_result(run_sweep([spec], tmp_path / "stopped", progress=lines.append)[0])
    assert any("continuing its stopped run" in line for line in lines)
    assert again.observed["rounds"] == whole.observed["rounds"]
    assert again.provenance["resumed_from_round"] in (2, 3)
