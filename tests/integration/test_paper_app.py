"""End-to-end: the paper app under `flwr run` on offline digits, with its results file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lips_flwr.persistence.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration
APP = Path(__file__).resolve().parents[2] / "examples" / "paper"
RUN_TIMEOUT_S = float(os.environ.get("LIPS_IT_RUN_TIMEOUT", "240"))


def test_paper_app_runs_lips_and_records_every_round(flwr, tmp_path):
    """Also with a checkpoint and the clients' state kept on disk (simulation: run-config folder)."""
    results, checkpoint, states = tmp_path / "lips-seed0.json", tmp_path / "lips.npz", tmp_path / "clients"
    run_config = (
        "algorithm='lips' dataset='digits' model='digits-cnn' num-server-rounds=3 every=2 "
        "tau0=0.5 samples-per-client=60 test-samples=80 alpha=0.5 local-epochs=1 batch-size=30 "
        f"lr=0.05 results-path='{results}' checkpoint-path='{checkpoint}' lips-state-dir='{states}'"
    )
    run_id = flwr.run(APP, run_config, "num-supernodes=3 client-resources-num-cpus=1")
    status = flwr.wait(run_id, timeout=RUN_TIMEOUT_S)
    assert status == "finished:completed", flwr.logs(run_id)[-4000:]
    data = json.loads(results.read_text())
    assert data["run_config"]["algorithm"] == "lips"
    rounds = data["rounds"]
    assert sorted(rounds, key=int) == ["1", "2", "3"]
    # Round 3 is the final round: no mask after the last aggregation (was [1, 0, 1]: issue 35).
    assert [rounds[r]["train"]["lips-mask-round"] for r in ("1", "2", "3")] == [1, 0, 0]
    for entry in rounds.values():
        assert 0.0 <= entry["train"]["acc-before"] <= 1.0
        assert 0.0 <= entry["evaluate"]["acc-after"] <= 1.0
        assert entry["train"]["num-examples"] == 3 * 60
        assert entry["seconds"] > 0
    assert set(data["summary"]) == {"acc-after-last", "acc-after-best", "acc-before-last", "acc-before-best"}
    assert data["summary"]["acc-after-best"] >= data["summary"]["acc-after-last"]
    # inertia-t0 = 2 (default): round 3 is compared with round 2, layer by layer
    assert {k for k in rounds["3"]["train"] if k.startswith("inertia-cos-t0/")} == {
        f"inertia-cos-t0/{n}" for n in ("conv1.weight", "conv2.weight", "conv3.weight", "fc.weight")}
    saved = load_checkpoint(checkpoint)
    assert saved.round == 3 and sorted(saved.history["train"], key=int) == ["1", "2", "3"]
    assert saved.inertia["reference"] is not None  # the inertia series can continue
    # FedBN's local batch-norm tensors of each of the 3 clients, under the run's key
    assert sorted(p.name for p in states.iterdir()) == sorted(  # after the last two rounds
        f"lips-client-{saved.run_key}-{i}{last}.npz" for i in range(3) for last in ("", ".prev"))


def test_freeze_control_keeps_middle_layers_and_reports_validation(flwr, tmp_path):
    """The freeze ablation after round 1, with a validation split carved from training data."""
    results = tmp_path / "freeze-seed0.json"
    run_config = (
        "algorithm='freeze' freeze-round=1 inertia-t0=1 val-fraction=0.25 dataset='digits' "
        "model='digits-cnn' num-server-rounds=3 samples-per-client=60 test-samples=80 alpha=0.5 "
        f"local-epochs=1 batch-size=30 lr=0.05 results-path='{results}'"
    )
    run_id = flwr.run(APP, run_config, "num-supernodes=3 client-resources-num-cpus=1")
    assert flwr.wait(run_id, timeout=RUN_TIMEOUT_S) == "finished:completed", flwr.logs(run_id)[-4000:]
    data = json.loads(results.read_text())
    for rnd in ("2", "3"):
        train = data["rounds"][rnd]["train"]
        assert train["num-examples"] == 3 * 45  # 60 samples, 15 kept for validation
        for layer in ("conv2.weight", "conv3.weight"):  # the middle layers: frozen
            assert train[f"inertia-step/{layer}"] == 0.0
        assert train["inertia-step/fc.weight"] > 0.0  # the classifier still learns
    assert {"val-acc-after-last", "val-acc-before-best"} <= set(data["summary"])


