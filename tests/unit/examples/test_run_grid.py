"""run_grid.py and study.py on a fake Flower: failed runs fail the grid, results are bound to their settings.

No `flwr run` here: the fake writes the results file the paper's ServerApp
would write (``RecordingLIPS``) and serves the log text of ``flwr log``; the
runner (``lips_flwr.experiments.runner.sweep``) around it is the real one.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

import lips_flwr.experiments.runner.flwr_runs as flwr_runs
from lips_flwr.experiments.runner.store import read_result
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
                 tag: str = "", evaluated: bool = True, run_config: dict | None = None) -> None:
    """What RecordingLIPS writes: every round's train metrics ({} when no client trained)."""
    config = {"algorithm": algorithm, "seed": seed, "tag": tag} if run_config is None else run_config
    data = {"run_config": config, "rounds": {}, "summary": {}}
    for r in range(1, rounds + 1):
        entry = {"train": {"acc-before": 0.5 + r / 100, "num-examples": 40} if trained else {},
                 "seconds": 1.0}
        if evaluated and trained:
            entry["evaluate"] = {"acc-after": 0.4 + r / 100, "val-acc-after": 0.3 + r / 100, "num-examples": 80}
        data["rounds"][str(r)] = entry
    if trained:
        data["summary"] = {"acc-after-last": 0.4 + rounds / 100, "acc-after-best": 0.4 + rounds / 100,
                           "acc-before-last": 0.5 + rounds / 100, "acc-before-best": 0.5 + rounds / 100}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class FakeFlower:
    """A LocalFlower whose runs write what ``plan[(algorithm, seed)]`` says.

    ``flwr run`` gets the run config as a TOML file (the runner writes one);
    the fake writes the app's results file where its ``results-path`` says.
    """

    def __init__(self, plan: dict | None = None, rounds: int = 2, tag: str = "") -> None:
        self.plan, self.rounds, self.tag = plan or {}, rounds, tag
        self.runs: dict[str, tuple[str, int, str]] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, app, run_config: str, federation: str) -> str:
        values = tomllib.loads(Path(run_config).read_text())
        algorithm, seed = values["algorithm"], int(values["seed"])
        path = Path(values["results-path"])
        what = self.plan.get((algorithm, seed), "ok")
        if what == "interrupted":
            raise KeyboardInterrupt
        if what != "no-file":
            results_file(path, algorithm, seed, self.rounds, trained=what == "ok", tag=self.tag,
                         run_config={**values, "tag": self.tag})
        run_id = str(1000 + len(self.runs))
        self.runs[run_id] = (algorithm, seed, what)
        return run_id

    def wait(self, run_id, timeout=600.0, progress=None, progress_every=10.0) -> str:
        return "finished:failed" if self.runs[run_id][2] == "server-failed" else "finished:completed"

    def logs(self, run_id) -> str:
        what = self.runs[run_id][2]
        return {"clients-failed": EMPTY_FOLDER_LOG, "offline": OFFLINE_LOG, "server-failed": EMPTY_FOLDER_LOG
                }.get(what, CLEAN_LOG)


@pytest.fixture
def grid(monkeypatch):
    module = load("run_grid")
    monkeypatch.setattr(module.signal, "signal", lambda *args: None)  # leave pytest's SIGTERM alone
    monkeypatch.setattr(module, "plot_accuracy", lambda folder, out=None, runs=None: Path(folder) / "accuracy.png")
    return module


def conf(tmp_path: Path, rounds: int = 2, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"dataset = 'fashion-mnist'\nnum-server-rounds = {rounds}\n\n"
                    "[federation]\nnum-supernodes = 2\n")
    return path


def run_main(grid, monkeypatch, tmp_path, flower, algorithms="fedbn,lips", seeds="0", extra=(), confs=None):
    monkeypatch.setattr(flwr_runs, "local_flower", lambda *args, **kwargs: flower)
    confs = [str(c) for c in confs] if confs else [str(conf(tmp_path))]
    monkeypatch.setattr(grid.sys, "argv", ["run_grid.py", *confs, "--algorithms", algorithms,
                                           "--seeds", seeds, "--out", str(tmp_path / "out"),
                                           "--engine", "flwr", *extra])
    grid.main()


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --------------------------------------------------------------------------- a failed run fails


