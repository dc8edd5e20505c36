"""Issue 28, defect 6: a checkpoint the OS refuses to write costs no round.

Before, a save that failed ended the run with a raw ``OSError`` that did not
name the checkpoint (a folder turned read-only: ``PermissionError`` on
``.ck.npz.<pid>.<random>``; a file-size limit: ``[Errno 27] File too large``),
and the rounds since the last save were lost. Now each failed save is an
ERROR naming the checkpoint and the error; the run goes on, and each later
round's save tries again until one succeeds. The runs are child processes
(:mod:`checkpoint_child`): permission bits do not stop root (run unprivileged
as in :mod:`test_client_state_failures`), and a file-size limit must not
reach pytest's own files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_client_state_failures import (
    NOBODY,
    REPO,
    _child_env,
    _drop_dac_capabilities,
    _dropping_capabilities_works,
    _nobody_can_run_python,
)

CHILD = Path(__file__).with_name("checkpoint_child.py")
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits and RLIMIT_FSIZE")


def _run(api: str, base: Path, scenario: str, **popen) -> dict:
    done = subprocess.run([sys.executable, str(CHILD), api, str(base), scenario], cwd=REPO,
                          env=_child_env(base), capture_output=True, text=True, timeout=600, **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _unprivileged(api: str, base: Path) -> dict:
    """The read-only scenario in a child that permission bits stop."""
    if os.geteuid() != 0:
        return _run(api, base, "read-only")
    if _nobody_can_run_python(base):
        os.chown(base, NOBODY, NOBODY)
        return _run(api, base, "read-only", user=NOBODY, group=NOBODY, extra_groups=[])
    if _dropping_capabilities_works(base):
        return _run(api, base, "read-only", preexec_fn=_drop_dac_capabilities)
    pytest.skip("running as root, and neither can user nobody run this interpreter nor can this "
                "process drop CAP_DAC_OVERRIDE: permission bits cannot be tested")


def _check(result: dict, error: str) -> None:
    assert result["rounds"] == [1, 2, 3, 4, 5]  # no round lost
    assert len(result["errors"]) == 2, result["errors"]  # the saves after rounds 2 and 3
    for server_round, text in zip((2, 3), result["errors"]):
        assert text.startswith(f"LIPS: cannot write the checkpoint {result['path']!r} after round {server_round}")
        assert error in text and "the run goes on; the next round's save tries again" in text
    assert result["saved"] == 5  # later saves succeeded, the last one too
    assert [name for name in result["files"] if name.startswith(".")] == []  # no temporary left


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_checkpoint_folder_turned_read_only_mid_run_costs_no_round(api):
    base = Path(tempfile.mkdtemp(prefix="lips-checkpoint-test-"))  # pytest's tmp_path is root's alone
    try:
        result = _unprivileged(api, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _check(result, "PermissionError: [Errno 13] Permission denied")


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_file_size_limit_mid_run_costs_no_round(tmp_path, api):
    _check(_run(api, tmp_path, "file-size-limit"), "OSError: [Errno 27] File too large")
