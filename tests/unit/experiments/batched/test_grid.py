"""The batched Grid: the real ClientApp per node, real reply Messages, the ServerApp unchanged."""

from __future__ import annotations

import copy
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched import chunks as chunks_module
from lips_flwr.experiments.batched import BatchedGrid, run_batched
from lips_flwr.experiments.batched.rendezvous import Rendezvous
from lips_flwr.experiments.task.training import SEQUENTIAL, computing_with, local_compute
from watchdog import finishes

PAPER = Path(__file__).resolve().parents[4] / "examples" / "paper"
sys.path.insert(0, str(PAPER))

from lips_paper.client_app import app as paper_client  # noqa: E402
from lips_paper.server_app import app as paper_server  # noqa: E402

def run_config(values: dict) -> dict:
    """The paper app's run config for ``values``, as ``flwr run`` resolves it."""
    from lips_flwr.experiments.runner.apps import load_app, resolve_run_config

    return resolve_run_config(load_app(PAPER), values)


TINY = {"algorithm": "lips", "dataset": "digits", "model": "digits-cnn", "num-server-rounds": 3, "every": 2,
        "tau0": 0.5, "samples-per-client": 40, "test-samples": 40, "alpha": 0.5, "local-epochs": 1,
        "batch-size": 20, "lr": 0.05, "device": "cpu"}