@pytest.mark.parametrize("what, error", [
    ("clients-failed", "FileNotFoundError: no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) "
                       "in /tmp/empty"),
    ("offline", "RuntimeError: Error downloading train-images-idx3-ubyte.gz:\nTried http://fashion-mnist."
                "s3-website.eu-central-1.amazonaws.com/, got:\n<urlopen error [Errno -2] Name or service "
                "not known>"),
])
def test_a_run_whose_clients_all_failed_fails_with_their_first_error(grid, tmp_path, monkeypatch, what, error):
    with pytest.raises(SystemExit) as exc:
        run_main(grid, monkeypatch, tmp_path, FakeFlower({("fedbn", 0): what}), algorithms="fedbn")
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
    assert listing(tmp_path / "out") == []  # nothing of the failed grid kept: no result, staging or lock


def test_first_error_finds_the_clients_exception():
    from lips_flwr.experiments.local_flower import first_error

    found = first_error(EMPTY_FOLDER_LOG)
    assert found is not None
    assert found.splitlines()[-1] == ("FileNotFoundError: no Fashion-MNIST IDX files "
                                      "(train-images-idx3-ubyte[.gz], ...) in /tmp/empty")
    assert "datasets.py\", line 87, in load_fashion_mnist" in found  # where it was raised
    assert "\x1b[" not in found
    assert first_error(CLEAN_LOG) is None


def test_results_check(tmp_path):
    results_problem = flwr_runs.results_problem
    path = tmp_path / "r.json"
    assert "no results file" in results_problem(path, 2)
    results_file(path, "fedbn", 0, 2)
    assert results_problem(path, 2) is None
    assert "rounds 3" in results_problem(path, 3)  # a round missing
    results_file(path, "fedbn", 0, 2, trained=False)
    assert "no client trained" in results_problem(path, 2)
    results_file(path, "fedbn", 0, 2, evaluated=False)
    assert "no client evaluated round 2" in results_problem(path, 2)
    path.write_text("{not json")
    assert "not a readable results file" in results_problem(path, 2)


def test_a_server_failure_still_shows_the_first_error(grid, tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        run_main(grid, monkeypatch, tmp_path, FakeFlower({("fedbn", 0): "server-failed"}), algorithms="fedbn")
    assert "ended as finished:failed" in str(exc.value.code)
    assert "FileNotFoundError: no Fashion-MNIST" in str(exc.value.code)


# --------------------------------------------------------------------------- results bound to their settings


@pytest.mark.slow
@pytest.mark.parametrize("second", ["clients-failed", "interrupted", "no-file"])
def test_an_interrupted_rerun_leaves_every_result_file_whole_and_true_to_its_settings(grid, tmp_path, monkeypatch,
                                                                                      second):
    """A grid re-run with other settings (``--recompute``) that fails or is stopped half-way.

    Each finished run replaced its file; the one that failed or was stopped
    left the previous file byte for byte, which the next plain call refuses
    (its settings are not this grid's) rather than mixing it in.
    """
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="first"))
    folder = tmp_path / "out" / "tiny"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(before) == ["fedbn-seed0.json", "lips-seed0.json"]

    with pytest.raises((SystemExit, KeyboardInterrupt)):
        run_main(grid, monkeypatch, tmp_path, FakeFlower({("lips", 0): second}, tag="second"),
                 extra=("--set", "lr=0.2", "--recompute"))
    assert (folder / "lips-seed0.json").read_bytes() == before["lips-seed0.json"]  # whole, the first grid's
    fedbn = read_result(folder / "fedbn-seed0.json")
    assert fedbn.identity["run_config"]["lr"] == 0.2 and fedbn.app["run_config"]["tag"] == "second"
    staged = listing(tmp_path / "out" / ".staging") if (tmp_path / "out" / ".staging").exists() else []
    if second == "interrupted":  # a stop leaves the run's staging for the next call to continue
        assert staged[:2] == ["tiny", "tiny/lips-seed0"]
    else:  # a failure leaves nothing
        assert staged == []
    assert not (tmp_path / "out" / ".sweep.lock").exists()
    with pytest.raises(SystemExit) as exc:
        run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="third"), extra=("--set", "lr=0.2"))
    assert "lips-seed0.json' was computed with other settings: run_config.lr: file 0.1, now 0.2" in str(
        exc.value.code)


