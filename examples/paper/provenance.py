"""What made a results file: the script, the code commit, whether the tree was dirty, versions, inputs.

Shared by the paper's analysis scripts (``setbacks.py``, ``pilot.py``) for
the JSON they write beside their tables. The versions and the machine are
the experiment runner's record of them
(:mod:`lips_flwr.experiments.runner.provenance`); the tree counts as dirty
here also for files git does not track (an analysis reads results folders).
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path

from lips_flwr.experiments.runner.provenance import cpu, versions

ROOT = Path(__file__).resolve().parents[2]


def provenance(inputs: list[Path], outputs: list[Path], script: Path) -> dict:
    """What made the numbers: the ``script``, the code commit, whether the tree was dirty, versions, inputs.

    ``dirty`` lists the working tree's changes (``git status --porcelain``,
    every untracked file) but the ``outputs`` themselves, which a second run
    rewrites.
    """
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    def name(path: Path) -> str:  # relative to the checkout when inside it
        path = path.resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    skip = {name(p) for p in outputs}
    status = git("status", "--porcelain", "--untracked-files=all").splitlines()
    changes = [line for line in status if line[3:] not in skip]
    return {"script": name(script),
            "commit": git("rev-parse", "HEAD").strip(), "dirty": bool(changes), "changes": changes,
            **versions(), "platform": platform.platform(), "cpu": cpu()["model"],
            "inputs": [{"path": name(p),
                        "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in inputs]}