def echo_app(calls: list | None = None) -> ClientApp:
    """A ClientApp that replies with its arrays plus its partition id, and raises for partition 2."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        if calls is not None:
            calls.append(pid)
        if pid == 2:
            raise RuntimeError("partition 2 has no data")
        arrays = msg.content["arrays"]
        arrays["w"] = Array(arrays["w"].numpy() + pid)  # edits its own copy in place
        context.state["seen"] = MetricRecord({"rounds": int(context.state["seen"]["rounds"]) + 1}
                                             if "seen" in context.state else {"rounds": 1})
        metrics = MetricRecord({"pid": pid, "rounds": int(context.state["seen"]["rounds"]), "num-examples": 1})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


@pytest.mark.usefixtures("task_identity")
def test_every_node_gets_its_own_copy_and_context_and_a_raising_client_an_error_reply():
    grid = BatchedGrid(echo_app(), num_nodes=3, run_config={"k": 1}, engine="sequential")
    nodes = sorted(grid.get_node_ids())
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2, np.float32))}), "config": ConfigRecord({})})
    for _ in range(2):
        replies = list(grid.send_and_receive([Message(content, n, "train") for n in nodes]))
        assert len(replies) == 3
        by_node = {r.metadata.src_node_id: r for r in replies}
        assert set(by_node) == set(nodes)
        assert by_node[nodes[2]].has_error() and "partition 2 has no data" in by_node[nodes[2]].error.reason
        for pid in (0, 1):
            reply = by_node[nodes[pid]]
            assert reply.metadata.reply_to_message_id and reply.metadata.dst_node_id == 1
            np.testing.assert_array_equal(reply.content["arrays"]["w"].numpy(), [pid, pid])
        np.testing.assert_array_equal(content["arrays"]["w"].numpy(), [0, 0])  # the sent content is intact
    assert [by_node[nodes[p]].content["metrics"]["rounds"] for p in (0, 1)] == [2, 2]  # contexts kept
    assert "partition 2 has no data" in grid.first_error


def _record_stacks(monkeypatch) -> list[list[int]]:
    """Stacked chunks replaced by a record of their calls' seeds, in stack order (each call's result 0.0)."""
    stacks: list[list[int]] = []

    def fake_together(chunk, autocast=None):
        stacks.append([int(call.kwargs["seed"]) for call in chunk])
        for call in chunk:
            call.result = 0.0

    monkeypatch.setattr(chunks_module, "run_together", fake_together)
    return stacks


@pytest.mark.usefixtures("task_identity")
def test_a_rounds_clients_run_in_node_order_whatever_order_the_strategy_sent_them_in(monkeypatch):
    # Flower's FedAvg samples its nodes in a random order; the stacked engine's numbers
    # depend on the clients' order in a stack, so the grid runs them by node.
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(2, np.float32))}), "config": ConfigRecord({})})
    calls: list[int] = []
    grid = BatchedGrid(echo_app(calls), num_nodes=5, run_config={}, engine="sequential")
    nodes = sorted(grid.get_node_ids())
    shuffled = [nodes[i] for i in (3, 0, 4, 1)]
    replies = list(grid.send_and_receive([Message(content, n, "train") for n in shuffled]))
    assert sorted(r.metadata.src_node_id for r in replies) == sorted(shuffled)
    assert calls == [0, 1, 3, 4]

    stacks = _record_stacks(monkeypatch)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        time.sleep(0.02 * (5 - pid))  # the first nodes' threads arrive last
        loss = local_compute().train(torch.nn.Linear(1, 1), torch.zeros(2, 1), torch.zeros(2), seed=pid)
        return Message(RecordDict({"metrics": MetricRecord({"loss": loss})}), reply_to=msg)

    grid = BatchedGrid(app, num_nodes=5, run_config={}, engine="stacked")
    replies = list(grid.send_and_receive([Message(content, n, "train") for n in shuffled]))
    assert len(replies) == 4 and not any(r.has_error() for r in replies)
    assert stacks == [[0, 1, 3, 4]]


def test_bad_arguments_name_the_problem():
    for kwargs, word in (({"num_nodes": 0}, "num_nodes"), ({"num_nodes": 2, "engine": "gpu"}, "engine"),
                         ({"num_nodes": 2, "chunk_size": 0}, "chunk_size")):
        with pytest.raises(ValueError, match=word):
            BatchedGrid(echo_app(), run_config={}, **kwargs)


def test_rendezvous_gathers_every_call_of_a_phase_and_halves_a_chunk_on_out_of_memory(monkeypatch):
    gathered: list[int] = []

    def fake_together(chunk, autocast=None):
        if len(chunk) > 2:
            raise torch.cuda.OutOfMemoryError("too many")
        gathered.append(len(chunk))
        for call in chunk:
            call.result = float(call.kwargs["seed"]) if call.kind == "train" else (0.0, float(call.x.sum()))

    monkeypatch.setattr(chunks_module, "run_together", fake_together)
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)

    def client(i):
        def run():
            assert local_compute() is rendezvous
            loss = local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
            return loss, local_compute().evaluate(net, torch.full((2, 1), float(i)), torch.zeros(2))[1]
        return lambda: _with(rendezvous, run)

    results = rendezvous.run([client(i) for i in range(5)])
    assert results == [(float(i), 2.0 * i) for i in range(5)]
    assert rendezvous.chunk_size == 2 and gathered == [2, 2, 1, 2, 2, 1]  # train phase, then evaluate
    assert local_compute() is SEQUENTIAL and threading.active_count() >= 1


def _with(engine, fn):
    with computing_with(engine):
        return fn()


def test_gathered_calls_run_in_the_clients_order_whatever_order_their_threads_arrive_in(monkeypatch):
    # The template net, the global RNG's seed and each client's dropout draws follow the order
    # of a stacked chunk: the order threads happen to arrive in made dropout runs differ.
    chunks = _record_stacks(monkeypatch)
    net = torch.nn.Linear(1, 1)

    def client(rendezvous, i, n):
        def run():
            time.sleep(0.02 * (n - i))  # the last client arrives first
            return local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
        return lambda: _with(rendezvous, run)

    rendezvous = Rendezvous(chunk_size=2)
    assert rendezvous.run([client(rendezvous, i, 5) for i in range(5)]) == [0.0] * 5
    assert chunks == [[0, 1], [2, 3], [4]]


def test_a_call_run_alone_draws_its_dropout_from_its_own_seed_whichever_thread_seeded_last():
    # A chunk of one (5 clients in chunks of 2, an out-of-memory remainder, the fallback) trains
    # on the leader thread: before, it drew from whatever the last client thread had seeded.
    from lips_flwr.experiments.task.models import FashionCNN
    from lips_flwr.experiments.task.training import add_dropout, train_tensors

    torch.manual_seed(0)
    start = FashionCNN()
    data = [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))) for _ in range(3)]
    kwargs = {"epochs": 1, "lr": 0.1, "momentum": 0.9, "batch_size": 4}

    def trained(net_seed_order):
        rendezvous = Rendezvous(chunk_size=2)
        nets = [copy.deepcopy(start) for _ in range(3)]
        for net in nets:
            add_dropout(net, ["conv2.0.weight"], p=0.5)

        def client(i):
            def run():
                time.sleep(0.03 * net_seed_order.index(i))  # the threads seed in this order
                torch.manual_seed(100 + i)  # as the ClientApp does, on the process-wide generator
                return local_compute().train(nets[i], *data[i], seed=100 + i, **kwargs)
            return lambda: _with(rendezvous, run)

        rendezvous.run([client(i) for i in range(3)])
        return nets[2]

    alone = [trained(order) for order in ([0, 1, 2], [2, 1, 0])]
    sequential = copy.deepcopy(start)
    add_dropout(sequential, ["conv2.0.weight"], p=0.5)
    torch.manual_seed(102)
    train_tensors(sequential, *data[2], seed=102, **kwargs)
    for net in alone:  # the same as the sequential engine: the client seeds, then trains
        assert all(torch.equal(v, sequential.state_dict()[k]) for k, v in net.state_dict().items())


def test_client_threads_take_turns_running_their_python(monkeypatch):
    # A hundred runnable threads fought over the GIL (and every arrival woke every waiting
    # thread): a call's overhead on the stacked engine was ~50 ms against ~6 ms with turns.
    monkeypatch.setattr(chunks_module, "run_together",
                        lambda chunk, autocast=None: [setattr(c, "result", 0.0) for c in chunk])
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)
    lock, active, most = threading.Lock(), [0], [0]

    def busy():
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.005)  # releases the GIL: without turns another client runs meanwhile
        with lock:
            active[0] -= 1

    def client(i):
        def run():
            busy()
            local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
            busy()
            local_compute().evaluate(net, torch.zeros(2, 1), torch.zeros(2))
            busy()
            return i
        return lambda: _with(rendezvous, run)

    assert rendezvous.run([client(i) for i in range(20)]) == list(range(20))
    assert most == [1]


def test_the_turn_goes_to_the_clients_in_their_order_in_every_phase(monkeypatch):
    # The turn is handed on from client to client (each thread waits at its own gate): in the
    # clients' order, whichever thread the OS would have woken first.
    monkeypatch.setattr(chunks_module, "run_together", lambda chunk, autocast=None: [
        setattr(c, "result", 0.0 if c.kind == "train" else (0.0, 0.0)) for c in chunk])
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)
    order: list[tuple[str, int]] = []

    def client(i):
        def run():
            order.append(("start", i))
            local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
            order.append(("trained", i))
            local_compute().evaluate(net, torch.zeros(2, 1), torch.zeros(2))
            order.append(("evaluated", i))
            return i
        return lambda: _with(rendezvous, run)

    assert rendezvous.run([client(i) for i in range(6)]) == list(range(6))
    assert order == [(phase, i) for phase in ("start", "trained", "evaluated") for i in range(6)]


def test_a_turn_that_runs_out_before_the_one_the_leader_times_is_timed_on_its_own(monkeypatch):
    # The leader sleeps until the holder's time runs out and is not woken at every hand-over;
    # a client whose own time left is shorter than that wakes it (client 1 used 1.6 of its 2 s).
    _record_stacks(monkeypatch)
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)
    release = threading.Event()

    def client(i):
        def run():
            if i == 1:
                time.sleep(1.6)  # holding the turn: its time
            local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
            marks.append(time.monotonic())
            if i == 1:
                release.wait(timeout=60)  # hangs until the test ends
            return i
        return lambda: _with(rendezvous, run)

    marks: list[float] = []
    try:
        out = _finishes(lambda: (rendezvous.run([client(i) for i in range(2)], timeout=2.0), time.monotonic()))
    finally:
        release.set()
    results, end = out["result"]
    assert results == [0, None] and list(rendezvous.abandoned) == [1]
    assert end - marks[0] < 1.2  # client 1 is out ~0.4 s after its turn began, not 2 s after client 0's


def _finishes(fn, seconds: float = 30.0):
    """``fn()``'s result or exception, run in a thread that must end within ``seconds`` (no hang)."""
    return finishes(fn, seconds, hung="the Rendezvous hung")