@pytest.mark.slow
def test_the_table_shows_this_grids_runs_and_leaves_other_results(grid, tmp_path, monkeypatch, capsys):
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="first"), seeds="0,1")
    folder = tmp_path / "out" / "tiny"
    (folder / "notes.txt").write_text("mine")  # not a results file: kept
    capsys.readouterr()
    run_main(grid, monkeypatch, tmp_path, FakeFlower(tag="second"), algorithms="fedbn", seeds="0")
    assert sorted(p.name for p in folder.iterdir()) == ["fedbn-seed0.json", "fedbn-seed1.json", "lips-seed0.json",
                                                        "lips-seed1.json", "notes.txt"]
    assert read_result(folder / "fedbn-seed0.json").app["run_config"]["tag"] == "first"  # reused, same settings
    out = capsys.readouterr().out
    assert "reused" in out and "client-mean test accuracy" in out
    rows = out.split("client-mean test accuracy")[1].splitlines()[2:]
    assert [r.split()[:2] for r in rows if r.strip() and not r.startswith("plot")] == [["fedbn", "1"]]


def test_two_conf_files_with_one_name_are_an_error_before_anything_runs(grid, tmp_path, monkeypatch):
    confs = [conf(tmp_path / "a"), conf(tmp_path / "b", rounds=3)]
    with pytest.raises(SystemExit) as exc:
        run_main(grid, monkeypatch, tmp_path, FakeFlower(), confs=confs)
    assert "two runs of one sweep would write one result file: 'tiny/fedbn-seed0'" in str(exc.value.code)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- study.py


def study_main(monkeypatch, tmp_path, flower, conf_path: Path, *extra: str):
    study = load("study")
    monkeypatch.setattr(study.signal, "signal", lambda *args: None)
    monkeypatch.setattr(study, "plot_accuracy", lambda folder, out=None, runs=None: out)
    monkeypatch.setattr(study, "plot_heatmap", lambda run, out=None: out)
    monkeypatch.setattr(flwr_runs, "local_flower", lambda *args, **kwargs: flower)
    monkeypatch.setattr(study.sys, "argv", ["study.py", "--conf", str(conf_path), "--out", str(tmp_path / "out"),
                                            "--seeds", "0", "--engine", "flwr", *extra])
    study.main()


@pytest.mark.slow
def test_the_study_keeps_no_results_of_a_failed_run(tmp_path, monkeypatch):
    """A failed run leaves no result file (nor staging) for the next invocation to take as done."""
    with pytest.raises(SystemExit):
        study_main(monkeypatch, tmp_path, FakeFlower({("lips", 100): "clients-failed"}), conf(tmp_path))
    select = tmp_path / "out" / "select"
    assert listing(select) == []
    study_main(monkeypatch, tmp_path, FakeFlower(), conf(tmp_path))
    assert len(list(select.glob("*.json"))) == 10 and listing(select) == sorted(p.name for p in select.iterdir())


@pytest.mark.slow
def test_a_study_with_another_conf_on_one_out_is_refused_and_recompute_replaces_it(tmp_path, monkeypatch):
    """Issue 26, defect 3: conf B on conf A's --out kept A's files and rewrote table.md from them (exit 0)."""
    study_main(monkeypatch, tmp_path, FakeFlower(tag="A"), conf(tmp_path / "a", name="study"))
    other = conf(tmp_path / "b", name="study")
    other.write_text(other.read_text().replace("num-server-rounds = 2", "num-server-rounds = 2\nlr = 0.2"))
    with pytest.raises(SystemExit) as exc:
        study_main(monkeypatch, tmp_path, FakeFlower(tag="B"), other)
    assert "run_config.lr: file 0.1, now 0.2" in str(exc.value.code)
    eval_file = tmp_path / "out" / "eval" / "fedbn-seed0.json"
    assert read_result(eval_file).app["run_config"]["tag"] == "A"
    study_main(monkeypatch, tmp_path, FakeFlower(tag="B"), other, "--recompute")
    assert read_result(eval_file).app["run_config"]["tag"] == "B"
    assert read_result(eval_file).identity["run_config"]["lr"] == 0.2
