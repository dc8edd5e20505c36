"""Issue 28, defect 9: client state never costs a round, however its folder or file fails.

Any OS error on the ``lips-state-dir`` folder or the state file is a WARNING
naming the path and the error, and the reply goes out (the client trains as
without persisted state), every round, under both APIs. Long partition ids
get a short, stable file name; a state file of another model is not restored.

Permission bits do not stop root, so the permission cases run in a child
process (:mod:`client_state_child`) that they do stop: as user ``nobody``
where it can run this interpreter, else as root without
``CAP_DAC_OVERRIDE``/``CAP_DAC_READ_SEARCH``; as any other user, as that user.
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from unit_paths import UNIT
from flwr.app import Context, RecordDict

import lips_flwr.clients.persist as persist
from flower_fakes import task_identity, tiny_model  # noqa: F401
from lips_flwr.clients import LIPSNumPyClient
from lips_flwr.clients.persist import FORMAT, state_path
from lips_flwr.clients.state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY
from lips_flwr.persistence.npz_store import read_groups, write_groups
from test_client_persist import KEY, new_run_context, train_round
from test_clients import NAMES, FakeApp, UserClient, lips_config

pytestmark = pytest.mark.usefixtures("task_identity")
REPO = Path(__file__).resolve().parents[3]
CHILD = UNIT / "client_state_child.py"
NOBODY = 65534
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2
# Scenario -> what the OS says (the text of its error) in the WARNING.
PERMISSION_CASES = {"mode-600": "Permission denied", "mode-000": "Permission denied",
                    "inside-000": "Permission denied", "read-only": "Permission denied",
                    "breaks-mid-run": "Permission denied"}


# ----------------------------------------------------------------- running unprivileged

def _drop_dac_capabilities() -> None:
    """In the child before exec: remove root's power to ignore permission bits (``prctl``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _limit_file_size() -> None:
    """In the child before exec: files over 1,000 bytes fail with EFBIG (the signal ignored)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _child_env(home: Path) -> dict:
    return dict(os.environ, HOME=str(home), FLWR_TELEMETRY_ENABLED="0", PYTHONDONTWRITEBYTECODE="1",
                FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")


def _run_child(api: str, base: Path, scenarios: list[str], **popen) -> dict:
    done = subprocess.run([sys.executable, str(CHILD), api, str(base), *scenarios], cwd=REPO,
                          env=_child_env(base), capture_output=True, text=True, timeout=600, **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _nobody_can_run_python(base: Path) -> bool:
    try:
        done = subprocess.run([sys.executable, "-c", "import lips_flwr, flwr, torch"], cwd=REPO,
                              env=_child_env(base), capture_output=True, timeout=300,
                              user=NOBODY, group=NOBODY, extra_groups=[])
    except OSError:  # the interpreter is where nobody may not go (under /root, say)
        return False
    return done.returncode == 0


def _dropping_capabilities_works(base: Path) -> bool:
    closed = base / "closed"
    closed.mkdir(mode=0o000)
    try:
        done = subprocess.run([sys.executable, "-c", "import os, sys; os.listdir(sys.argv[1])", str(closed)],
                              capture_output=True, timeout=60, preexec_fn=_drop_dac_capabilities)
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        closed.rmdir()
    return done.returncode != 0 and b"PermissionError" in done.stderr


@functools.cache
def _unprivileged_results(api: str) -> dict:
    """The permission scenarios' results for ``api``, from one child that permission bits stop."""
    if sys.platform == "win32":
        pytest.skip("POSIX permission bits: not on Windows")
    scenarios = sorted(PERMISSION_CASES)
    if os.geteuid() != 0:  # permission bits stop this user already
        base = Path(tempfile.mkdtemp(prefix="lips-state-test-"))
        try:
            return _run_child(api, base, scenarios)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    base = Path(tempfile.mkdtemp(prefix="lips-state-test-"))  # pytest's tmp_path is root's alone
    try:
        if _nobody_can_run_python(base):
            os.chown(base, NOBODY, NOBODY)
            return _run_child(api, base, scenarios, user=NOBODY, group=NOBODY, extra_groups=[])
        if _dropping_capabilities_works(base):
            return _run_child(api, base, scenarios, preexec_fn=_drop_dac_capabilities)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    pytest.skip("running as root, and neither can user nobody run this interpreter nor can this "
                "process drop CAP_DAC_OVERRIDE (no CAP_SETPCAP): permission bits cannot be tested")


def _check_every_reply_went_out(result: dict) -> None:
    calls = result["calls"]
    assert [c["error"] for c in calls] == [None] * 4, calls  # 3 trainings and an evaluation
    assert all("lips-update-norm" in c["metrics"] for c in calls[:3])
    assert all("lips-client-fallback" in c["metrics"] for c in calls[1:3])  # the mask rounds ran


