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
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from unit_paths import UNIT
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

import lips_flwr.persistence.lock as lock_module
import lips_flwr.strategies.resume.keeper as keeper_module
from watchdog import child_status
from flower_fakes import (
    client_manager,
    client_models,
    fit_result,
    params_to_model,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_record,
)
from lips_flwr.strategies import LIPS, LegacyLIPS

from test_client_state_failures import (
    NOBODY,
    REPO,
    _child_env,
    _drop_dac_capabilities,
    _dropping_capabilities_works,
    _nobody_can_run_python,
)

from test_reply_robustness import fake_grid

CHILD = UNIT / "checkpoint_child.py"
posix = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits and RLIMIT_FSIZE")


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


@pytest.mark.slow
@posix
@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_checkpoint_folder_turned_read_only_mid_run_costs_no_round(api):
    base = Path(tempfile.mkdtemp(prefix="lips-checkpoint-test-"))  # pytest's tmp_path is root's alone
    try:
        result = _unprivileged(api, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _check(result, "PermissionError: [Errno 13] Permission denied")


@pytest.mark.slow
@posix
@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_file_size_limit_mid_run_costs_no_round(tmp_path, api):
    _check(_run(api, tmp_path, "file-size-limit"), "OSError: [Errno 27] File too large")


# ----------------------------------------------------------------- defect 7: the lock of a failed run
class GridDown(RuntimeError):
    pass


def _failing_message_run(path: Path) -> None:
    """A run whose grid fails in round 3 (after the save of round 2)."""
    grid = fake_grid()
    answer = grid.send_and_receive.side_effect

    def failing(messages, timeout):
        messages = list(messages)
        if int(messages[0].content["config"]["server-round"]) == 3:
            raise GridDown("the grid is down")
        return answer(messages, timeout)

    grid.send_and_receive.side_effect = failing
    LIPS(FedAvg(), tau0=0.5, every=2, checkpoint_path=str(path)).start(
        grid=grid, initial_arrays=to_record(tiny_model()), num_rounds=5)


def _resumed_message_run(path: Path) -> list[int]:
    strategy = LIPS(FedAvg(), tau0=0.5, every=2, checkpoint_path=str(path), resume=True)
    result = strategy.start(grid=fake_grid(), initial_arrays=to_record(tiny_model()), num_rounds=5)
    return sorted(result.train_metrics_clientapp)


class FailingFedAvg(LegacyFedAvg):
    def aggregate_fit(self, server_round, results, failures):
        if server_round == 3:
            raise GridDown("the wrapped strategy failed")
        return super().aggregate_fit(server_round, results, failures)


def _failing_legacy_run(path: Path) -> None:
    names, current = list(tiny_model()), tiny_model()
    strategy = LegacyLIPS(FailingFedAvg(), param_names=names, num_rounds=5, checkpoint_path=str(path))
    for rnd in range(1, 6):
        strategy.configure_fit(rnd, ndarrays_to_parameters(list(current.values())), client_manager(3))
        trained = client_models(current, 3, seed=rnd)
        new, _ = strategy.aggregate_fit(rnd, [fit_result(m, 10, str(i + 1)) for i, m in enumerate(trained)], [])
        current = params_to_model(new, names)


def _resumed_legacy_run(path: Path) -> list[int]:
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=list(tiny_model()), num_rounds=5,
                          checkpoint_path=str(path), resume=True)
    return [strategy.rounds_left]


@pytest.mark.parametrize(("failing", "resumed", "expected"), [
    (_failing_message_run, _resumed_message_run, [1, 2, 3, 4, 5]),
    (_failing_legacy_run, _resumed_legacy_run, [3]),
], ids=["message", "legacy"])
def test_a_run_that_failed_in_a_thread_pool_worker_frees_its_checkpoint(tmp_path, task_identity, failing,
                                                                        resumed, expected):
    """Before: the worker thread lives on and its Future keeps the traceback (so the strategy): a
    resume in another worker was refused, 'another run is writing it', though nothing ran."""
    path = tmp_path / "lips.npz"
    with ThreadPoolExecutor(1) as first, ThreadPoolExecutor(1) as second:
        failed = first.submit(failing, path)
        with pytest.raises(GridDown):
            failed.result()
        assert first.submit(threading.current_thread).result().is_alive()  # its worker lives on
        assert second.submit(resumed, path).result() == expected
        del failed


def test_a_legacy_run_whose_last_save_fails_frees_its_checkpoint(tmp_path, monkeypatch, caplog):
    """Before: an OSError in the last round's save returned before the lock went, and the legacy API
    has no end-of-run hook: a resume in another thread was refused, 'another run is writing it'."""
    path, names, current = tmp_path / "lips.npz", list(tiny_model()), tiny_model()
    real_save = keeper_module.save_checkpoint

    def full_disk_at_round_2(target, checkpoint):
        if checkpoint.round == 2:
            raise OSError(28, "No space left on device")
        return real_save(target, checkpoint)

    monkeypatch.setattr(keeper_module, "save_checkpoint", full_disk_at_round_2)
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=names, num_rounds=2, checkpoint_path=str(path))
    for rnd in (1, 2):
        strategy.configure_fit(rnd, ndarrays_to_parameters(list(current.values())), client_manager(3))
        trained = client_models(current, 3, seed=rnd)
        new, _ = strategy.aggregate_fit(rnd, [fit_result(m, 10, str(i + 1)) for i, m in enumerate(trained)], [])
        current = params_to_model(new, names)
    assert "LIPS: cannot write the checkpoint" in caplog.text and "after round 2 (OSError" in caplog.text

    def resume() -> int:
        return LegacyLIPS(LegacyFedAvg(), param_names=names, num_rounds=2, checkpoint_path=str(path),
                          resume=True).rounds_left

    with ThreadPoolExecutor(1) as other:  # `strategy`, whose save failed, is still alive here
        assert other.submit(resume).result() == 1  # from round 1's checkpoint


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_child_forked_while_a_thread_holds_the_lock_table_can_lock(tmp_path):
    """The guard of the table of lock holders, held by a thread that does not follow a fork, must
    not block the child (it had no at-fork reset)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock_module._HOLDERS_GUARD:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # the child: lock a checkpoint, and say how it went in its exit status
            try:
                lock_module.lock_checkpoint(tmp_path / "child.npz").release()
            finally:
                os._exit(0)
        status = child_status(pid, "the lock table's guard")
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