def test_a_call_from_a_thread_the_client_started_is_an_error_not_a_hang(monkeypatch):
    import asyncio

    monkeypatch.setattr(chunks_module, "run_together",
                        lambda chunk, autocast=None: [setattr(c, "result", 1.0) for c in chunk])
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)

    def client(i):
        def run():
            call = lambda: local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)  # noqa: E731
            try:
                return asyncio.run(asyncio.to_thread(call))  # carries the context into its thread
            except RuntimeError as err:
                return str(err)
        return lambda: _with(rendezvous, run)

    out = _finishes(lambda: rendezvous.run([client(i) for i in range(3)]))
    assert all("from a thread the Rendezvous did not start" in r for r in out["result"])


@pytest.mark.parametrize("failure", [KeyboardInterrupt, SystemExit])  # (an Exception: run one by one)
def test_when_running_the_gathered_calls_fails_no_client_is_left_waiting(monkeypatch, failure):
    def fail(chunk, autocast=None):
        raise failure()

    monkeypatch.setattr(chunks_module, "run_together", fail)
    rendezvous = Rendezvous()
    net = torch.nn.Linear(1, 1)
    seen: list[str] = []

    def client(i):
        def run():
            try:
                return local_compute().train(net, torch.zeros(2, 1), torch.zeros(2), seed=i)
            except RuntimeError as err:  # the client sees the failure as an error of its call
                seen.append(str(err))
                return local_compute().evaluate(net, torch.zeros(2, 1), torch.zeros(2))  # a later call too
        return lambda: _with(rendezvous, run)

    before = threading.active_count()
    out = _finishes(lambda: rendezvous.run([client(i) for i in range(4)]))
    assert isinstance(out.get("error"), failure)  # the leader raises it, once every client is done
    assert len(seen) == 4 and all("the gathered calls failed" in m for m in seen)
    assert threading.active_count() == before