@pytest.mark.slow
@pytest.mark.parametrize("api", ["message", "numpy"])
@pytest.mark.parametrize("scenario", sorted(PERMISSION_CASES))
def test_a_folder_without_permission_costs_no_round(scenario, api):
    """Before: PermissionError out of the mod / fit in every round (mode 600, 000, inside 000)."""
    result = _unprivileged_results(api)[scenario]
    _check_every_reply_went_out(result)
    warned = [w for w in result["warnings"] if result["folder"] in w]
    assert warned, result["warnings"]
    assert any(PERMISSION_CASES[scenario] in w and "not kept on disk" in w for w in warned), warned
    if scenario != "read-only":  # there the file reads: only writing fails
        assert any("not restored" in w and result["path"] in w for w in warned), warned
    assert len(warned) == len(set(warned))  # each problem once, not every round


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
@pytest.mark.parametrize("api", ["message", "numpy"])
def test_a_file_size_limit_costs_no_round(tmp_path, api):
    """A write that the OS refuses mid-file (EFBIG, as a full disk would): logged, the reply goes out."""
    result = _run_child(api, tmp_path, ["file-size-limit"], preexec_fn=_limit_file_size)["file-size-limit"]
    _check_every_reply_went_out(result)
    assert any("File too large" in w and result["path"] in w for w in result["warnings"]), result["warnings"]
    assert not [p.name for p in Path(result["folder"]).iterdir()]  # no half file, no temporary left


# ----------------------------------------------------------------- in this process

def _numpy_fit(ctx: Context, app: FakeApp, rnd: int, tau: float = 0.0) -> dict:
    client = LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local="batchnorm")
    _, _, metrics = client.fit(list(tiny_model(rnd).values()), {**lips_config(rnd, tau), "lips-run-key": KEY})
    return metrics


def _message_fit(ctx: Context, app: FakeApp, rnd: int, tau: float = 0.0) -> dict:
    reply = train_round(ctx, app, rnd, tau=tau)
    assert not reply.has_error(), reply.error.reason
    return dict(reply.content["metrics"])


FIT: dict[str, Callable[..., dict]] = {"message": _message_fit, "numpy": _numpy_fit}


def _context(folder: Path, partition: object) -> Context:
    node_config = {"partition-id": partition, "lips-state-dir": str(folder)}
    return Context(run_id=7, node_id=42, node_config=node_config, state=RecordDict(), run_config={})


@pytest.mark.parametrize("api", ["message", "numpy"])
def test_a_long_partition_id_gets_a_short_stable_file_name(tmp_path, api):
    """Before: OSError 'File name too long' in every round (a 250-character id)."""
    long_id = "p" * 250
    path = state_path(_context(tmp_path, long_id), {"lips-run-key": KEY})
    assert path is not None and len(path.name.encode()) <= 160  # room for '.prev' and a temporary's suffix
    assert path == state_path(_context(tmp_path, long_id), {"lips-run-key": KEY})  # stable
    app, ctx = FakeApp(), _context(tmp_path, long_id)
    for rnd in (1, 2):
        assert "lips-update-norm" in FIT[api](ctx, app, rnd, tau=0.3 if rnd > 1 else 0.0)
    assert path.is_file() and read_groups(path, "state")[1]["round"] == 2
    resumed = _context(tmp_path, long_id)  # a new Flower run finds it
    assert FIT[api](resumed, app, 3, tau=0.3)["lips-client-fallback"] == 0.0


def test_long_partition_ids_never_share_a_file():
    """What keeps the names apart: the length (<= 64 kept, > 64 hashed to 97) and SHA-256."""
    folder = Path("/state")
    ids = ["a" * 64, "a" * 65, "a" * 300, "a" * 299 + "b", "b" + "a" * 299, "a" * 32 + "-" + "0" * 64,
           "x" * 97]
    names = [state_path(_context(folder, who), {"lips-run-key": KEY}).name for who in ids]
    assert len(set(names)) == len(ids)
    assert names[0] == f"lips-client-{KEY}-{'a' * 64}.npz"  # short ids keep their readable name
    assert all(len(n.encode()) <= 160 for n in names)


