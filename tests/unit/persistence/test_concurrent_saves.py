"""Issue 28, defect 7 (second half): direct concurrent ``save_checkpoint`` calls on one path.

Before: two threads saving one path failed 82 of 300 saves with
``FileNotFoundError``: each save's cleanup removed the other's temporary file
(same process id) mid-write. Now threads of a process take turns (a per-path
lock) and processes write their own temporaries and rename them atomically:
every save succeeds, and the file on disk is always one whole checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from lips_flwr.persistence.checkpoint import Checkpoint, check_writable, load_checkpoint, save_checkpoint
from lips_flwr.persistence.npz_store import path_lock
from watchdog import child_status

REPO = Path(__file__).resolve().parents[3]
SAVES = 150


def checkpoint(writer: int, rnd: int) -> Checkpoint:
    """A checkpoint whose every part says who wrote it and when: a mixed file would show."""
    stamp = float(writer * 1000 + rnd)
    model = {"conv.weight": np.full((16, 8, 3, 3), stamp, dtype=np.float32),
             "fc.bias": np.full(10, stamp, dtype=np.float32)}
    return Checkpoint(round=rnd, num_rounds=SAVES, settings={"writer": writer}, model=model)


def check_whole(loaded: Checkpoint) -> tuple[int, int]:
    """``(writer, round)`` of a loaded checkpoint; fails if its parts come from different saves."""
    writer, rnd = loaded.settings["writer"], loaded.round
    for name, array in loaded.model.items():
        assert np.all(array == writer * 1000 + rnd), f"{name} is not of writer {writer}'s round {rnd}"
    return writer, rnd


def save_all(path: Path, writer: int, failures: list) -> None:
    for rnd in range(1, SAVES + 1):
        try:
            save_checkpoint(path, checkpoint(writer, rnd))
        except Exception as err:  # what the test counts
            failures.append(f"writer {writer} round {rnd}: {err!r}")


class Reader(threading.Thread):
    """Loads the checkpoint again and again while the writers write; keeps what it saw."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop, self.seen, self.errors = path, threading.Event(), set(), []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.seen.add(check_whole(load_checkpoint(self.path)))
            except FileNotFoundError:
                continue  # before the first save
            except Exception as err:  # a half file, a mixed one
                self.errors.append(repr(err))


def temporaries(folder: Path, name: str) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(f".{name}.")]


@pytest.mark.slow
@pytest.mark.parametrize("writers", [2, 4])
def test_threads_saving_one_path_all_succeed_and_the_file_is_always_whole(tmp_path, writers):
    path, failures = tmp_path / "lips.npz", []
    reader = Reader(path)
    reader.start()
    threads = [threading.Thread(target=save_all, args=(path, w, failures)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader.stop.set()
    reader.join()
    assert failures == [], f"{len(failures)} of {writers * SAVES} saves failed: {failures[:3]}"
    assert reader.errors == [] and len(reader.seen) > 1
    assert check_whole(load_checkpoint(path))[1] == SAVES  # one writer's last save
    assert temporaries(tmp_path, path.name) == []


WRITER = r"""
import json, sys, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
sys.path.insert(1, str(Path(sys.argv[4]).parent))  # tests/unit: the module imports watchdog
from test_concurrent_saves import save_all
path, first, go = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
failures = []
threads = [threading.Thread(target=save_all, args=(path, first + k, failures)) for k in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(failures))
"""


@pytest.mark.slow
def test_processes_of_two_threads_each_saving_one_path_all_succeed(tmp_path):
    path, go = tmp_path / "lips.npz", tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(first), str(go),
                               str(Path(__file__).parent)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              text=True) for first in (0, 2)]
    reader = Reader(path)
    reader.start()
    go.write_text("")
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    reader.stop.set()
    reader.join()
    assert [proc.returncode for proc in procs] == [0, 0]
    failures = [f for out in outputs for f in json.loads(out.strip().splitlines()[-1])]
    assert failures == [], f"{len(failures)} of {4 * SAVES} saves failed: {failures[:3]}"
    assert reader.errors == [] and len(reader.seen) > 1
    assert check_whole(load_checkpoint(path))[1] == SAVES
    assert temporaries(tmp_path, path.name) == []


@pytest.mark.slow
def test_checking_a_checkpoint_is_writable_while_another_thread_saves_it(tmp_path):
    """check_writable's probe is named like a save's temporary: a save's cleanup must leave it."""
    path, failures, refused = tmp_path / "lips.npz", [], []
    saver = threading.Thread(target=save_all, args=(path, 0, failures))
    saver.start()
    while saver.is_alive():
        try:
            check_writable(path)
        except ValueError as err:
            refused.append(str(err))
    saver.join()
    assert failures == [] and refused == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_child_forked_while_a_thread_saves_can_save_too(tmp_path):
    """The per-path lock held by a thread that does not follow the fork must not block the child."""
    path, held, release = tmp_path / "lips.npz", threading.Event(), threading.Event()

    def hold() -> None:
        with path_lock(path):
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # the child: save, and say how it went in its exit status
            try:
                save_checkpoint(path, checkpoint(9, 1))
            finally:
                os._exit(0 if path.exists() else 1)
        status = child_status(pid, "the per-path lock")  # a blocked child must fail, not hang
    finally:
        release.set()
        holder.join()
    assert os.waitstatus_to_exitcode(status) == 0
    assert check_whole(load_checkpoint(path)) == (9, 1)
