"""The public surface, declared: each face's ``__all__``, and what the base install needs.

A name added to or dropped from a face's ``__all__`` changes this file in
the same commit. The base install (``flwr`` and ``numpy``) carries the
strategies, the client side and the core; torch and Ray come with the
``[examples]`` extra (``make test-no-torch`` proves it in a venv without them).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SURFACE = {
    "lips_flwr": ["LIPSCore", "MaskSchedule", "RoundOutcome", "batch_norm_names", "candidate_names",
                  "mask_layers", "mask_lowest", "num_zeros", "select_layers"],
    "lips_flwr.strategies": ["LIPS", "LIPSFedAvg", "LegacyLIPS", "LegacyLIPSFedAvg", "forced_options"],
    "lips_flwr.clients": ["LIPSNumPyClient", "fedbn_mod", "lips_mod", "make_fedbn_mod",
                          "persistent_state_mod"],
    "lips_flwr.experiments.compare": ["Comparison", "default_goal", "default_metric", "endpoint",
                                      "evaluate_series", "run_compare", "summarize"],
    "lips_flwr.core": ["DECAYS", "LIPSCore", "MaskSchedule", "RoundOutcome", "SCORES", "batch_norm_names",
                       "candidate_names", "client_mask", "compute_score", "local_update", "mask_layers",
                       "mask_lowest", "num_zeros", "select_layers"],
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_each_face_exports_exactly_its_declared_names(module):
    face = importlib.import_module(module)
    assert sorted(face.__all__) == sorted(SURFACE[module])
    assert [name for name in face.__all__ if not hasattr(face, name)] == []


def test_the_base_install_is_flwr_and_numpy():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(req.split(">")[0].split("<")[0].split("=")[0].strip() for req in project["dependencies"])
    assert names == ["flwr", "numpy"]
    examples = " ".join(project["optional-dependencies"]["examples"])
    assert all(name in examples for name in ("torch", "flwr[simulation]", "scipy", "matplotlib"))


def test_ray_which_runs_every_sweep_is_declared_at_its_lowest_tested_version():
    """Issue 38: compare's runs are Ray tasks; `make test-lowest` runs the unit tests' sweeps on that Ray."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [req for req in project["optional-dependencies"]["examples"] if req.startswith("ray")]
    lowest = [line for line in (ROOT / "requirements-lowest.txt").read_text().splitlines()
              if line.startswith("ray==")]
    assert declared == ["ray>=2.55.1"] and lowest == ["ray==2.55.1"]


def python_without(modules: list[str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``modules`` cannot be imported (as if not installed)."""
    block = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_plugin_imports_without_torch_or_ray():
    done = python_without(["torch", "ray"],
                          "import lips_flwr, lips_flwr.strategies, lips_flwr.clients\n"
                          "print(sorted(m for m in sys.modules if m.startswith('lips_flwr.exp')))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_experiments_without_torch_name_the_extra_in_one_line():
    """Before: ``import lips_flwr.experiments`` worked without torch and a module deep inside failed
    with a bare ``No module named 'torch'``."""
    done = python_without(["torch"], "import lips_flwr.experiments")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert last == ("lips_flwr._extras.MissingExtraError: lips_flwr.experiments needs torch, which is not "
                    'installed: pip install "lips-flwr[examples]"')


def test_the_command_without_torch_is_one_line_and_exit_2():
    done = python_without(["torch"], "from lips_flwr._extras import main\n"
                                     "sys.exit(main(['compare', 'app', '--seeds', '1', '--out', 'out']))")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ('lips-flwr: lips_flwr.experiments needs torch, which is not installed: '
                           'pip install "lips-flwr[examples]"\n')


def test_the_command_without_scipy_or_matplotlib_names_both_in_one_line_and_exit_2():
    """The compare room loads its summary (scipy's tests) on first use: the command starts without
    them, names every missing extra, and its help needs none."""
    command = "from lips_flwr._extras import main\nsys.exit(main({}))"
    done = python_without(["scipy", "matplotlib"],
                          command.format("['compare', 'app', '--seeds', '1', '--out', 'out']"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == 'lips-flwr compare needs scipy, matplotlib: pip install "lips-flwr[examples]"\n'
    helped = python_without(["scipy", "matplotlib"], command.format("['compare', '--help']"))
    assert helped.returncode == 0 and "--seeds" in helped.stdout, helped.stderr


def test_the_command_is_the_launcher():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lips-flwr": "lips_flwr._extras:main"}


def test_the_editable_install_is_a_plain_pth():
    """``package-dir = {"" = "."}`` makes ``pip install -e`` a .pth file: without it, setuptools' meta
    path finder printed a warning box in every ``make setup`` (issue 36 item 7)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "."}