def test_a_clients_file_is_made_once_per_folder_run_and_client_and_each_its_own():
    folder = Path("/state")
    first = state_path(_context(folder, 3), {"lips-run-key": KEY})
    assert state_path(_context(folder, 3), {"lips-run-key": KEY}) is first  # (kept: no Path parsed again)
    assert first == folder / f"lips-client-{KEY}-3.npz"
    others = [state_path(_context(folder, 4), {"lips-run-key": KEY}),
              state_path(_context(Path("/other"), 3), {"lips-run-key": KEY}),
              state_path(_context(folder, 3), {"lips-run-key": "b" * 32})]
    assert len({first, *others}) == 4


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("api", ["message", "numpy"])
@pytest.mark.parametrize("thing", ["folder", "fifo"])
def test_a_folder_or_fifo_at_the_state_files_path_costs_no_round(tmp_path, caplog, api, thing):
    """Before: FileNotFoundError('no LIPS client state at ...') in every round."""
    if thing == "fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / f"lips-client-{KEY}-0.npz"
    path.mkdir() if thing == "folder" else os.mkfifo(path)
    metrics: list = []

    def rounds() -> None:  # reading a FIFO would block: run where a hang is seen, not waited on
        app, ctx = FakeApp(), new_run_context(tmp_path)
        metrics.extend(FIT[api](ctx, app, rnd, tau=0.3 if rnd > 1 else 0.0) for rnd in (1, 2, 3))
        metrics.append(FIT[api](new_run_context(tmp_path), app, 4, tau=0.3))  # a resumed run

    with caplog.at_level(logging.WARNING):
        worker = threading.Thread(target=rounds, daemon=True)
        worker.start()
        worker.join(timeout=120)
    assert not worker.is_alive(), "a round blocked on the state file"
    assert len(metrics) == 4 and all("lips-update-norm" in m for m in metrics)
    warned = [w for w in _warnings(caplog) if str(path) in w]
    assert len(warned) == 1 and "not a regular file" in warned[0], _warnings(caplog)
    assert path.is_dir() if thing == "folder" else path.is_fifo()  # left alone


def _other_model() -> dict[str, np.ndarray]:
    """A model of other shapes under the same names (another ClientApp under the same run key)."""
    return {name: np.ones((3, 3), dtype=np.float32) for name in ("conv2.weight", "conv3.weight")}


@pytest.mark.parametrize("api", ["message", "numpy"])
@pytest.mark.parametrize("case", ["other-shapes", "other-names"])
def test_a_state_file_of_another_model_starts_fresh(tmp_path, caplog, api, case):
    """Before: every client-mode mask round was an error reply ('update shape (3, 3) does not match')."""
    signal = _other_model()
    if case == "other-names":
        signal = {f"other.{name}": array for name, array in signal.items()}
    local = {"bn1.weight": np.ones(7, dtype=np.float32)}
    write_groups(tmp_path / f"lips-client-{KEY}-0.npz", {SIGNAL_KEY: signal, LOCAL_KEY: local},
                 {"format": FORMAT, "configs": {SIGNAL_ROUND_KEY: {"round": 1}}, "round": 1})
    app, ctx = FakeApp(), new_run_context(tmp_path)
    with caplog.at_level(logging.WARNING):
        metrics = FIT[api](ctx, app, 2, tau=0.3)  # a mask round reads the signal
        again = FIT[api](ctx, app, 3, tau=0.3)
    assert metrics["lips-client-fallback"] == 1.0  # started fresh: magnitude
    assert again["lips-client-fallback"] == 0.0  # then its own signal of round 2
    warned = [w for w in _warnings(caplog) if "of another model" in w]
    assert len(warned) == 1 and "conv2.weight" in warned[0] and "not restored" in warned[0]
    saved = read_groups(tmp_path / f"lips-client-{KEY}-0.npz", "state")[0]
    assert saved[SIGNAL_KEY]["conv2.weight"].shape == tiny_model()["conv2.weight"].shape  # replaced


def test_a_nul_in_the_state_folder_is_logged_and_nothing_kept(tmp_path, caplog):
    """No OS call takes a NUL: ValueError('embedded null byte') before, every round."""
    app, ctx = FakeApp(), new_run_context(str(tmp_path) + "/a\x00b")
    with caplog.at_level(logging.WARNING):
        for rnd in (1, 2):
            assert "lips-update-norm" in _message_fit(ctx, app, rnd)
    assert any("NUL" in w for w in _warnings(caplog))
    assert not list(tmp_path.iterdir())


def test_a_state_folder_failing_mid_run_is_logged_once_per_problem(tmp_path, caplog, monkeypatch):
    """Any OSError, not only PermissionError: both reading and writing are guarded."""
    app, ctx = FakeApp(), new_run_context(tmp_path)
    _message_fit(ctx, app, 1)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist, "write_groups", full)
    monkeypatch.setattr(persist, "read_meta", full)
    with caplog.at_level(logging.WARNING):
        for rnd in (2, 3):
            assert "lips-update-norm" in _message_fit(ctx, app, rnd, tau=0.3)
        assert "lips-update-norm" in _message_fit(new_run_context(tmp_path), app, 4, tau=0.3)
    warned = [w for w in _warnings(caplog) if "No space left" in w]
    assert len(warned) == 2, warned  # one for writing, one for reading
    assert any("not kept on disk" in w for w in warned) and any("not restored" in w for w in warned)
