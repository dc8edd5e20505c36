"""Issue 35, done-when: on an app written for this test, compare gives one summary.json whatever the jobs.

``tests/apps/gru-fedavgm`` is a plain Flower App (Message API) written from
scratch: a GRU with a batch-norm layer classifying sequences that this test
makes, under FedAvgM. LIPS is swapped in by the README's four lines, nothing
else. ``lips-flwr compare`` then gives the same ``summary.json`` with
``--jobs 1`` (one run at a time, every core) and ``--jobs 2`` (two at a
time, ``cores // 2`` threads each), and again after a Ctrl-C of the whole
process group (as a terminal sends it) and the same command run again.
A few rounds, 2 nodes, 1 seed: a CI-sized check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_swap_in import APPS, _apply

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SWAP = [  # the README's "Swap LIPS into your existing project" lines (Message API)
    ("gru_fedavgm/server_app.py", "from flwr.serverapp.strategy import FedAvgM\n",
     "from flwr.serverapp.strategy import FedAvgM\nfrom lips_flwr.strategies import LIPS\n"),
    ("gru_fedavgm/server_app.py",
     '    strategy = FedAvgM(fraction_train=1.0, server_momentum=float(cfg["server-momentum"]))\n',
     '    strategy = FedAvgM(fraction_train=1.0, server_momentum=float(cfg["server-momentum"]))\n'
     "    strategy = LIPS(strategy, tau0=0.5, every=5)\n"),
    ("gru_fedavgm/client_app.py", "from flwr.clientapp import ClientApp\n",
     "from flwr.clientapp import ClientApp\nfrom lips_flwr.clients import fedbn_mod, lips_mod\n"),
    ("gru_fedavgm/client_app.py", "app = ClientApp()\n", "app = ClientApp(mods=[fedbn_mod, lips_mod])\n"),
]


def make_sequences(path: Path) -> None:
    """Two classes of noisy 3-feature sequences: a sine of one of two frequencies."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=160)
    t = np.arange(12)[None, :, None]
    freq = np.where(y == 1, 0.9, 0.4)[:, None, None]
    x = np.sin(freq * t + rng.uniform(0, 6.3, size=(160, 1, 3))) + 0.3 * rng.normal(size=(160, 12, 3))
    np.savez(path, x=x.astype(np.float32), y=y)


@pytest.fixture()
def app(tmp_path) -> Path:
    folder = tmp_path / "gru-fedavgm"
    shutil.copytree(APPS / "gru-fedavgm", folder, ignore=shutil.ignore_patterns("__pycache__"))
    _apply(folder, SWAP)
    make_sequences(tmp_path / "sequences.npz")
    return folder


def command(app: Path, out: Path, jobs: int) -> list[str]:
    return [sys.executable, "-m", "lips_flwr.experiments.compare.cli", "compare", str(app), "--seeds", "1000",
            "--num-supernodes", "2", "--engine", "sequential", "--jobs", str(jobs), "--out", str(out),
            "--run-config", f"data-path='{app.parent / 'sequences.npz'}'"]


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}


def compare(app: Path, out: Path, jobs: int) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(app, out, jobs), capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=ENV, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def summary(out: Path) -> dict:
    """summary.json without its provenance (when and with which commit it was written)."""
    data = json.loads((out / "summary.json").read_text())
    data.pop("provenance", None)
    return data


def stopped_at_round_2(app: Path, out: Path) -> subprocess.CompletedProcess:
    """compare started, then Ctrl-C'd (SIGINT to its process group) once a run reports round 2."""
    proc = subprocess.Popen(command(app, out, 2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=ENV, start_new_session=True)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "round 2/" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[0]
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + rest, "")


def test_compare_gives_one_summary_whatever_the_jobs_and_after_a_ctrl_c(app, tmp_path):
    compare(app, tmp_path / "one", jobs=1)
    compare(app, tmp_path / "two", jobs=2)
    assert summary(tmp_path / "one") == summary(tmp_path / "two")
    stopped = stopped_at_round_2(app, tmp_path / "stopped")
    assert stopped.returncode != 0, stopped.stdout[-3000:]
    assert not (tmp_path / "stopped" / "summary.json").exists()
    assert sorted(p.name for p in (tmp_path / "stopped" / "runs" / ".staging").iterdir()) == [
        "a-seed1000", "b-seed1000"]  # both runs stopped, their staging kept
    again = compare(app, tmp_path / "stopped", jobs=2)
    assert summary(tmp_path / "stopped") == summary(tmp_path / "one")
    # The README's lines give LIPS no checkpoint: each stopped run starts again at round 1, saying why.
    assert again.stdout.count("(the app cannot resume: its run config declares no checkpoint-path") == 2
