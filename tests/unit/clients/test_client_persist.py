"""Client state on disk across Flower runs: a resumed server run finds each client's FedBN and LIPS state.

Each Flower run gives its clients a fresh ``context.state``; a client with a
``lips-state-dir`` and a server that sends a run key writes its records after
every training and reads them back in a new run with the same key.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from flwr.app import Context, MessageType, RecordDict

from flower_fakes import task_identity, tiny_model  # noqa: F401
import lips_flwr.clients.persist as persist
from lips_flwr.clients import LIPSNumPyClient, fedbn_mod, lips_mod, persistent_state_mod
from lips_flwr.clients.persist import state_path
from lips_flwr.clients.state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY
from lips_flwr.core.layers import batch_norm_names
from lips_flwr.persistence.npz_store import read_groups, read_meta
from test_clients import NAMES, FakeApp, UserClient, lips_config, message

pytestmark = pytest.mark.usefixtures("task_identity")
KEY = "0123456789abcdef0123456789abcdef"
OTHER_KEY = "f" * 32
NAME = f"lips-client-{KEY}-0.npz"


def new_run_context(folder, partition: int = 0, where: str = "node") -> Context:
    """The context a SuperNode gives its ClientApp in a new Flower run (empty state)."""
    config = {"lips-state-dir": str(folder)}
    node = {"partition-id": partition, **(config if where == "node" else {})}
    run = config if where == "run" else {}
    return Context(run_id=7, node_id=42, node_config=node, state=RecordDict(), run_config=run)


def chain(msg, ctx, app):
    """ClientApp(mods=[persistent_state_mod, fedbn_mod, lips_mod])."""
    return persistent_state_mod(msg, ctx, lambda m, c: fedbn_mod(m, c, lambda m2, c2: lips_mod(m2, c2, app)))


def train_round(ctx, app, rnd: int, key: str = KEY, tau: float = 0.0):
    return chain(message(tiny_model(rnd), {**lips_config(rnd, tau), "lips-run-key": key}), ctx, app)


@pytest.mark.parametrize("where", ["node", "run"])
def test_resumed_run_finds_the_clients_fedbn_and_lips_state(tmp_path, where):
    app, first = FakeApp(), new_run_context(tmp_path, where=where)
    train_round(first, app, 1)
    train_round(first, app, 2)
    saved = {k: first.state[k] for k in (SIGNAL_KEY, SIGNAL_ROUND_KEY, LOCAL_KEY)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # after round 2, and after round 1
        f"lips-client-{KEY}-0.npz", f"lips-client-{KEY}-0.prev.npz"]

    second = new_run_context(tmp_path, where=where)  # the server restarted: a new Flower run
    train_round(second, app, 3, tau=0.3)
    # Round 3 trained from this client's own BN tensors of round 2, not the server's ...
    for name in batch_norm_names(tiny_model(3)):
        np.testing.assert_array_equal(app.received[-1][name], saved[LOCAL_KEY][name].numpy())
    # ... and was masked with its round-2 update (no magnitude fallback), then saved again.
    assert second.state[SIGNAL_ROUND_KEY]["round"] == 3
    assert all(np.count_nonzero(app.received[-1][n] == 0) for n in ("conv2.weight", "conv3.weight"))


def test_client_mode_signal_survives_so_no_fallback(tmp_path):
    app, first = FakeApp(), new_run_context(tmp_path)
    train_round(first, app, 1)
    second = new_run_context(tmp_path)
    reply = train_round(second, app, 2, tau=0.3)
    metrics = reply.content["metrics"]
    assert metrics["lips-client-fallback"] == 0.0 and metrics["lips-client-zeros"] > 0
    fresh = new_run_context(tmp_path / "elsewhere")
    reply = train_round(fresh, app, 2, tau=0.3)
    assert reply.content["metrics"]["lips-client-fallback"] == 1.0  # without the file: magnitude


def test_another_run_key_partition_or_no_folder_starts_fresh(tmp_path):
    app, first = FakeApp(), new_run_context(tmp_path)
    train_round(first, app, 1)
    for ctx, key in ((new_run_context(tmp_path), OTHER_KEY), (new_run_context(tmp_path, partition=1), KEY)):
        config = {"lips-run-key": key, "lips-round": 2}
        persistent_state_mod(message(tiny_model(2), config, MessageType.EVALUATE), ctx, app)
        assert SIGNAL_KEY not in ctx.state and LOCAL_KEY not in ctx.state
    plain = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert state_path(plain, {"lips-run-key": KEY}) is None
    assert state_path(new_run_context(tmp_path), {}) is None  # server does not checkpoint


def test_a_live_context_is_never_overwritten_from_disk(tmp_path):
    app, ctx = FakeApp(), new_run_context(tmp_path)
    train_round(ctx, app, 1)
    before = ctx.state[LOCAL_KEY]
    other = new_run_context(tmp_path)
    train_round(other, app, 5)  # writes a newer file
    train_round(ctx, app, 2)  # ctx has state: it trains from its own, not the file's
    for name in batch_norm_names(tiny_model(2)):
        np.testing.assert_array_equal(app.received[-1][name], before[name].numpy())


@pytest.mark.parametrize("key", ["../../etc/passwd", "ABC", 12])
def test_malformed_run_key_is_logged_and_nothing_written(tmp_path, caplog, key):
    with caplog.at_level(logging.WARNING):
        assert state_path(new_run_context(tmp_path), {"lips-run-key": key}) is None
    assert "malformed lips-run-key" in caplog.text


def test_damaged_file_is_logged_and_the_client_starts_fresh(tmp_path, caplog):
    app, ctx = FakeApp(), new_run_context(tmp_path)
    train_round(ctx, app, 1)
    (tmp_path / f"lips-client-{KEY}-0.npz").write_bytes(b"not a zip")
    fresh = new_run_context(tmp_path)
    with caplog.at_level(logging.WARNING):
        train_round(fresh, app, 2)
    assert "client state not restored" in caplog.text
    assert fresh.state[SIGNAL_ROUND_KEY]["round"] == 2  # trained and saved anew


def test_numpy_client_keeps_its_state_across_runs(tmp_path):
    app = FakeApp()
    first = new_run_context(tmp_path)
    client = LIPSNumPyClient(UserClient(app), first, param_names=NAMES, keep_local="batchnorm")
    client.fit(list(tiny_model(0).values()), {**lips_config(1), "lips-run-key": KEY})
    kept = first.state[LOCAL_KEY]
    second = new_run_context(tmp_path)
    LIPSNumPyClient(UserClient(app), second, param_names=NAMES, keep_local="batchnorm").evaluate(
        list(tiny_model(1).values()), {"lips-run-key": KEY, "lips-round": 1})
    for name in batch_norm_names(tiny_model(0)):
        np.testing.assert_array_equal(app.received[-1][name], kept[name].numpy())


def test_a_round_the_server_lost_is_trained_again_from_the_state_before_it(tmp_path):
    """The server checkpointed round 2, then crashed in round 3 after this client had trained it."""
    app, first = FakeApp(), new_run_context(tmp_path)
    train_round(first, app, 1)
    train_round(first, app, 2)
    after_two = first.state[LOCAL_KEY]
    train_round(first, app, 3)  # lost with the server
    resumed = new_run_context(tmp_path)
    train_round(resumed, app, 3)  # round 3 again: from the state after round 2
    for name in batch_norm_names(tiny_model(3)):
        np.testing.assert_array_equal(app.received[-1][name], after_two[name].numpy())
    # An evaluation of round 3 in a fresh context may use the state saved after round 3.
    evaluating = new_run_context(tmp_path)
    persistent_state_mod(
        message(tiny_model(4), {"lips-run-key": KEY, "lips-round": 3}, MessageType.EVALUATE),
        evaluating, app)
    assert evaluating.state[SIGNAL_ROUND_KEY]["round"] == 3
    # Round 4 after the re-trained round 3: the files hold rounds 4 and 3.
    train_round(resumed, app, 4)
    assert sorted(read_groups(p, "state")[1]["round"] for p in tmp_path.iterdir()) == [3, 4]


def test_a_file_another_writer_put_in_place_is_read_again_before_a_save(tmp_path, monkeypatch):
    """A save remembers the file it wrote (its round); a file put there since is read instead."""
    read = []
    monkeypatch.setattr(persist, "read_meta", lambda path, what: read.append(path) or read_meta(path, what))
    app, ctx = FakeApp(), new_run_context(tmp_path)
    name = tmp_path / f"lips-client-{KEY}-0.npz"
    previous = name.with_name(name.name.replace(".npz", ".prev.npz"))
    train_round(ctx, app, 1)
    train_round(ctx, app, 2)  # its own file of round 1 becomes the previous one, not read again
    assert read == [] and read_groups(previous, "state")[1]["round"] == 1
    other = tmp_path / "other"
    train_round(new_run_context(other), app, 7)
    os.replace(other / name.name, name)  # another process's file, of a later round
    train_round(ctx, app, 3)
    assert read == [name]  # read: not the file this process wrote there
    # The round-7 file was replaced (a resumed run trains again), not kept as the previous round's.
    assert read_groups(previous, "state")[1]["round"] == 1
    assert read_groups(name, "state")[1]["round"] == 3
    train_round(ctx, app, 4)  # the file this process wrote: round 3, kept as the previous one
    assert read_groups(previous, "state")[1]["round"] == 3 and len(read) == 1


def test_a_first_save_removes_the_temporaries_that_killed_writers_left(tmp_path):
    """A writer killed mid-write (SIGKILL, or at exit in a thread) leaves ``.<name>.<pid>.<random>``."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / f".{NAME}.{gone}.abc123"
    live = tmp_path / f".{NAME}.{os.getppid()}.def456"  # a running process's: mid-write, kept
    for path in (stale, live):
        path.write_bytes(b"half a file")
    train_round(new_run_context(tmp_path), FakeApp(), 1)
    assert not stale.exists() and live.exists() and (tmp_path / NAME).exists()
