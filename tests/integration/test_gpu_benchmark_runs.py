"""Issue 39: the GPU benchmark cannot rot. ``bench_engines.py --gpu --quick`` runs on CPU.

Nothing ran ``--gpu`` between GPU sessions, so when the batched Grid's
``_deliver`` gained a ``timeout`` argument, the benchmark's timing wrapper
kept the old signature and ``--gpu`` failed at its first round on the H200.
This runs the same code path (stacked and auto engines against the compute
floor, the time split, the FLOP count) at a CPU-sized toy scale. It checks
that the benchmark runs and reports every part; it times nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")
pytestmark = pytest.mark.integration


def test_bench_engines_gpu_quick_runs_on_cpu(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    done = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_engines.py"), "--gpu", "--quick"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    for row in ("| batched (stacked) |", "| batched (auto) |", "| compute floor |"):
        assert row in out, (row, out[-4000:])
    # every engine trained (an accuracy per engine), and the round's time split and FLOPs are there
    assert "acc-after of the last round" in out and "stacked " in out.split("acc-after of the last round")[1]
    assert "Where a batched (stacked) round goes" in out and "server step" in out
    assert "FLOPs (torch FlopCounterMode" in out and "per round" in out
    assert not list(tmp_path.iterdir()) or all(p.name.startswith(".") for p in tmp_path.iterdir()), \
        sorted(p.name for p in tmp_path.iterdir())
