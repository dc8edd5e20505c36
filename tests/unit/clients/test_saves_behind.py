"""Client state files written behind the next call (``clients.saves_behind``), as the batched Grid has them.

Within the block a save returns at once and the block's thread writes the
file; leaving the block waits for every file, so what is on disk then is
what saving in the caller's thread leaves.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time

import numpy as np
import pytest
from flower_fakes import task_identity  # noqa: F401
from test_client_persist import KEY, new_run_context, train_round
from test_clients import FakeApp

import lips_flwr.clients.persist as persist
from lips_flwr.clients.saves_behind import saves_behind
from lips_flwr.persistence.npz_store import read_groups

pytestmark = pytest.mark.usefixtures("task_identity")
NAME = f"lips-client-{KEY}-0.npz"


def files(folder) -> dict:
    """Each state file's groups and metadata, by name."""
    return {path.name: read_groups(path, "state") for path in sorted(folder.iterdir())}


def assert_same_files(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, (groups, meta) in expected.items():
        assert got[name][1] == meta
        assert got[name][0].keys() == groups.keys()
        for key, arrays in groups.items():
            assert list(got[name][0][key]) == list(arrays)
            for array_name, array in arrays.items():
                np.testing.assert_array_equal(got[name][0][key][array_name], array, strict=True)


def test_a_save_returns_before_its_file_is_written_and_the_block_waits_for_it(tmp_path, monkeypatch):
    in_place = tmp_path / "in-place"
    app, ctx = FakeApp(), new_run_context(in_place)  # (FakeApp's updates: a seeded generator's draws)
    for rnd in (1, 2, 3):
        train_round(ctx, app, rnd)
    expected = files(in_place)

    writing, release, writers, written = threading.Event(), threading.Event(), [], []
    write_groups = persist.write_groups

    def held(*args, **kwargs):  # the block's thread waits here until the test lets it go on
        writers.append(threading.current_thread().name)
        writing.set()
        assert release.wait(30)
        stat = write_groups(*args, **kwargs)
        written.append(time.monotonic())
        return stat

    monkeypatch.setattr(persist, "write_groups", held)
    behind = tmp_path / "behind"
    app, ctx = FakeApp(), new_run_context(behind)
    with saves_behind():
        train_round(ctx, app, 1)  # returned although its file is not written yet
        assert writing.wait(30) and not (behind / NAME).exists()
        train_round(ctx, app, 2)
        train_round(ctx, app, 3)
        threading.Timer(0.3, release.set).start()  # the files are let go only after the block is left
    left = time.monotonic()
    assert release.is_set() and len(written) == 3 and max(written) <= left  # the block waited for all
    assert writers == ["lips-flwr client state"] * 3  # one thread, not the caller's
    assert_same_files(files(behind), expected)  # rounds 3 and 2, as saving in place leaves them


def test_an_os_error_behind_is_logged_as_in_place_and_the_block_ends(tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING), saves_behind():
        train_round(new_run_context(blocked / "state"), FakeApp(), 1)
    assert "client state not kept on disk: cannot write" in caplog.text


def test_any_other_error_of_a_write_is_raised_when_the_block_ends(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(persist, "write_groups", broken)
    ctx = new_run_context(tmp_path)
    with pytest.raises(RuntimeError, match="a bug in the writer"), saves_behind():
        train_round(ctx, FakeApp(), 1)  # the reply is made; the error comes at the block's end
        train_round(ctx, FakeApp(), 2)


def test_a_write_past_the_timeout_is_a_timeout_error_naming_the_file(tmp_path, monkeypatch):
    release = threading.Event()
    write_groups = persist.write_groups
    monkeypatch.setattr(persist, "write_groups", lambda *args, **kwargs: release.wait(30) and write_groups(
        *args, **kwargs))
    try:
        with pytest.raises(TimeoutError, match=rf"not written within 0.2 s: still writing .*{NAME}"), \
                saves_behind(timeout=0.2):
            train_round(new_run_context(tmp_path), FakeApp(), 1)
    finally:
        release.set()


def test_a_write_error_is_logged_when_the_block_ends_by_another_error(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(persist, "write_groups", broken)
    with caplog.at_level(logging.ERROR), pytest.raises(KeyError, match="the call's own"), saves_behind():
        train_round(new_run_context(tmp_path), FakeApp(), 1)
        raise KeyError("the call's own")
    assert "client state file was not written: RuntimeError: a bug in the writer" in caplog.text


def test_a_save_after_the_block_ended_is_written_by_its_caller(tmp_path, monkeypatch):
    """A call that ran past its timeout saves after the delivery's block: in its own thread, at once."""
    writers = []
    write_groups = persist.write_groups
    monkeypatch.setattr(persist, "write_groups", lambda *args, **kwargs: writers.append(
        threading.current_thread().name) or write_groups(*args, **kwargs))
    with saves_behind():
        late = contextvars.copy_context()  # the context an abandoned call's thread runs in
    late.run(train_round, new_run_context(tmp_path), FakeApp(), 1)
    assert writers == [threading.current_thread().name] and (tmp_path / NAME).exists()
