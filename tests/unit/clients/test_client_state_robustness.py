"""A client's state folder can fail in every way without costing the round (issue: no client ends a run).

An unwritable or misplaced ``lips-state-dir`` only stops the state being
kept on disk (one WARNING); a state file lacking a part is treated as absent;
a partition id that is not a plain name never becomes a path.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from flwr.app import Context, RecordDict

import lips_flwr.clients.persist as persist
from flower_fakes import task_identity, tiny_model  # noqa: F401
from lips_flwr.clients import LIPSNumPyClient
from lips_flwr.clients.persist import FORMAT, state_path
from lips_flwr.clients.state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY
from lips_flwr.persistence.npz_store import write_groups
from test_client_persist import KEY, new_run_context, train_round
from test_clients import NAMES, FakeApp, UserClient, lips_config

pytestmark = pytest.mark.usefixtures("task_identity")
NOT_SAVED = "client state not kept on disk"


def _not_saved(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if NOT_SAVED in r.getMessage()]


def _folder(tmp_path, how: str):
    """A state folder that cannot be written, the way ``how`` says."""
    if how == "parent-is-a-file":  # what a read-only folder does to a non-root user
        (tmp_path / "blocker").write_text("a regular file")
        return tmp_path / "blocker" / "state"
    if how == "folder-is-a-file":
        (tmp_path / "state").write_text("a regular file")
        return tmp_path / "state"
    return tmp_path / "state"


@pytest.mark.parametrize("how", ["parent-is-a-file", "folder-is-a-file", "permission-denied"])
def test_unwritable_state_folder_keeps_the_trained_reply(tmp_path, caplog, monkeypatch, how):
    folder = _folder(tmp_path, how)
    if how == "permission-denied":  # root ignores chmod: make the write itself fail
        def denied(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(persist, "write_groups", denied)
    app, ctx = FakeApp(), new_run_context(folder)
    with caplog.at_level(logging.WARNING):
        for rnd in (1, 2, 3):
            reply = train_round(ctx, app, rnd, tau=0.3 if rnd > 1 else 0.0)
            assert not reply.has_error()
            assert reply.content["metrics"]["num-examples"] == 10  # the trained reply, as usual
            assert "lips-update-norm" in reply.content["metrics"]
    warned = _not_saved(caplog)
    assert len(warned) == 1, caplog.text  # once, not every round
    assert warned[0].levelno == logging.WARNING and str(folder) in warned[0].getMessage()
    assert ("Permission denied" if how == "permission-denied" else "Error") in warned[0].getMessage()
    assert warned[0].exc_info is None  # no traceback
    assert ctx.state[SIGNAL_ROUND_KEY]["round"] == 3  # the in-memory state goes on
    if how == "folder-is-a-file":
        assert (tmp_path / "state").read_text() == "a regular file"


def test_unwritable_state_folder_numpy_client_keeps_the_fit_result(tmp_path, caplog):
    folder = _folder(tmp_path, "parent-is-a-file")
    app, ctx = FakeApp(), new_run_context(folder)
    client = LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local="batchnorm")
    with caplog.at_level(logging.WARNING):
        for rnd in (1, 2):
            trained, num_examples, metrics = client.fit(
                list(tiny_model(rnd).values()), {**lips_config(rnd), "lips-run-key": KEY})
            assert len(trained) == len(NAMES) and num_examples == 10
            assert "lips-update-norm" in metrics
    assert len(_not_saved(caplog)) == 1


def _write_state(path, groups: dict, configs: dict, rnd: int = 1) -> None:
    write_groups(path, groups, {"format": FORMAT, "configs": configs, "round": rnd})


def _signal() -> dict:
    middle = ("conv2.weight", "conv3.weight")
    return {n: np.full_like(v, 0.01) for n, v in tiny_model().items() if n in middle}


PARTIAL = {
    "signal-without-its-round": ({SIGNAL_KEY: _signal()}, {}),
    "round-without-its-signal": ({}, {SIGNAL_ROUND_KEY: {"round": 1}}),
    "round-not-an-int": ({SIGNAL_KEY: _signal()}, {SIGNAL_ROUND_KEY: {"round": "one"}}),
    "round-record-without-round": ({SIGNAL_KEY: _signal()}, {SIGNAL_ROUND_KEY: {"other": 1}}),
    "local-as-a-config": ({}, {LOCAL_KEY: {"bn1.weight": 1.0}}),
    "signal-as-a-config": ({}, {SIGNAL_KEY: {"x": 1}, SIGNAL_ROUND_KEY: {"round": 1}}),
}


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_state_file_missing_a_part_is_treated_as_absent(tmp_path, caplog, case):
    groups, configs = PARTIAL[case]
    _write_state(tmp_path / f"lips-client-{KEY}-0.npz", groups, configs)
    app, ctx = FakeApp(), new_run_context(tmp_path)
    with caplog.at_level(logging.WARNING):
        reply = train_round(ctx, app, 2, tau=0.3)  # a client-mode mask round reads the signal
    assert not reply.has_error()
    assert "client state not restored" in caplog.text
    assert reply.content["metrics"]["lips-client-fallback"] == 1.0  # started fresh: magnitude
    assert ctx.state[SIGNAL_ROUND_KEY]["round"] == 2  # trained and saved anew


def test_state_file_whose_arrays_are_damaged_is_treated_as_absent(tmp_path, caplog):
    """The metadata reads, the arrays it names are not there."""
    header = {"format": FORMAT, "configs": {SIGNAL_ROUND_KEY: {"round": 1}}, "round": 1,
              "groups": {SIGNAL_KEY: ["conv2.weight"]}}
    with open(tmp_path / f"lips-client-{KEY}-0.npz", "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    app, ctx = FakeApp(), new_run_context(tmp_path)
    with caplog.at_level(logging.WARNING):
        reply = train_round(ctx, app, 2, tau=0.3)
    assert not reply.has_error()
    assert "client state not restored" in caplog.text
    assert reply.content["metrics"]["lips-client-fallback"] == 1.0


def test_a_complete_file_is_still_restored(tmp_path):
    _write_state(tmp_path / f"lips-client-{KEY}-0.npz", {SIGNAL_KEY: _signal()},
                 {SIGNAL_ROUND_KEY: {"round": 1}})
    app, ctx = FakeApp(), new_run_context(tmp_path)
    reply = train_round(ctx, app, 2, tau=0.3)
    assert reply.content["metrics"]["lips-client-fallback"] == 0.0  # the saved signal was used


@pytest.mark.parametrize("who", ["../escaped", "../../escaped", "/../../escaped", "a/b", "..", "x/../../y",
                                 "", "a b", "a\x00b", 1.5, True, None])
def test_a_partition_id_that_is_not_a_plain_name_is_not_persisted(tmp_path, caplog, who):
    folder = tmp_path / "one" / "two" / "state"
    ctx = Context(run_id=7, node_id=42, node_config={"partition-id": who, "lips-state-dir": str(folder)},
                  state=RecordDict(), run_config={})
    with caplog.at_level(logging.WARNING):
        assert state_path(ctx, {"lips-run-key": KEY}) is None
        reply = train_round(ctx, FakeApp(), 1)
    assert not reply.has_error() and "lips-update-norm" in reply.content["metrics"]
    assert "not a plain name" in caplog.text
    assert not [p for p in tmp_path.rglob("*") if not p.is_dir()]  # nothing written, anywhere


@pytest.mark.parametrize("who", [3, 0, "client_3", "node-1.a", "A.b-c_9"])
def test_plain_partition_ids_name_a_file_in_the_folder(tmp_path, who):
    ctx = Context(run_id=7, node_id=42, node_config={"partition-id": who, "lips-state-dir": str(tmp_path)},
                  state=RecordDict(), run_config={})
    path = state_path(ctx, {"lips-run-key": KEY})
    assert path == tmp_path / f"lips-client-{KEY}-{who}.npz"
    train_round(ctx, FakeApp(), 1)
    assert path.exists() and path.parent == tmp_path


def test_node_id_is_used_without_a_partition_id(tmp_path):
    ctx = Context(run_id=7, node_id=12345, node_config={"lips-state-dir": str(tmp_path)},
                  state=RecordDict(), run_config={})
    assert state_path(ctx, {"lips-run-key": KEY}) == tmp_path / f"lips-client-{KEY}-12345.npz"
