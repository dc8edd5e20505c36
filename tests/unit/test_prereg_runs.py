"""prereg.py's runs: what a stopped, a failed and a changed run leave for the next call (run_one_batched faked).

The real stop-and-continue, with the paper app, is
tests/integration/test_paper_app.py::test_a_stopped_study_run_continues_from_its_last_round_with_the_same_numbers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

PAPER = Path(__file__).resolve().parents[2] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

import prereg  # noqa: E402

CONF = {"num-server-rounds": 4, "lr": 0.05, "dataset-path": "/data/a"}


def fake_run(calls: list, outcome: BaseException | None = None):
    """A run_one_batched that records what it found and writes (or half-writes) its partial results."""

    def run(conf, nodes, method, seed, partial, engine, name=None):
        state = Path(conf["checkpoint-path"]).parent
        calls.append({"conf": conf, "partial existed": partial.exists(), "state": sorted(
            p.name for p in state.iterdir())})
        partial.write_text(json.dumps({"rounds": {"1": {}}}))
        (state / "checkpoint.npz").write_bytes(b"x")
        if outcome is not None:
            raise outcome

    return run


def task(tmp_path: Path, conf=CONF) -> tuple:
    return (conf, 3, "lips", 1000, str(tmp_path / "lips-seed1000.json"), "sequential")


def hidden(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_a_finished_run_leaves_only_its_results(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls))
    prereg.run_task(*task(tmp_path))
    assert hidden(tmp_path) == ["lips-seed1000.json"]
    conf = calls[0]["conf"]
    assert conf["resume"] == "auto" and Path(conf["checkpoint-path"]).parent.name == ".lips-seed1000.state"
    assert Path(conf["lips-state-dir"]).parent == Path(conf["checkpoint-path"]).parent
    prereg.run_task(*task(tmp_path))  # finished already: not run again
    assert len(calls) == 1


def test_a_stopped_run_keeps_its_state_and_the_next_call_continues_it(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prereg.run_task(*task(tmp_path))
    assert hidden(tmp_path) == [".lips-seed1000.json.partial", ".lips-seed1000.state"]
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls))
    moved = dict(CONF, **{"dataset-path": "/elsewhere"})  # the data path may differ between machines
    prereg.run_task(*task(tmp_path, moved))
    assert calls[1]["partial existed"] and "checkpoint.npz" in calls[1]["state"]
    assert hidden(tmp_path) == ["lips-seed1000.json"]


@pytest.mark.parametrize("failure", [SystemExit("no client trained"), RuntimeError("server app bug")])
def test_a_failed_run_leaves_nothing_so_that_the_next_call_starts_it_again(tmp_path, monkeypatch, failure):
    """Before: its partial results and a checkpoint of the last round stayed, and every later call failed."""
    calls: list = []
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls, failure))
    with pytest.raises(type(failure)):
        prereg.run_task(*task(tmp_path))
    assert hidden(tmp_path) == []


def test_a_stopped_run_with_other_settings_starts_again_from_round_one(tmp_path, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prereg.run_task(*task(tmp_path))
    monkeypatch.setattr(prereg, "run_one_batched", fake_run(calls))
    prereg.run_task(*task(tmp_path, dict(CONF, lr=0.1)))
    assert not calls[1]["partial existed"] and calls[1]["state"] == ["settings.json"]
    assert "other settings: starting again from round 1" in capsys.readouterr().out


def test_a_state_folder_left_beside_finished_results_is_removed(tmp_path, monkeypatch):
    """A run stopped between its results taking their name and its state folder going."""
    monkeypatch.setitem(prereg.PLAN, "test", [("prereg-fmnist-dir0.1", ("lips",))])
    folder = tmp_path / "prereg-fmnist-dir0.1"
    (folder / ".lips-seed1000.state").mkdir(parents=True)
    (folder / "lips-seed1000.json").write_text("{}")
    prereg.run("test", tmp_path, 1, "sequential", (1000,))
    assert hidden(folder) == ["lips-seed1000.json"]


def test_the_gpu_regime_runs_its_runs_in_processes_with_one_blas_thread(tmp_path, monkeypatch):
    """One run per core: numpy's OpenBLAS must not start a thread per core in each run's process."""
    assert prereg.RUN_ENV["gpu"]["OPENBLAS_NUM_THREADS"] == "1" and prereg.RUN_ENV["cpu"] == {}
    monkeypatch.setitem(prereg.PLAN, "test", [("prereg-fmnist-dir0.1", ("lips",))])
    monkeypatch.setitem(prereg.RUN_ENV, "test", {"LIPS_TEST_RUN_ENV": "1"})
    monkeypatch.setenv("LIPS_TEST_RUN_ENV", "caller's")
    seen = []

    class Pool:  # the worker processes see the environment run() set before starting them
        def __init__(self, jobs, mp_context):
            seen.append((jobs, os.environ.get("LIPS_TEST_RUN_ENV")))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            future = prereg.concurrent.futures.Future()
            future.set_result(args[4])
            return future

    monkeypatch.setattr(prereg.concurrent.futures, "ProcessPoolExecutor", Pool)
    prereg.run("test", tmp_path, 1, "sequential", (1000,))  # one job, still in a fresh process
    assert seen == [(1, "1")]
    assert os.environ["LIPS_TEST_RUN_ENV"] == "caller's"  # restored once the workers are done