def test_a_failing_stacked_chunk_falls_back_to_one_by_one_so_an_error_stays_its_clients(monkeypatch):
    monkeypatch.setattr(chunks_module, "run_together", lambda chunk, autocast=None: 1 / 0)
    rendezvous = Rendezvous()
    nets = [torch.nn.Linear(1, 2) for _ in range(3)]
    xs = [torch.zeros(4, 1), torch.zeros(4, 1), torch.zeros(4, 1)]
    ys = [torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.full((4,), 7)]  # 7: bad

    def client(i):
        def run():
            try:
                return local_compute().train(nets[i], xs[i], ys[i], epochs=1, seed=i)
            except Exception as err:  # noqa: BLE001
                return type(err).__name__
        return lambda: _with(rendezvous, run)

    out = rendezvous.run([client(i) for i in range(3)])
    assert isinstance(out[0], float) and isinstance(out[1], float) and out[2] == "IndexError"


def test_the_paper_app_runs_unchanged_on_the_grid(tmp_path):
    results = tmp_path / "lips.json"
    grid = run_batched(paper_server, paper_client, num_nodes=3, engine="sequential",
                       run_config=run_config({**TINY, "results-path": str(results)}))
    assert grid.first_error is None and grid.client_seconds > 0
    rounds = json.loads(results.read_text())["rounds"]
    # Round 3 is the final round: no mask after the last aggregation (was [1, 0, 1]: issue 35).
    assert [rounds[r]["train"]["lips-mask-round"] for r in ("1", "2", "3")] == [1, 0, 0]
    assert all(rounds[r]["train"]["num-examples"] == 3 * 40 for r in rounds)
    assert all(0 <= rounds[r]["evaluate"]["acc-after"] <= 1 for r in rounds)


def test_run_config_rejects_a_key_the_app_does_not_know():
    with pytest.raises(ValueError, match="unknown run-config keys \\['tua0'\\]"):
        run_config({"tua0": 0.5})


def round_one_messages(grid, cfg):
    """Round 1's train messages as the paper's ServerApp sends them (LIPS around FedAvg)."""
    from flwr.serverapp.strategy import FedAvg

    from lips_flwr.experiments.task.data import DATASET_INFO
    from lips_flwr.experiments.task.models import build_model
    from lips_flwr.strategies import LIPS

    torch.manual_seed(int(cfg["seed"]))
    net = build_model(cfg["model"], *DATASET_INFO[cfg["dataset"]])
    strategy = LIPS(FedAvg(), num_rounds=int(cfg["num-server-rounds"]), tau0=0.5, every=2)
    return strategy.configure_train(1, ArrayRecord(net.state_dict()), ConfigRecord({}), grid)


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_round_one_replies_equal_the_client_apps_own(engine):
    """The same experiment: each node's reply equals the ClientApp's reply to the same message (1e-5)."""
    cfg = run_config(TINY)
    grid = BatchedGrid(paper_client, num_nodes=3, run_config=cfg, engine=engine)
    messages = list(round_one_messages(grid, cfg))
    assert len(messages) == 3
    replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(messages)}
    for msg in messages:
        node = msg.metadata.dst_node_id
        context = Context(run_id=1, node_id=node, node_config=dict(grid.contexts[node].node_config),
                          state=RecordDict(), run_config=dict(cfg))
        own = paper_client(Message(msg.content, node, msg.metadata.message_type), context)
        ours = replies[node]
        assert not ours.has_error() and not own.has_error()
        for name, array in own.content["arrays"].items():
            diff = np.max(np.abs(array.numpy() - ours.content["arrays"][name].numpy()), initial=0.0)
            assert diff <= (0.0 if engine == "sequential" else 1e-5), (name, diff)
        for key, value in own.content["metrics"].items():
            assert ours.content["metrics"][key] == pytest.approx(value, abs=1e-5), key
    if engine == "stacked":  # trained and evaluated together, not one by one after a failure
        assert (grid.stacked_calls, grid.one_by_one_calls) == (6, 0)