def test_paper_app_rejects_an_unknown_algorithm(flwr, tmp_path):
    run_id = flwr.run(APP, "algorithm='fedsomething' dataset='digits' model='digits-cnn' num-server-rounds=1",
                      "num-supernodes=2 client-resources-num-cpus=1")
    assert flwr.wait(run_id, timeout=RUN_TIMEOUT_S) != "finished:completed"
    assert "`algorithm` must be one of" in flwr.logs(run_id)


def test_run_grid_fails_when_every_client_fails_to_load_its_data(tmp_path):
    """`flwr run` reports such a run as completed; run_grid.py must not (exit code, the clients' error)."""
    import subprocess
    import sys

    empty = tmp_path / "no-data"
    empty.mkdir()
    conf = tmp_path / "tiny.toml"
    conf.write_text("dataset = 'fashion-mnist'\nmodel = 'fashion-cnn'\nnum-server-rounds = 1\ninertia-t0 = 0\n"
                    "samples-per-client = 20\ntest-samples = 20\nlocal-epochs = 1\nbatch-size = 10\n\n"
                    "[federation]\nnum-supernodes = 2\n")
    out = tmp_path / "out"
    (out / "tiny").mkdir(parents=True)
    (out / "tiny" / "lips-seed0.json").write_text("{}")  # another grid's results: left alone
    proc = subprocess.run(
        [sys.executable, str(APP / "run_grid.py"), str(conf), "--algorithms", "fedbn", "--seeds", "0",
         "--out", str(out), "--timeout", str(RUN_TIMEOUT_S), "--set", f"dataset-path='{empty}'",
         "--engine", "flwr"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 120, check=False,
        env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"},
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "no client trained" in proc.stderr, proc.stderr[-4000:]
    assert f"FileNotFoundError: no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in {empty}" \
        in proc.stderr, proc.stderr[-4000:]
    assert "client-mean test accuracy" not in proc.stdout
    assert (out / "tiny" / "lips-seed0.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["tiny"]  # no staging, lock or Flower home left
    assert sorted(p.name for p in (out / "tiny").iterdir()) == ["lips-seed0.json"]


def test_the_batched_grid_is_the_same_experiment_as_flwr_run(flwr, tmp_path):
    """Five rounds of LIPS on the batched Grid and under `flwr run`: client-mean accuracies within 0.5 points.

    (Each node's round-1 reply equals the ClientApp's own: tests/unit/experiments/batched/test_grid.py.)
    """
    from lips_flwr.experiments.runner.apps import import_components, load_app, resolve_run_config
    from lips_flwr.experiments.batched import run_batched

    values = {"algorithm": "lips", "dataset": "digits", "model": "digits-cnn", "num-server-rounds": 5,
              "every": 2, "tau0": 0.5, "samples-per-client": 60, "test-samples": 80, "alpha": 0.5,
              "local-epochs": 1, "batch-size": 30, "lr": 0.05, "device": "cpu"}
    ours, theirs = tmp_path / "batched.json", tmp_path / "flwr.json"
    app = load_app(APP)
    server_app, client_app = import_components(app)
    grid = run_batched(server_app, client_app, num_nodes=3,
                       run_config=resolve_run_config(app, {**values, "results-path": str(ours)}))
    assert grid.first_error is None
    run_config = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in {**values, "results-path": str(theirs)}.items())
    run_id = flwr.run(APP, run_config, "num-supernodes=3 client-resources-num-cpus=1")
    assert flwr.wait(run_id, timeout=RUN_TIMEOUT_S) == "finished:completed", flwr.logs(run_id)[-4000:]
    a, b = (json.loads(p.read_text())["rounds"] for p in (ours, theirs))
    assert sorted(a, key=int) == sorted(b, key=int) == ["1", "2", "3", "4", "5"]
    for r in a:
        assert a[r]["train"]["lips-mask-round"] == b[r]["train"]["lips-mask-round"]
        assert abs(a[r]["evaluate"]["acc-after"] - b[r]["evaluate"]["acc-after"]) <= 0.005, r
        assert abs(a[r]["train"]["acc-before"] - b[r]["train"]["acc-before"]) <= 0.005, r


STUDY_RUN = {"dataset": "digits", "model": "digits-cnn", "num-server-rounds": 10, "every": 2, "tau0": 0.5,
             "samples-per-client": 60, "test-samples": 80, "alpha": 0.5, "local-epochs": 1, "batch-size": 30,
             "lr": 0.05, "device": "cpu", "eval-last": 2, "eval-before-every": 2, "algorithm": "lips"}
ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(APP.parents[1])}


def sweep_process(out: Path, values: dict = STUDY_RUN) -> subprocess.Popen:
    """One resumable paper-app run through the runner (``run_sweep``), in a process of its own."""
    code = ("import sys; from lips_flwr.experiments.runner.runs import RunSpec; "
            "from lips_flwr.experiments.runner.sweep import run_sweep; "
            f"run_sweep([RunSpec({str(APP)!r}, 'lips-seed1000', 1000, {values!r}, num_nodes=3, "
            f"engine='sequential')], {str(out)!r})")
    return subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def kill_after_round(proc: subprocess.Popen, staged_results: Path, rnd: int) -> None:
    """SIGKILL ``proc`` once the app's staged results file records round ``rnd`` (its run dies with it)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, f"the run ended before round {rnd}"
        try:
            if str(rnd) in json.loads(staged_results.read_text())["rounds"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def numbers(path: Path) -> tuple[dict, dict]:
    """A result file's per-round numbers (the app's, timings left out) and the runner's observations."""
    data = json.loads(path.read_text())
    timing = {"lips-seconds", "lips-checkpoint-seconds"}
    app = {r: {part: {k: v for k, v in m.items() if k not in timing} for part, m in e.items() if part != "seconds"}
           for r, e in data["app"]["rounds"].items()}
    return app, data["observed"]["rounds"]


