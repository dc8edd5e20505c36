"""Client state files written behind the next call (``persist.saves_behind``), as the batched Grid has them.

Within the block a save returns at once and a thread of the block writes
the file; leaving the block waits for every file, so what is on disk then is
what saving in the caller's thread leaves.
"""

from __future__ import annotations

import contextvars
import logging
import threading

import numpy as np
import pytest

from flower_fakes import task_identity  # noqa: F401
import lips_flwr.clients.persist as persist
from lips_flwr.clients.persist import saves_behind
from lips_flwr.persistence.npz_store import read_groups
from test_client_persist import KEY, new_run_context, train_round
from test_clients import FakeApp

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

    writing, release, writers = threading.Event(), threading.Event(), []
    write_groups = persist.write_groups

    def held(*args, **kwargs):  # the block's thread waits here until the test lets it go on
        writers.append(threading.current_thread().name)
        writing.set()
        assert release.wait(30)
        return write_groups(*args, **kwargs)

    monkeypatch.setattr(persist, "write_groups", held)
    behind = tmp_path / "behind"
    app, ctx = FakeApp(), new_run_context(behind)
    with saves_behind():
        train_round(ctx, app, 1)  # returned although its file is not written yet
        assert writing.wait(30) and not (behind / NAME).exists()
        train_round(ctx, app, 2)
        train_round(ctx, app, 3)
        release.set()
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
