"""A misbehaving ClientApp on the batched Grid: its own error reply or left out, never the run's end or a hang."""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import watchdog
from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched import BatchedGrid, run_batched
from lips_flwr.experiments.task.training import computing_with, local_compute

ENGINES = ["sequential", "stacked"]
CLIENT_APP_RAISED_EXCEPTION, CLIENT_APP_CRASHED = 2, 8  # flwr.common.constant.ErrorCode


@pytest.fixture(autouse=True)
def abandoned_calls_end():
    """Wait, after each test, for the client calls it abandoned (released at its end) to end.

    They draw from the process-wide generators (``gathered_train``) when they
    resume: left running, they would change the numbers of whichever test runs next.
    """
    before = set(threading.enumerate())
    yield
    end = time.monotonic() + 30
    while any(t.is_alive() for t in set(threading.enumerate()) - before) and time.monotonic() < end:
        time.sleep(0.01)


def finishes(fn, seconds: float = 60.0) -> dict:
    """``fn()``'s result or exception, run in a thread that must end within ``seconds`` (no hang)."""
    return watchdog.finishes(fn, seconds, hung="the run hung")


def gathered_train() -> None:
    """A tiny training call, gathered with the other clients' on the stacked engine."""
    torch.manual_seed(0)
    local_compute().train(torch.nn.Linear(2, 2), torch.zeros(4, 2), torch.zeros(4, dtype=torch.long),
                          epochs=1, batch_size=2, seed=0)


def reply(msg: Message, pid: int) -> Message:
    arrays = msg.content["arrays"] if "arrays" in msg.content else ArrayRecord()
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"pid": pid, "num-examples": 1})}),
                   reply_to=msg)


def misbehaving_app() -> ClientApp:
    """Node 0 answers; 1 returns None, 2 a dict, 3 calls sys.exit(3), 4 sys.exit(), 5 its instruction, 6 raises."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        gathered_train()
        outcomes = {1: lambda: None, 2: lambda: {"arrays": msg.content["arrays"]}, 3: lambda: sys.exit(3),
                    4: lambda: sys.exit(), 5: lambda: msg, 6: lambda: 1 / 0}
        return outcomes.get(pid, lambda: reply(msg, pid))()

    return app


def content() -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2, np.float32))}), "config": ConfigRecord({})})


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_app_that_returns_no_reply_or_exits_gets_its_own_error_reply(engine):
    grid = BatchedGrid(misbehaving_app(), num_nodes=7, run_config={}, engine=engine)
    out = finishes(lambda: list(grid.send_and_receive([Message(content(), n, "train") for n in range(1000, 1007)])))
    assert "error" not in out, out.get("error")
    replies = {r.metadata.src_node_id: r for r in out["result"]}
    assert sorted(replies) == list(range(1000, 1007))
    assert not replies[1000].has_error() and replies[1000].content["metrics"]["pid"] == 0
    expected = {1001: (CLIENT_APP_CRASHED, ["ClientApp stopped responding.", "returned <class 'NoneType'>"]),
                1002: (CLIENT_APP_CRASHED, ["ClientApp stopped responding.", "returned <class 'dict'>"]),
                1003: (CLIENT_APP_CRASHED, ["ClientApp stopped responding.", "<class 'SystemExit'>:<'3'>"]),
                1004: (CLIENT_APP_CRASHED, ["ClientApp stopped responding.", "<class 'SystemExit'>"]),
                1005: (CLIENT_APP_CRASHED, ["ClientApp stopped responding.", "not a reply to its message"]),
                1006: (CLIENT_APP_RAISED_EXCEPTION, ["<class 'ZeroDivisionError'>:<'division by zero'>"])}
    for node, (code, words) in expected.items():
        error_reply = replies[node]
        assert error_reply.has_error() and error_reply.error.code == code, node
        assert all(word in error_reply.error.reason for word in words), (node, error_reply.error.reason)
        assert error_reply.metadata.reply_to_message_id and error_reply.metadata.dst_node_id == 1
    assert "returned <class 'NoneType'>" in grid.first_error  # the first, in node order


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_with_misbehaving_clients_goes_on_with_the_others(engine):
    rounds: list = []

    def record(server_round, arrays):
        rounds.append(server_round)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=7, min_train_nodes=2)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.ones(2, np.float32))}),
                                num_rounds=2, timeout=30, evaluate_fn=record)
        rounds.append(result.arrays["w"].numpy().tolist())

    out = finishes(lambda: run_batched(server, misbehaving_app(), run_config={}, num_nodes=7, engine=engine))
    assert "error" not in out, out.get("error")
    assert rounds == [0, 1, 2, [1.0, 1.0]] and out["result"].first_error


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_keyboard_interrupt_in_a_client_app_still_stops_the_run(engine):
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        raise KeyboardInterrupt

    grid = BatchedGrid(app, num_nodes=2, run_config={}, engine=engine)
    for timeout in (None, 30):
        out = finishes(lambda: grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001)],
                                                     timeout=timeout))  # noqa: B023
        assert isinstance(out.get("error"), KeyboardInterrupt)


def hanging_app(release: threading.Event, calls: list, hang: set[int], sleep: float = 0.0) -> ClientApp:
    """Nodes in ``hang`` wait for ``release`` (forever, as far as the run knows); the others answer."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        calls.append(pid)
        time.sleep(sleep)
        if pid in hang:
            release.wait(timeout=120)  # (a test that goes wrong fails after 2 minutes, not never)
        gathered_train()
        return reply(msg, pid)

    return app


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_that_never_answers_is_left_out_and_the_run_goes_on(engine, caplog):
    release, calls, seen = threading.Event(), [], []

    class Watch:
        def pushed(self, messages):
            pass

        def replied(self, replies):
            seen.append(sorted(r.metadata.src_node_id for r in replies))

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=3, min_train_nodes=2)
        strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.ones(2, np.float32))}),
                       num_rounds=2, timeout=1.0)

    try:
        with caplog.at_level(logging.WARNING):
            out = finishes(lambda: run_batched(server, hanging_app(release, calls, {1}), run_config={},
                                               num_nodes=3, engine=engine, observer=Watch()))
        assert "error" not in out, out.get("error")
        assert seen == [[1000, 1002], [1000, 1002]]
        assert sorted(calls) == [0, 0, 1, 2, 2]  # node 1001 is not called while its first call runs
        late = [r.getMessage() for r in caplog.records if "1001" in r.getMessage()]
        assert len(late) == 2 and "did not reply within 1" in late[0] and "still running" in late[1], late
        grid = out["result"]
    finally:
        release.set()
    # Once its call ends (its reply discarded), the node answers again, and only to the new message.
    _wait_until(lambda: not grid.busy_nodes())
    messages = [Message(content(), n, "train") for n in (1000, 1001, 1002)]
    replies = list(grid.send_and_receive(messages, timeout=30))
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(m.metadata.message_id for m in messages)
    assert not any(r.has_error() for r in replies)


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_every_call_has_its_own_timeout_from_its_start(engine):
    release, calls = threading.Event(), []
    grid = BatchedGrid(hanging_app(release, calls, set(), sleep=0.4), num_nodes=3, run_config={}, engine=engine)
    start = time.perf_counter()
    replies = list(grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001, 1002)],
                                         timeout=1.0))
    assert len(replies) == 3 and time.perf_counter() - start >= 1.2  # longer than 1 s, all in time


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_push_and_pull_still_serve_a_server_app_that_uses_them_directly(engine):
    release, calls = threading.Event(), []
    grid = BatchedGrid(hanging_app(release, calls, {2}), num_nodes=3, run_config={}, engine=engine)

    def rounds():
        first = list(grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001, 1002)],
                                           timeout=0.5))
        ids = list(grid.push_messages([Message(content(), n, "train") for n in (1000, 1001, 1002)]))
        return first, ids, list(grid.pull_messages(ids)), list(grid.pull_messages(ids))

    try:
        out = finishes(rounds)
    finally:
        release.set()
    assert "error" not in out, out.get("error")
    first, ids, pulled, again = out["result"]
    assert sorted(r.metadata.src_node_id for r in first) == [1000, 1001]
    # 1002 still runs its first call: left out; the others' replies are pulled once
    assert sorted(r.metadata.reply_to_message_id for r in pulled) == sorted(ids[:2]) and again == []


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_ctrl_c_stops_a_run_whose_client_hangs(engine, timeout):
    before = set(threading.enumerate())
    release, calls = threading.Event(), []
    grid = BatchedGrid(hanging_app(release, calls, {1}), num_nodes=3, run_config={}, engine=engine)
    # A shell starts a background job with SIGINT ignored, and Python then keeps it ignored: the
    # Ctrl-C below would never arrive (CI run as `.ci/run &` hung here). Python's own handler, as
    # in an interactive run, for this test only.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001, 1002)], timeout=timeout)
    finally:
        timer.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)
    # No client is left waiting for gathered calls that will never run (the stacked engine).
    _wait_until(lambda: not any(t.is_alive() for t in set(threading.enumerate()) - before), seconds=10)