def test_a_stopped_study_run_continues_from_its_last_round_with_the_same_numbers(tmp_path):
    """A runner's run is resumable: killed after round 3 of 10, the next sweep continues it.

    The run's checkpoint, its clients' FedBN state, the app's results file and
    the runner's observations wait in its staging folder; the continued run
    keeps the recorded rounds and gives the numbers of a run never stopped.
    Nothing is left beside the result file (issue 26, defect 2).
    """
    plain, stopped = tmp_path / "plain", tmp_path / "stopped"
    first = sweep_process(plain)
    assert first.wait(timeout=RUN_TIMEOUT_S) == 0, first.stderr.read()[-4000:]

    staging = stopped / ".staging" / "lips-seed1000"
    kill_after_round(sweep_process(stopped), staging / "app-results.json", 3)
    assert not (stopped / "lips-seed1000.json").exists()  # not finished: no result file
    done = load_checkpoint(staging / "checkpoint.npz").round
    assert 2 <= done < 10 and any((staging / "clients").iterdir())

    again = sweep_process(stopped)
    out, err = again.communicate(timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0, err[-4000:]
    assert "continuing its stopped run" in out
    assert sorted(str(p.relative_to(stopped)) for p in stopped.rglob("*")) == ["lips-seed1000.json"]
    (app_a, observed_a), (app_b, observed_b) = numbers(plain / "lips-seed1000.json"), numbers(
        stopped / "lips-seed1000.json")
    assert sorted(app_a, key=int) == sorted(app_b, key=int) == [str(r) for r in range(1, 11)]
    assert app_a == app_b
    assert observed_a == observed_b and sorted(observed_b, key=int) == [str(r) for r in range(1, 11)]
    provenance = json.loads((stopped / "lips-seed1000.json").read_text())["provenance"]
    assert len(provenance["earlier_segments"]) == 1  # the stopped process's environment, kept


# --------------------------------------------------------------------------- run_grid.py, issue 26


def grid_process(out: Path, *args: str) -> subprocess.Popen:
    conf = out.parent / "tiny.toml"
    conf.write_text("dataset = 'digits'\nmodel = 'digits-cnn'\nnum-server-rounds = 10\nevery = 2\n"
                    "samples-per-client = 60\ntest-samples = 80\nalpha = 0.5\nlocal-epochs = 1\n"
                    "batch-size = 30\nlr = 0.05\ndevice = 'cpu'\neval-last = 2\neval-before-every = 2\n\n"
                    "[federation]\nnum-supernodes = 3\n")
    return subprocess.Popen([sys.executable, str(APP / "run_grid.py"), str(conf), "--seeds", "0",
                             "--out", str(out), *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    return proc.returncode, out, err


def test_a_resumed_grid_keeps_only_its_own_runs_rounds(tmp_path):
    """Issue 26, defect 1: a killed tau0=0.5 grid, re-run, took its early rounds from the tau0=0.3 grid's file."""
    out = tmp_path / "out"
    code, _, err = finish(grid_process(out, "--algorithms", "lips", "--set", "tau0=0.3"))
    assert code == 0, err[-4000:]
    code, _, err = finish(grid_process(out, "--algorithms", "lips", "--set", "tau0=0.5"))
    assert code != 0 and "run_config.tau0: file 0.3, now 0.5" in err  # refused before running
    command = ("--algorithms", "lips", "--set", "tau0=0.5", "--recompute")
    kill_after_round(grid_process(out, *command), out / ".staging" / "tiny" / "lips-seed0" / "app-results.json", 3)
    code, stdout, err = finish(grid_process(out, *command))
    assert code == 0, err[-4000:]
    assert "continuing its stopped run" in stdout
    data = json.loads((out / "tiny" / "lips-seed0.json").read_text())
    assert data["identity"]["run_config"]["tau0"] == 0.5 and data["app"]["run_config"]["tau0"] == 0.5
    rounds = data["app"]["rounds"]
    assert sorted(rounds, key=int) == [str(r) for r in range(1, 11)]
    assert rounds["1"]["train"]["lips-tau"] == 0.5  # the 0.5 run's round 1, not the 0.3 run's


def test_a_killed_grid_resumes_and_leaves_no_clutter(tmp_path):
    """Issue 26, defect 2: a killed resumable grid never finished, and killed grids left staging folders.

    A smaller grid into the folder continues its own stopped run and keeps the other's progress (it
    deleted it before: `pilot.py run --cells ...` after a stopped run of another cell); once both ran,
    nothing but results is left.
    """
    out = tmp_path / "out"
    both = grid_process(out, "--algorithms", "lips,fedbn", "--jobs", "2")
    kill_after_round(both, out / ".staging" / "tiny" / "lips-seed0" / "app-results.json", 3)
    fedbn = out / ".staging" / "tiny" / "fedbn-seed0"
    assert fedbn.is_dir()  # the other run was going too
    code, stdout, err = finish(grid_process(out, "--algorithms", "lips"))
    assert code == 0, err[-4000:]
    assert "[tiny/lips-seed0] continuing its stopped run" in stdout
    assert any("fedbn-seed0" in line and "a stopped run's staging" in line for line in stdout.splitlines())
    assert (fedbn / "identity.json").is_file()  # kept, for a grid that runs it
    code, stdout, err = finish(grid_process(out, "--algorithms", "lips,fedbn"))
    assert code == 0, err[-4000:]
    assert "[tiny/fedbn-seed0] continuing its stopped run" in stdout
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "tiny", "tiny/accuracy.png", "tiny/fedbn-seed0.json", "tiny/lips-seed0.json"]  # no staging, lock, tmp
    data = json.loads((out / "tiny" / "lips-seed0.json").read_text())
    assert sorted(data["app"]["rounds"], key=int) == sorted(data["observed"]["rounds"], key=int) == [
        str(r) for r in range(1, 11)]
