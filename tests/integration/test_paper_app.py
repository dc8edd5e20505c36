"""End-to-end: the paper app under `flwr run` on offline digits, with its results file."""

from __future__ import annotations

import json
import os
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
    assert [rounds[r]["train"]["lips-mask-round"] for r in ("1", "2", "3")] == [1, 0, 1]
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
    (out / "tiny" / "fedbn-seed0.json").write_text("{}")  # an earlier grid's results: left alone
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
    assert (out / "tiny" / "fedbn-seed0.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".flwr")) == ["tiny"]


def test_the_batched_grid_is_the_same_experiment_as_flwr_run(flwr, tmp_path):
    """Five rounds of LIPS on the batched Grid and under `flwr run`: client-mean accuracies within 0.5 points.

    (Each node's round-1 reply equals the ClientApp's own: tests/unit/test_batched_grid.py.)
    """
    import sys

    sys.path.insert(0, str(APP))
    from batched import run_paper

    values = {"algorithm": "lips", "dataset": "digits", "model": "digits-cnn", "num-server-rounds": 5,
              "every": 2, "tau0": 0.5, "samples-per-client": 60, "test-samples": 80, "alpha": 0.5,
              "local-epochs": 1, "batch-size": 30, "lr": 0.05, "device": "cpu"}
    ours, theirs = tmp_path / "batched.json", tmp_path / "flwr.json"
    assert run_paper({**values, "results-path": str(ours)}, num_nodes=3) is None
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


def test_a_stopped_study_run_continues_from_its_last_round_with_the_same_numbers(tmp_path):
    """prereg.py's runs are resumable: killed after round 3 of 10, the next call continues it.

    The run's checkpoint and its clients' FedBN state live in a hidden folder
    beside the partial results; the continued run keeps the recorded rounds
    (the results file's bookkeeping is not strategy state that a resume
    restores) and gives the numbers of a run never stopped.
    """
    import signal
    import subprocess
    import sys
    import time

    values = {"dataset": "digits", "model": "digits-cnn", "num-server-rounds": 10, "every": 2, "tau0": 0.5,
              "samples-per-client": 60, "test-samples": 80, "alpha": 0.5, "local-epochs": 1,
              "batch-size": 30, "lr": 0.05, "device": "cpu", "eval-last": 2, "eval-before-every": 2}
    code = ("import sys; sys.path.insert(0, {app!r}); import prereg; "
            "prereg.run_task({values!r}, 3, 'lips', 1000, {out!r}, 'sequential')")
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}

    def run(out: Path) -> subprocess.Popen:
        command = code.format(app=str(APP), values=values, out=str(out))
        return subprocess.Popen([sys.executable, "-c", command], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    plain, stopped = tmp_path / "plain" / "lips-seed1000.json", tmp_path / "stopped" / "lips-seed1000.json"
    for out in (plain, stopped):
        out.parent.mkdir()
    first = run(plain)
    assert first.wait(timeout=RUN_TIMEOUT_S) == 0, first.stderr.read()[-4000:]

    partial = stopped.with_name(".lips-seed1000.json.partial")
    state = stopped.with_name(".lips-seed1000.state")
    proc, deadline = run(stopped), time.monotonic() + RUN_TIMEOUT_S
    while True:  # stop it for good once round 3 is recorded (a checkpoint of round 2 or 3 exists)
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before round 3"
        try:
            if "3" in json.loads(partial.read_text())["rounds"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not stopped.exists()  # not finished: nothing under the results' name
    done = load_checkpoint(state / "checkpoint.npz").round
    assert 2 <= done < 10 and any((state / "clients").iterdir())

    again = run(stopped)
    assert again.wait(timeout=RUN_TIMEOUT_S) == 0, again.stderr.read()[-4000:]
    assert sorted(p.name for p in stopped.parent.iterdir()) == ["lips-seed1000.json"]  # state removed

    def numbers(path: Path) -> dict:
        timing = {"lips-seconds", "lips-checkpoint-seconds"}
        return {r: {part: {k: v for k, v in m.items() if k not in timing} for part, m in e.items()
                    if part != "seconds"} for r, e in json.loads(path.read_text())["rounds"].items()}

    a, b = numbers(plain), numbers(stopped)
    assert sorted(a, key=int) == sorted(b, key=int) == [str(r) for r in range(1, 11)]
    assert a == b
