"""The runner's files: App folders and run configs, result files, staging folders, the lock, provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runner_apps import make_app

from lips_flwr.experiments.runner.apps import (
    app_digest,
    import_components,
    load_app,
    num_supernodes,
    parse_overrides,
    resolve_run_config,
)
from lips_flwr.experiments.runner.provenance import code_identity, provenance, same_environment
from lips_flwr.experiments.runner.store import (
    SweepLock,
    check_name,
    differences,
    prune_staging,
    read_result,
    write_result,
)

ROOT = Path(__file__).resolve().parents[4]
PAPER = ROOT / "examples" / "paper"


# --------------------------------------------------------------------------- apps


def test_an_app_folder_is_read_as_flwr_run_reads_it(tmp_path):
    app = load_app(make_app(tmp_path, resumable=True))
    assert (app.name, app.serverapp, app.clientapp) == ("tinyapp", "tinyapp.server_app:app",
                                                         "tinyapp.client_app:app")
    assert app.defaults == {"num-server-rounds": 3, "tau0": 0.5, "lr": 0.3, "sleep": 0.0,
                            "checkpoint-path": "", "resume": "no"}
    nested = tmp_path / "nested"
    make_app(nested)
    text = (nested / "pyproject.toml").read_text() + "\n[tool.flwr.app.config.optim]\nmomentum = 0.9\n"
    (nested / "pyproject.toml").write_text(text)
    assert load_app(nested).defaults["optim.momentum"] == 0.9  # flattened with dots, as Flower does
    with pytest.raises(ValueError, match="no pyproject.toml"):
        load_app(tmp_path / "nowhere")


def test_overrides_are_toml_values_or_a_file_whose_federation_table_is_not_run_config(tmp_path):
    assert parse_overrides(["lr=1", "tau0=0.7 name='x y'"]) == ({"lr": 1, "tau0": 0.7, "name": "x y"}, {})
    conf = tmp_path / "c.toml"
    conf.write_text("lr = 0.1\nnum-server-rounds = 5\n\n[federation]\nnum-supernodes = 7\n")
    overrides, federation = parse_overrides([str(conf), "lr=0.2"])
    assert overrides == {"lr": 0.2, "num-server-rounds": 5} and num_supernodes(federation) == 7
    assert num_supernodes({}) == 10
    with pytest.raises(ValueError, match="not TOML"):
        parse_overrides(["dataset=digits"])  # a string needs quotes, as under `flwr run`
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_overrides(["lr"])
    with pytest.raises(ValueError, match="num-supernodes must be"):
        num_supernodes({"num-supernodes": 0})


def test_the_run_config_is_fused_by_flowers_rules(tmp_path):
    app = load_app(make_app(tmp_path))
    config = resolve_run_config(app, {"lr": 1, "tau0": 0.0})
    assert config == {"num-server-rounds": 3, "tau0": 0.0, "lr": 1, "sleep": 0.0}
    assert type(config["lr"]) is int  # as the SuperLink of flwr 1.42 gives it to the app
    with pytest.raises(ValueError, match=r"unknown run-config keys \['momentum'\]"):
        resolve_run_config(app, {"momentum": 0.9})


def test_the_digest_follows_the_apps_code_not_the_files_beside_it(tmp_path):
    app = load_app(make_app(tmp_path))
    before = app_digest(app)
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / "sweep.py").write_text("print('a script beside the app')")
    (tmp_path / "tinyapp" / "__pycache__").mkdir()
    (tmp_path / "tinyapp" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    assert app_digest(app) == before
    client = tmp_path / "tinyapp" / "client_app.py"
    client.write_text(client.read_text() + "\nCHANGED = 1\n")  # code (a comment would keep it: test_identity)
    assert app_digest(app) != before
    paper = load_app(PAPER)  # run_grid.py, conf/ and README.md are not the app's code
    assert paper.name == "lips-paper" and len(app_digest(paper)) == 64


def test_components_are_imported_with_the_app_folder_first(tmp_path):
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    app = load_app(make_app(tmp_path, package="tiny_import_check"))
    server, client = import_components(app)
    assert isinstance(server, ServerApp) and isinstance(client, ClientApp)
    broken = make_app(tmp_path / "broken", package="tiny_broken_ref")
    text = (broken / "pyproject.toml").read_text().replace("client_app:app", "client_app:nothing")
    (broken / "pyproject.toml").write_text(text)
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        import_components(load_app(broken))


# --------------------------------------------------------------------------- result files


def test_new_and_earlier_sessions_result_files_read_as_one_object(tmp_path):
    path = tmp_path / "r.json"
    write_result(path, {"run_config": {"tau0": 0.5}, "seed": 1}, {"python": "3"}, {"rounds": {}}, {"x": 1})
    new = read_result(path)
    assert new.identity["seed"] == 1 and new.provenance == {"python": "3"} and new.app == {"x": 1}
    assert new.run_config == {"tau0": 0.5}
    committed = PAPER.parents[1] / "docs/results/prereg/prereg-fmnist-dir0.1/lips-seed1000.json"
    old = read_result(committed)
    assert old.identity is None and old.provenance is None and old.observed is None
    assert old.run_config["algorithm"] == "lips" and "rounds" in old.app
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="not a result file"):
        read_result(tmp_path / "junk.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "lips-flwr-result/9"}))
    with pytest.raises(ValueError, match="lips-flwr-result/9"):
        read_result(tmp_path / "other.json")


def test_differences_name_each_key_with_both_values():
    found = {"run_config": {"tau0": 0.3, "lr": 0.1}, "seed": 1, "code": {"source": "abc"}}
    wanted = {"run_config": {"tau0": 0.5, "lr": 0.1, "new": True}, "seed": 1, "code": {"source": "def"}}
    assert differences(found, wanted) == ['code.source: file "abc", now "def"',
                                          "run_config.new: file (none), now true",
                                          "run_config.tau0: file 0.3, now 0.5"]
    assert differences(found, json.loads(json.dumps(found))) == []
    assert differences({"lips_forced": {}}, {"lips_forced": {"tau0": 0.0}}) == [
        "lips_forced: file {}, now (none)", "lips_forced.tau0: file (none), now 0.0"]


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", ".hidden", "a//b", "a/."])
def test_result_names_are_plain_relative_paths(name):
    with pytest.raises(ValueError, match="relative path"):
        check_name(name)


def test_pruning_keeps_other_runs_stopped_progress_and_removes_half_made_folders(tmp_path):
    """A smaller sweep into a folder (`pilot.py run --cells resnet8-n100` after a stopped vgg6 run, other
    seeds) deleted the stopped runs' resumable progress; only half-made folders are clutter."""
    root = tmp_path / ".staging"
    identity = {"seed": 0, "run_config": {"tau0": 0.5}}
    for name in ("conf/a-seed0", "conf/b-seed0", "other/a-seed0", "done"):
        (root / name).mkdir(parents=True)
        (root / name / "identity.json").write_text(json.dumps(identity))
        (root / name / "checkpoint.npz").write_bytes(b"progress")
    write_result(tmp_path / "done.json", identity, {}, None, None)  # stopped after writing its result
    (root / "conf" / "half-made" / "clients").mkdir(parents=True)  # stopped before its identity file
    (root / "broken").mkdir()
    (root / "broken" / "identity.json").write_text('{"seed": 0, "run_con')  # stopped while writing it
    (root / "conf" / "loose.tmp").write_text("x")
    logged: list[str] = []
    prune_staging(tmp_path, {"conf/a-seed0"}, log=logged.append)
    runs = sorted(str(p.parent.relative_to(root)) for p in root.rglob("identity.json"))
    assert runs == ["conf/a-seed0", "conf/b-seed0", "other/a-seed0"]
    npz = sorted(str(p.relative_to(root)) for p in root.rglob("*.npz"))
    assert npz == [f"{r}/checkpoint.npz" for r in runs]
    assert sorted(p.name for p in (root / "conf").iterdir()) == ["a-seed0", "b-seed0"]  # nothing half-made
    kept = [line for line in logged if line.startswith("keeping")]
    assert [line.split("'")[1] for line in kept] == [str(root / "conf/b-seed0"), str(root / "other/a-seed0")]
    assert all("a stopped run's staging" in line for line in kept)  # (conf/a-seed0: this sweep's, not logged)
    removed = sorted(line.split("'")[1] for line in logged if line.startswith("removing"))
    assert removed == sorted(str(root / n) for n in ("broken", "conf/half-made", "conf/loose.tmp", "done"))
    assert len(logged) == len(kept) + len(removed)
    prune_staging(tmp_path, set(), log=logged.append)  # a sweep that runs none of them keeps them too
    assert sorted(str(p.parent.relative_to(root)) for p in root.rglob("identity.json")) == runs
    for run in runs:
        (root / run / "identity.json").unlink()  # now nothing says whose they are: clutter
    prune_staging(tmp_path, set(), log=logged.append)
    assert not root.exists()


