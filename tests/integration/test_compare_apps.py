"""``lips-flwr compare`` end to end: quickstart-message, and a plain Flower App with LIPS swapped in.

Each comparison runs twice, into two folders: the same command gives the
same numbers (the runner seeds the process-wide generators for the ServerApp
and every client call, so an app without seed handling of its own, such as
tests/apps/plain-message with its unseeded DataLoader shuffles and model
init, is repeatable). Few rounds, 3 nodes, 2 seeds: a CI-sized check, not a
measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_swap_in import APPS, SWAPS, _apply

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
NUMBERS = ("seeds", "endpoint_a", "endpoint_b", "differences", "diff_mean", "ci95", "p_t", "p_sign",
           "verdict", "metric", "last", "inertia_a")


def compare(app: Path, out: Path, *extra: str, seeds: str = "1000,1001") -> subprocess.CompletedProcess:
    """``lips-flwr compare`` as a user runs it (the module form: this checkout, not an installed script)."""
    return subprocess.run(
        [sys.executable, "-m", "lips_flwr.experiments.compare.cli", "compare", str(app), "--seeds", seeds,
         "--num-supernodes", "3", "--engine", "sequential", "--jobs", "2", "--out", str(out), *extra],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"})


def numbers(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {key: summary[key] for key in NUMBERS}


def twice(app: Path, tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    runs = []
    for folder in ("first", "second"):
        proc = compare(app, tmp_path / folder, *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs.append(numbers(tmp_path / folder))
        assert (tmp_path / folder / "report.md").read_text().startswith("# Does it help?")
        for name in ("curves.png", "inertia.png"):
            assert (tmp_path / folder / name).read_bytes()[:4] == b"\x89PNG"
        left = sorted(p.name for p in (tmp_path / folder / "runs").iterdir())
        assert left == ["a-seed1000.json", "a-seed1001.json", "b-seed1000.json", "b-seed1001.json"]
    return runs[0], runs[1]


def test_compare_on_quickstart_message_gives_the_same_numbers_twice(tmp_path):
    app = ROOT / "examples" / "quickstart-message"
    first, second = twice(app, tmp_path, "--run-config", "num-server-rounds=2")
    assert first == second
    assert first["metric"] == "eval-acc" and first["last"] == 2 and len(first["endpoint_a"]) == 2


def test_compare_on_a_plain_app_with_lips_swapped_in_gives_the_same_numbers_twice(tmp_path):
    app = tmp_path / "plain-message"
    shutil.copytree(APPS / "plain-message", app, ignore=shutil.ignore_patterns("__pycache__"))
    _apply(app, SWAPS["plain-message"])  # the README's four lines, nothing else
    first, second = twice(app, tmp_path, "--run-config", "num-server-rounds=2")
    assert first == second
    assert first["metric"] == "eval_acc"
    runs = tmp_path / "first" / "runs"
    a, b = (json.loads((runs / f"{arm}-seed1000.json").read_text()) for arm in ("a", "b"))
    assert a["identity"]["lips_forced"] == {"tau0": 0.0} and b["identity"]["lips_forced"] == {}
    # Round 1: the same initial model and training in both arms (seeded alike); LIPS then masks the
    # middle layers of arm B's aggregate only. The first and last layers' steps are equal bit for bit.
    layers = b["observed"]["layers"]
    steps = {arm: data["observed"]["rounds"]["1"]["relative_step"] for arm, data in (("a", a), ("b", b))}
    for name in layers["all"]:
        if name in layers["middle"]:
            assert steps["b"][name] > steps["a"][name], name
        else:
            assert steps["b"][name] == steps["a"][name], name


def test_a_refused_sweep_exits_non_zero_naming_the_key_and_recompute_replaces(tmp_path):
    sys.path.insert(0, str(UNIT))
    from runner_apps import make_app

    app = make_app(tmp_path / "app", rounds=2, lips=True)  # (arm A forces LIPS off: the app builds one)
    assert compare(app, tmp_path / "out", seeds="1000").returncode == 0
    refused = compare(app, tmp_path / "out", "--run-config", "lr=0.2", seeds="1000")
    assert refused.returncode == 1 and "run_config.lr: file 0.3, now 0.2" in refused.stderr
    again = compare(app, tmp_path / "out", "--run-config", "lr=0.2", "--recompute", seeds="1000")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "runs" / "a-seed1000.json").read_text())["identity"]["run_config"][
        "lr"] == 0.2


def test_a_failing_app_exits_non_zero_with_the_clients_error_in_the_output(tmp_path):
    sys.path.insert(0, str(UNIT))
    from runner_apps import make_app

    proc = compare(make_app(tmp_path / "app", fail=True, lips=True), tmp_path / "out", seeds="1000")
    assert proc.returncode == 1
    assert "RuntimeError: tiny app: this ClientApp fails on every call" in proc.stderr
