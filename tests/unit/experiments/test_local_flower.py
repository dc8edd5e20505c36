"""local_flower: its processes' environment; stop_tree: a process tree is gone when it returns, deaf and
orphaned members included."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lips_flwr.experiments.local_flower import local_flower, running, stop_tree

PROC = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")

# A child that ignores SIGTERM and says so; its parent (the root, a session leader) waits.
DEAF_CHILD = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "open(sys.argv[1], 'w').write('ready')\n"
              "time.sleep(600)\n")
ROOT = ("import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"
        "time.sleep(600)\n")


@PROC
@pytest.mark.slow
def test_every_process_of_the_tree_is_gone_when_stop_tree_returns(tmp_path):
    """Before: SIGKILL was sent and stop_tree returned at once; a deaf child still in its exit was
    counted as left running by the deployment tests' teardown (a failed CI on a loaded machine)."""
    ready = tmp_path / "ready"
    root = subprocess.Popen([sys.executable, "-c", ROOT, DEAF_CHILD, str(ready)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the child did not start"
    found = stop_tree([root.pid], grace_s=1.0)
    root.wait(timeout=5)
    assert len(found) == 2 and root.pid in found
    assert [pid for pid in found if running(pid)] == []


def test_the_simulations_clientapps_run_at_its_own_priority_unless_the_user_says(tmp_path, monkeypatch):
    """Ray's workers default to 15 steps nicer than their driver (starved beside any busy process)."""
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert local_flower(tmp_path / "a").env["RAY_worker_niceness"] == "0"
    monkeypatch.setenv("RAY_worker_niceness", "10")
    assert local_flower(tmp_path / "b").env["RAY_worker_niceness"] == "10"
