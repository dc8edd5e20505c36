"""A run's identity follows the code it ran: every module it loaded from the App folder, by its code.

An edit of code that a run imported (a sibling ``helpers.py`` too) stops its
result from being reused; an edit of a comment or a docstring, or a moved
checkout, keeps it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from runner_apps import make_app

from lips_flwr.experiments.runner.apps import (
    app_digest,
    code_content,
    folder_modules,
    load_app,
    loaded_modules,
    module_digests,
    planned_identity,
    with_modules,
)
from lips_flwr.experiments.runner.provenance import PACKAGE, code_identity_now
from lips_flwr.experiments.runner.resume import claim_staging
from lips_flwr.experiments.runner.runs import MODULES, RunSpec, identity_now, prepare, run_name
from lips_flwr.experiments.runner.store import prune_staging, read_result, write_result
from lips_flwr.experiments.runner.sweep import SweepFailed, plan, run_sweep

HELPERS = '''\
"""Helpers of the tiny app, beside its package."""


def pull(lr: float) -> float:
    """The step towards the client's target."""
    return lr * 1.0  # as given
'''
USE = '    goal, lr = target(pid, arrays), float(context.run_config["lr"])\n'
USED = ('    import helpers  # (imported during the run: recorded after it)\n\n'
        '    goal, lr = target(pid, arrays), helpers.pull(float(context.run_config["lr"]))\n')


def helpers_app(folder: Path) -> Path:
    """The tiny app whose ClientApp takes its step from a ``helpers.py`` beside its package."""
    make_app(folder)
    (folder / "helpers.py").write_text(HELPERS)
    client = folder / "tinyapp" / "client_app.py"
    client.write_text(client.read_text().replace(USE, USED))
    return folder


def spec(app: Path, name: str = "run") -> RunSpec:
    return RunSpec(app, name, 0, num_nodes=2, engine="sequential")


def reused(app: Path, out: Path) -> bool:
    """Whether a sweep of ``spec(app)`` into ``out`` would reuse its result (``ValueError`` if refused)."""
    return plan([prepare(spec(app), out)], recompute=False, progress=lambda line: None) == []


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.slow
def test_a_result_follows_every_module_its_run_loaded_from_the_app_folder(tmp_path):
    app, out = helpers_app(tmp_path / "app"), tmp_path / "out"
    [path] = run_sweep([spec(app)], out, progress=lambda line: None)
    modules = read_result(path).identity["app"]["modules"]
    assert sorted(modules) == ["helpers.py", "tinyapp/__init__.py", "tinyapp/client_app.py",
                               "tinyapp/server_app.py"]
    assert reused(app, out)
    helpers = app / "helpers.py"
    edit(helpers, "# as given", "# as given, unchanged")  # a comment
    edit(helpers, "The step towards", "The whole step towards")  # a docstring
    edit(app / "tinyapp" / "client_app.py", "app = ClientApp()", "app = ClientApp()  # the ClientApp")
    (app / "NOTES.md").write_text("beside the app")
    assert reused(app, out)
    moved = tmp_path / "elsewhere" / "app"  # the checkout moved: paths are the folder's own
    shutil.copytree(app, moved, ignore=shutil.ignore_patterns("__pycache__"))
    assert reused(moved, out)
    edit(helpers, "return lr * 1.0", "return lr * 0.5")  # code: the run's numbers change
    changed = r'app\.modules\.helpers\.py: file "[0-9a-f]{64}", now '
    with pytest.raises(ValueError, match=changed + '"[0-9a-f]{64}"'):
        reused(app, out)
    helpers.unlink()
    with pytest.raises(ValueError, match=changed + "null"):
        reused(app, out)
    assert plan([prepare(spec(app), out)], recompute=True, progress=lambda line: None) != []


def test_code_content_keeps_the_code_and_drops_comments_docstrings_and_layout(tmp_path):
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text('"""Module."""\nimport os\n\n\nclass A:\n    """A class."""\n\n    def f(self):\n'
                   '        """A method."""\n        return os.sep  # a comment\n')
    two.write_text('import os\nclass A:\n    def f(self):\n        return (os.sep)\n')
    assert code_content(one) == code_content(two)
    two.write_text('import os\nclass A:\n    def f(self):\n        return os.pathsep\n')
    assert code_content(one) != code_content(two)
    toml = tmp_path / "a.toml"
    toml.write_text("a = 1  # one\n[b]\nc = 'x'\n")
    before = code_content(toml)
    toml.write_text("# the values\n[b]\nc = \"x\"\n\n[tool]\n")
    assert code_content(toml) != before  # [tool] is a value
    toml.write_text("a = 1\n\n[b]\nc = \"x\"   # two\n")
    assert code_content(toml) == before
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert code_content(broken) == b"def (:\n"  # a file that does not parse: its bytes


def test_the_app_digest_ignores_comments_in_its_pyproject_and_code(tmp_path):
    app = load_app(make_app(tmp_path / "app"))
    before = app_digest(app)
    edit(app.folder / "pyproject.toml", "tau0 = 0.5", "tau0 = 0.5  # LIPS's first tau")
    server = app.folder / "tinyapp" / "server_app.py"
    edit(server, "app = ServerApp()", '"""The ServerApp."""\napp = ServerApp()')
    assert app_digest(app) == before
    edit(app.folder / "pyproject.toml", "tau0 = 0.5", "tau0 = 0.6")
    assert app_digest(app) != before


def test_a_flwr_run_records_every_python_file_of_the_folder(tmp_path):
    """``flwr run`` imports in Flower's processes, unseen: all the folder's code is its identity."""
    app = load_app(helpers_app(tmp_path / "app"))
    (app.folder / ".venv" / "lib" / "site-packages").mkdir(parents=True)
    (app.folder / ".venv" / "lib" / "site-packages" / "dep.py").write_text("X = 1\n")
    (app.folder / "tinyapp" / "__pycache__").mkdir()
    (app.folder / "tinyapp" / "__pycache__" / "x.py").write_text("X = 1\n")
    assert sorted(folder_modules(app)) == ["helpers.py", "tinyapp/__init__.py", "tinyapp/client_app.py",
                                          "tinyapp/server_app.py"]


def test_a_staging_folder_whose_run_wrote_its_result_is_pruned(tmp_path):
    """The result's identity has the modules its run recorded; the staging folder's, written before, not."""
    app, out = make_app(tmp_path / "app"), tmp_path / "out"
    job = prepare(spec(app), out)
    job.staging.mkdir(parents=True)
    (job.staging / "identity.json").write_text(json.dumps(job.identity))
    write_result(job.result, with_modules(job.identity, {"tinyapp/client_app.py": "0" * 64}), {}, None, None)
    logged: list[str] = []
    prune_staging(out, set(), log=logged.append)
    assert not job.staging.exists() and "its run finished" in logged[0]
    assert planned_identity(read_result(job.result).identity) == job.identity
    assert identity_now(job, job.identity) == job.identity  # a result without modules: compared as it is


def test_run_names_and_the_code_identity_are_spelled_once():
    assert run_name("b", 3) == "b-seed3" and run_name("conf/lips", 0) == "conf/lips-seed0"
    root = PACKAGE.parent
    spelled = [str(path.relative_to(root)) for folder in (PACKAGE, root / "examples")
               for path in folder.rglob("*.py") if "-seed{" in path.read_text()]
    assert spelled == ["lips_flwr/experiments/runner/runs.py"]  # every other place calls run_name
    import hashlib

    digest = hashlib.sha256()  # the code identity as it was computed before tree_digest: unchanged
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    assert code_identity_now()["source"] == digest.hexdigest()


def test_a_stopped_run_whose_code_changed_starts_again_at_round_1(tmp_path):
    """A run continued with other code than it began with would be neither the old code's nor the new's."""
    app, out = helpers_app(tmp_path / "app"), tmp_path / "out"
    (app / "pyproject.toml").write_text((app / "pyproject.toml").read_text()
                                        + 'checkpoint-path = ""\nresume = "no"\n')
    job = prepare(spec(app), out)
    logged: list[str] = []
    assert not claim_staging(job, logged.append)
    loaded = module_digests(load_app(app), ["helpers.py", "tinyapp/client_app.py"])
    (job.staging / MODULES).write_text(json.dumps(loaded))  # as the run's process writes it
    assert claim_staging(job, logged.append) and "continuing its stopped run" in logged[-1]
    edit(app / "helpers.py", "# as given", "# a comment only")
    assert claim_staging(job, logged.append)
    edit(app / "helpers.py", "return lr * 1.0", "return lr * 0.5")
    assert not claim_staging(job, logged.append)
    assert "(the app's code it ran changed: helpers.py): starting at round 1" in logged[-1]
    assert sorted(p.name for p in job.staging.iterdir()) == ["identity.json"]
    (job.staging / MODULES).write_text('{"helpers.py": "ab')  # truncated
    assert not claim_staging(job, logged.append)
    assert f"changed: {MODULES} (unreadable)" in logged[-1]


@pytest.mark.slow
def test_a_run_process_leaves_the_modules_it_imported_in_its_staging_folder(tmp_path):
    app, out = make_app(tmp_path / "app", resumable=True), tmp_path / "out"
    client = app / "tinyapp" / "client_app.py"
    sleep = '    time.sleep(float(context.run_config["sleep"]))\n'
    client.write_text(client.read_text().replace(sleep, "    raise KeyboardInterrupt  # as a Ctrl-C here\n"))
    with pytest.raises(SweepFailed, match="its process was stopped"):
        run_sweep([spec(app, "stopped")], out, progress=lambda line: None)
    staged = json.loads((out / ".staging" / "stopped" / MODULES).read_text())
    assert staged == module_digests(load_app(app), ["tinyapp/__init__.py", "tinyapp/client_app.py",
                                                    "tinyapp/server_app.py"])


def test_a_sweep_script_in_the_app_folder_is_not_the_apps_code(tmp_path, monkeypatch):
    """A run process spawned by ``examples/paper/study.py`` imports that script again as ``__mp_main__``."""
    import sys
    import types

    app = load_app(helpers_app(tmp_path / "app"))
    script = app.folder / "study.py"
    script.write_text("print('a sweep script')\n")
    for name in ("__mp_main__", "tiny_helper_module"):
        module = types.ModuleType(name)
        module.__file__ = str(script if name == "__mp_main__" else app.folder / "helpers.py")
        monkeypatch.setitem(sys.modules, name, module)
    assert sorted(loaded_modules(app)) == ["helpers.py"]


def test_module_files_resolve_as_path_resolve_does_through_links_and_dot_dots(tmp_path, monkeypatch):
    """``loaded_modules`` resolves each folder once (a process holds thousands of modules): the same
    paths as ``Path.resolve`` file by file, through a linked folder, a linked file, ``..`` after a link
    and a path relative to the working folder."""
    from lips_flwr.experiments.runner.apps import _resolved

    real = tmp_path / "real" / "pkg"
    real.mkdir(parents=True)
    for name in ("a.py", "b.py"):
        (real / name).write_text("x = 1\n")
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    (real / "alias.py").symlink_to(real / "b.py")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    paths = [str(real / "a.py"), str(tmp_path / "linked" / "pkg" / "a.py"), str(real / "alias.py"),
             str(tmp_path / "linked" / "pkg" / ".." / "pkg" / "b.py"), "../linked/pkg/b.py",
             str(tmp_path / "linked" / "pkg" / "gone.py")]
    assert _resolved(paths) == [str(Path(path).resolve()) for path in paths]


def test_a_broken_pyproject_is_named_wherever_the_app_is_read(tmp_path):
    """compare read the app for its node count before its own check: tomllib's message, no file name."""
    from lips_flwr.errors import ConfigError
    from lips_flwr.experiments.runner.apps import load_app

    (tmp_path / "pyproject.toml").write_text("[project\nname = 1")
    with pytest.raises(ConfigError, match=r"pyproject.toml' is not valid TOML"):
        load_app(tmp_path)