def _wait_until(condition, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.01)



@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_a_call_with_a_deadline_computes_with_the_callers_engine(timeout):
    # A call with a deadline runs in another thread (CallsInTurn), which starts with an empty
    # context: the engine of the caller's computing_with was lost there (the benchmarks' timed
    # engine timed nothing: "client compute 0.000").
    engine, seen = object(), []  # a stand-in engine: only its identity is looked at
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(local_compute() is engine)
        return reply(msg, int(context.node_config["partition-id"]))

    grid = BatchedGrid(app, num_nodes=2, run_config={}, engine="sequential")
    with computing_with(engine):
        replies = list(grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001)],
                                             timeout=timeout))
    assert len(replies) == 2 and not any(r.has_error() for r in replies)
    assert seen == [True, True]


_CALLERS = contextvars.ContextVar("callers")


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
def test_client_calls_see_the_callers_context_variables_on_both_engines(engine):
    seen = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(_CALLERS.get(None))
        return reply(msg, int(context.node_config["partition-id"]))

    grid = BatchedGrid(app, num_nodes=3, run_config={}, engine=engine)
    token = _CALLERS.set("the caller's")
    try:
        replies = list(grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001, 1002)],
                                             timeout=30.0))
    finally:
        _CALLERS.reset(token)
    assert len(replies) == 3 and seen == ["the caller's"] * 3


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_what_a_client_sets_in_its_context_stays_in_its_call(engine, timeout):
    # As under Flower, where each ClientApp call runs in a process of its own.
    seen = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(_CALLERS.get(None))
        _CALLERS.set(f"node {context.node_config['partition-id']}'s")
        return reply(msg, int(context.node_config["partition-id"]))

    grid = BatchedGrid(app, num_nodes=3, run_config={}, engine=engine)
    replies = list(grid.send_and_receive([Message(content(), n, "train") for n in (1000, 1001, 1002)],
                                         timeout=timeout))
    assert len(replies) == 3 and seen == [None] * 3 and _CALLERS.get(None) is None
