"""run_grid.py on a fake Flower: a run whose clients all failed fails the grid; a grid is all or nothing.

No `flwr run` here: the fake writes the results file the paper's ServerApp
would write (``RecordingLIPS``) and serves the log text of ``flwr log``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_paper_tools import load

# What `flwr log` shows when every ClientApp fails to load its data (a real run, shortened).
EMPTY_FOLDER_LOG = """\
Using SuperLink: local (127.0.0.1:39343)
\x1b[92mINFO \x1b[0m:      Starting Flower Simulation
\x1b[92mINFO \x1b[0m:      [ROUND 1/2]
\x1b[92mINFO \x1b[0m:      configure_train: Sampled 2 nodes (out of 2)
/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray
  warnings.warn(
\x1b[91mERROR \x1b[0m:     An exception was raised when processing a message by RayBackend
\x1b[91mERROR \x1b[0m:     \x1b[36mray::ClientAppActor.run()\x1b[39m (pid=32283, ip=192.0.2.2, actor_id=16dd)
                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/flwr/clientapp/client_app.py", line 161, in __call__
    return self._registered_funcs[full_name](message, context)
  File "/apps/lips_paper/client_app.py", line 52, in client_tensors
    data = load_dataset(dataset, path or None, seed)
  File "/work/main/lips_flwr/experiments/data/datasets.py", line 87, in load_fashion_mnist
    raise FileNotFoundError(
FileNotFoundError: no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in /tmp/empty

The above exception was the direct cause of the following exception:

\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=32283, ip=192.0.2.2, actor_id=16dd)
  File "/venv/lib/python3.11/site-packages/flwr/simulation/ray_transport/ray_actor.py", line 65, in run
    raise ClientAppException(str(ex)) from ex
flwr.clientapp.client_app.ClientAppException:\x20
Exception ClientAppException occurred. Message: no Fashion-MNIST IDX files (...) in /tmp/empty
\x1b[91mERROR \x1b[0m:     Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/flwr/server/superlink/fleet/vce/vce_api.py", line 132, in worker
    out_mssg, updated_context = backend.process_message(message, context)
ray.exceptions.RayTaskError(ClientAppException): \x1b[36mray::ClientAppActor.run()\x1b[39m (pid=32283)
FileNotFoundError: no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in /tmp/empty
\x1b[92mINFO \x1b[0m:      [ROUND 2/2]
\x1b[92mINFO \x1b[0m:      Strategy execution finished in 19.31s
\x1b[92mINFO \x1b[0m:      	Aggregated ClientApp-side Train Metrics:
\x1b[92mINFO \x1b[0m:      	{}
"""

# Offline, without Debian's dataset-fashion-mnist: torchvision's download fails.
OFFLINE_LOG = """\
\x1b[92mINFO \x1b[0m:      [ROUND 1/2]
\x1b[91mERROR \x1b[0m:     An exception was raised when processing a message by RayBackend
\x1b[91mERROR \x1b[0m:     \x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1, ip=192.0.2.2)
  File "/venv/lib/python3.11/site-packages/torchvision/datasets/mnist.py", line 197, in download
    raise RuntimeError(s)
RuntimeError: Error downloading train-images-idx3-ubyte.gz:
Tried http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/, got:
<urlopen error [Errno -2] Name or service not known>

The above exception was the direct cause of the following exception:

flwr.clientapp.client_app.ClientAppException:\x20
\x1b[92mINFO \x1b[0m:      [ROUND 2/2]
"""

CLEAN_LOG = "\x1b[92mINFO \x1b[0m:      [ROUND 1/2]\n\x1b[92mINFO \x1b[0m:      [ROUND 2/2]\n"


def results_file(path: Path, algorithm: str, seed: int, rounds: int, *, trained: bool = True,
                 tag: str = "", evaluated: bool = True) -> None:
    """What RecordingLIPS writes: every round's train metrics ({} when no client trained)."""
    data = {"run_config": {"algorithm": algorithm, "seed": seed, "tag": tag}, "rounds": {}, "summary": {}}
    for r in range(1, rounds + 1):
        entry = {"train": {"acc-before": 0.5 + r / 100, "num-examples": 40} if trained else {},
                 "seconds": 1.0}
        if evaluated and trained:
            entry["evaluate"] = {"acc-after": 0.4 + r / 100, "num-examples": 80}
        data["rounds"][str(r)] = entry
    if trained:
        data["summary"] = {"acc-after-last": 0.4 + rounds / 100, "acc-after-best": 0.4 + rounds / 100,
                           "acc-before-last": 0.5 + rounds / 100, "acc-before-best": 0.5 + rounds / 100}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class FakeFlower:
    """A LocalFlower whose runs write what ``plan[(algorithm, seed)]`` says."""

    def __init__(self, plan: dict | None = None, rounds: int = 2, tag: str = "") -> None:
        self.plan, self.rounds, self.tag = plan or {}, rounds, tag
        self.runs: dict[str, tuple[str, int, str]] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, app, run_config: str, federation: str) -> str:
        values = dict(re.findall(r"(\S+?)=('[^']*'|\S+)", run_config))
        algorithm, seed = values["algorithm"].strip("'"), int(values["seed"])
        path = Path(values["results-path"].strip("'"))
        what = self.plan.get((algorithm, seed), "ok")
        if what == "interrupted":
            raise KeyboardInterrupt
        if what != "no-file":
            results_file(path, algorithm, seed, self.rounds, trained=what == "ok", tag=self.tag)
        run_id = str(1000 + len(self.runs))
        self.runs[run_id] = (algorithm, seed, what)
        return run_id

    def wait(self, run_id, timeout=600.0, progress=None, progress_every=10.0) -> str:
        return "finished:failed" if self.runs[run_id][2] == "server-failed" else "finished:completed"

    def logs(self, run_id) -> str:
        what = self.runs[run_id][2]
        return {"clients-failed": EMPTY_FOLDER_LOG, "offline": OFFLINE_LOG}.get(what, CLEAN_LOG)


@pytest.fixture
def grid(monkeypatch):
    module = load("run_grid")
    monkeypatch.setattr(module.signal, "signal", lambda *args: None)  # leave pytest's SIGTERM alone
    monkeypatch.setattr(module, "plot_accuracy", lambda folder, out=None: Path(folder) / "accuracy.png")
    return module


def conf(tmp_path: Path, rounds: int = 2) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(f"dataset = 'fashion-mnist'\nnum-server-rounds = {rounds}\n\n"
                    "[federation]\nnum-supernodes = 2\n")
    return path


def run_main(grid, monkeypatch, tmp_path, flower, algorithms="fedbn,lips", seeds="0"):
    monkeypatch.setattr(grid, "local_flower", lambda *args, **kwargs: flower)
    monkeypatch.setattr(grid.sys, "argv", ["run_grid.py", str(conf(tmp_path)), "--algorithms", algorithms,
                                           "--seeds", seeds, "--out", str(tmp_path / "out"),
                                           "--engine", "flwr"])
    grid.main()


# --------------------------------------------------------------------------- a failed run fails


@pytest.mark.parametrize("what, error", [
    ("clients-failed", "FileNotFoundError: no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) "
                       "in /tmp/empty"),
    ("offline", "RuntimeError: Error downloading train-images-idx3-ubyte.gz:\nTried http://fashion-mnist."
                "s3-website.eu-central-1.amazonaws.com/, got:\n<urlopen error [Errno -2] Name or service "
                "not known>"),
])
def test_a_run_whose_clients_all_failed_fails_with_their_first_error(grid, tmp_path, what, error):
    flower = FakeFlower({("fedbn", 0): what})
    results = tmp_path / "fedbn-seed0.json"
    with pytest.raises(SystemExit) as exc:
        grid.run_one(flower, {"num-server-rounds": 2}, "num-supernodes=2", "fedbn", 0, results, 60)
    message = str(exc.value.code)
    assert exc.value.code not in (0, None)
    assert "no client trained" in message
    assert error in message


def test_main_exits_non_zero_prints_the_error_and_no_table(grid, tmp_path, monkeypatch, capsys):
    flower = FakeFlower({("fedbn", 0): "clients-failed", ("lips", 0): "clients-failed"})
    with pytest.raises(SystemExit) as exc:
        run_main(grid, monkeypatch, tmp_path, flower)
    assert exc.value.code not in (0, None)
    assert "FileNotFoundError: no Fashion-MNIST IDX files" in str(exc.value.code)
    out = capsys.readouterr().out
    assert "done" not in out and "client-mean test accuracy" not in out and "plot:" not in out
    assert not list((tmp_path / "out").glob("tiny/*.json"))  # nothing of the failed grid kept


def test_first_error_finds_the_clients_exception():
    from lips_flwr.experiments.local_flower import first_error

    found = first_error(EMPTY_FOLDER_LOG)
    assert found is not None
    assert found.splitlines()[-1] == ("FileNotFoundError: no Fashion-MNIST IDX files "
                                      "(train-images-idx3-ubyte[.gz], ...) in /tmp/empty")
    assert "datasets.py\", line 87, in load_fashion_mnist" in found  # where it was raised
    assert "\x1b[" not in found
    assert first_error(CLEAN_LOG) is None


def test_results_check(grid, tmp_path):
    path = tmp_path / "r.json"
    assert "no results file" in grid.results_problem(path, 2)
    results_file(path, "fedbn", 0, 2)
    assert grid.results_problem(path, 2) is None
    assert "rounds 3" in grid.results_problem(path, 3)  # a round missing
    results_file(path, "fedbn", 0, 2, trained=False)
    assert "no client trained" in grid.results_problem(path, 2)
    results_file(path, "fedbn", 0, 2, evaluated=False)
    assert "no client evaluated round 2" in grid.results_problem(path, 2)
    path.write_text("{not json")
    assert "not a readable results file" in grid.results_problem(path, 2)


def test_a_server_failure_still_shows_the_first_error(grid, tmp_path):
    flower = FakeFlower({("fedbn", 0): "server-failed"})
    flower.logs = lambda run_id: EMPTY_FOLDER_LOG
    with pytest.raises(SystemExit) as exc:
        grid.run_one(flower, {"num-server-rounds": 2}, "", "fedbn", 0, tmp_path / "r.json", 60)
    assert "ended as finished:failed" in str(exc.value.code)
    assert "FileNotFoundError: no Fashion-MNIST" in str(exc.value.code)


# --------------------------------------------------------------------------- all or nothing


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("second", ["clients-failed", "interrupted", "no-file"])
def test_an_interrupted_rerun_leaves_the_previous_results_untouched(grid, tmp_path, monkeypatch, second):
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="first"))
    folder = tmp_path / "out" / "tiny"
    before = snapshot(folder)
    assert sorted(before) == ["fedbn-seed0.json", "lips-seed0.json"]

    # The second `make main`: fedbn finishes (a new file), then lips fails or is stopped.
    with pytest.raises((SystemExit, KeyboardInterrupt)):
        run_main(grid, monkeypatch, tmp_path, FakeFlower({("lips", 0): second}, tag="second"))
    assert snapshot(folder) == before  # both files from the first run, whole
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny"]  # no staging left over


def test_a_finished_grid_replaces_the_folders_results(grid, tmp_path, monkeypatch, capsys):
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="first"), seeds="0,1")
    folder = tmp_path / "out" / "tiny"
    (folder / "notes.txt").write_text("mine")  # not a results file: kept
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="second"), algorithms="fedbn", seeds="0")
    assert sorted(p.name for p in folder.iterdir()) == ["fedbn-seed0.json", "notes.txt"]
    assert json.loads((folder / "fedbn-seed0.json").read_text())["run_config"]["tag"] == "second"
    out = capsys.readouterr().out
    assert "client-mean test accuracy" in out and "fedbn" in out


def test_the_study_keeps_no_results_of_a_failed_run(grid, tmp_path, monkeypatch):
    """study.py skips runs whose results exist: a failed run must leave none behind."""
    study = load("study")
    monkeypatch.setattr(study, "run_one", grid.run_one)
    results = tmp_path / "select" / "fedbn-seed0.json"
    with pytest.raises(SystemExit):
        study.run_into(FakeFlower({("fedbn", 0): "clients-failed"}), {"num-server-rounds": 2}, "",
                       "fedbn", 0, results, 60)
    assert not list((tmp_path / "select").iterdir())
    study.run_into(FakeFlower(), {"num-server-rounds": 2}, "", "fedbn", 0, results, 60)
    assert [p.name for p in (tmp_path / "select").iterdir()] == ["fedbn-seed0.json"]
    assert grid.results_problem(results, 2) is None