@pytest.mark.slow
def test_a_second_sweep_is_refused_while_one_holds_the_folder(tmp_path):
    with SweepLock(tmp_path):
        assert (tmp_path / ".sweep.lock").read_text().strip() == str(os.getpid())
        code = ("import sys; from pathlib import Path; from lips_flwr.experiments.runner.store import SweepLock\n"
                "try:\n    SweepLock(Path(sys.argv[1]))\nexcept ValueError as err:\n    print(err)")
        other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                               check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert f"in use by another sweep (pid {os.getpid()}" in other.stdout
    assert not (tmp_path / ".sweep.lock").exists()
    # A holder killed with its lock: the OS freed the flock, its file is no obstacle.
    subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; "
                    "from lips_flwr.experiments.runner.store import SweepLock; SweepLock(Path(sys.argv[1])); "
                    "os._exit(9)", str(tmp_path)], check=False,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (tmp_path / ".sweep.lock").exists()
    with SweepLock(tmp_path):
        pass


# --------------------------------------------------------------------------- provenance


def test_provenance_records_real_values():
    record = provenance("sequential", "2026-01-01T00:00:00+00:00", 1.23456, chunk_size=4)
    import flwr
    import numpy
    import torch

    assert (record["flwr"], record["numpy"], record["torch"]) == (flwr.__version__, numpy.__version__,
                                                                   torch.__version__)
    assert record["python"].count(".") == 2 and record["platform"] and record["cpu"]
    assert record["threads"]["torch"] == torch.get_num_threads() and "OMP_NUM_THREADS" in record["threads"]
    assert record["wall_seconds"] == 1.235 and record["engine"] == "sequential" and record["chunk_size"] == 4
    if Path("/proc/cpuinfo").exists():
        assert record["cpu_flags"] and " " in record["cpu_flags"]
    git = record["git"]  # this checkout (the tests run from one), or None for an installed package
    assert git is None or (len(git["commit"]) == 40 and isinstance(git["dirty"], bool))
    code = code_identity()
    assert code["lips_flwr"] and len(code["source"]) == 64


def test_paired_runs_in_different_environments_are_told_apart():
    base = provenance("sequential", "t", 1.0)
    same, differing = same_environment(base, {**base, "started": "later", "wall_seconds": 9.0})
    assert same and differing == []
    other = {**base, "cpu_flags": base["cpu_flags"] and base["cpu_flags"] + " avx512f_extra",
             "threads": {**base["threads"], "OPENBLAS_NUM_THREADS": "1"}}
    same, differing = same_environment(base, other)
    assert not same and "threads" in differing
    resumed = {**base, "earlier_segments": [{**base, "torch": "0.0"}]}
    assert same_environment(base, resumed) == (False, ["torch"])
    assert same_environment(None, base) == (None, [])
