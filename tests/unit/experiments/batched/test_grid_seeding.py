"""The batched Grid's ``seed`` and ``observer``: reproducible clients that never seed, a watcher told."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched import BatchedGrid, run_batched
from lips_flwr.experiments.seeding import (
    derive_seed,
    globals_kept,
    restore_globals,
    saved_globals,
    seed_globals,
)
from lips_flwr.experiments.task.training import local_compute

NODES = 3


def draws(count: int = 2) -> list[float]:
    """``count`` numbers from each process-wide generator: Python's, numpy's, torch's."""
    out: list[float] = []
    for _ in range(count):
        out += [random.random(), float(np.random.rand()), float(torch.rand(1))]
    return out


def drawing_client(before: int = 2, train_call: bool = False) -> ClientApp:
    """A ClientApp that never seeds: it draws ``before`` (and, around a local_compute call, after)."""
    app = ClientApp()

    def answer(msg: Message, context: Context) -> Message:
        first = draws(before)
        after: list[float] = []
        if train_call:
            torch.manual_seed(0)  # the same start for every client: only the generators differ
            net = torch.nn.Linear(4, 3)
            x = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
            local_compute().train(net, x, torch.arange(6) % 3, epochs=1, batch_size=3,
                                  seed=int(context.node_config["partition-id"]))
            after = draws(2)
        return Message(RecordDict({"metrics": MetricRecord({"before": first, "after": after})}), reply_to=msg)

    app.train()(answer)
    app.evaluate()(answer)
    app.query()(answer)
    app.train("custom")(answer)
    return app


def drawing_server(log: list, rounds: int = 2, evaluations: int = 1) -> ServerApp:
    """A ServerApp that draws, then sends every node a train message per round (and config-less evaluates)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = sorted(grid.get_node_ids())
        for rnd in range(1, rounds + 1):
            log.append(("server", draws()))
            content = RecordDict({"config": ConfigRecord({"server-round": rnd})})
            replies = grid.send_and_receive([Message(content, n, "train") for n in nodes])
            log.append(("train", _by_node(replies)))
        for _ in range(evaluations):
            replies = grid.send_and_receive([Message(RecordDict(), n, "evaluate") for n in nodes])
            log.append(("evaluate", _by_node(replies)))
        log.append(("server", draws()))

    return app


def _by_node(replies) -> dict[int, tuple]:
    out = {}
    for reply in replies:
        assert not reply.has_error(), reply.error.reason
        metrics = reply.content["metrics"]
        out[reply.metadata.src_node_id] = (tuple(metrics["before"]), tuple(metrics["after"]))
    return out


def run(seed: int | None, engine: str = "sequential", client: ClientApp | None = None, **kwargs) -> list:
    log: list = []
    run_batched(drawing_server(log, **kwargs), client or drawing_client(), run_config={}, num_nodes=NODES,
                engine=engine, seed=seed)
    return log


def client_part(log: list) -> list:
    return [entry for entry in log if entry[0] != "server"]


def server_part(log: list) -> list:
    return [entry for entry in log if entry[0] == "server"]


def test_a_client_app_that_never_seeds_draws_the_same_numbers_with_the_same_seed_and_others_with_another():
    first = run(7)
    seed_globals(12345)  # whatever the process drew before does not matter
    draws(5)
    again, other = run(7), run(8)
    assert again == first
    assert client_part(other) != client_part(first) and server_part(other) != server_part(first)
    # every node, round and kind of call has its own numbers
    calls = [pair for _, by_node in client_part(first) for pair in by_node.values()]
    assert len({before for before, _ in calls}) == len(calls) == NODES * 3


@pytest.mark.usefixtures("task_identity")
def test_each_call_is_seeded_from_the_seed_the_node_the_round_and_the_kind():
    log = run(7, rounds=2, evaluations=2)
    trains, evaluations = [e[1] for e in log if e[0] == "train"], [e[1] for e in log if e[0] == "evaluate"]
    for pid in range(NODES):
        node = 1000 + pid
        for rnd, by_node in enumerate(trains, start=1):  # the message's config["server-round"]
            assert by_node[node][0][0] == random.Random(derive_seed(7, 1 + pid, rnd, 1)).random()
        for count, by_node in enumerate(evaluations, start=1):  # no server-round: the node's count
            assert by_node[node][0][0] == random.Random(derive_seed(7, 1 + pid, count, 2)).random()
    grid = BatchedGrid(drawing_client(before=1), num_nodes=1, run_config={}, engine="sequential", seed=7)
    # (message type, kind, this node's calls of that kind so far): "train.custom" is a train
    for message_type, kind, count in (("query", 3, 1), ("train.custom", 1, 1), ("query", 3, 2),
                                      ("train", 1, 2)):
        (reply,) = grid.send_and_receive([Message(RecordDict(), 1000, message_type)])
        expected = random.Random(derive_seed(7, 1, count, kind)).random()
        assert reply.content["metrics"]["before"][0] == expected, message_type


@pytest.mark.usefixtures("task_identity")
def test_a_legacy_message_is_seeded_by_its_round_so_a_resumed_run_draws_what_an_uninterrupted_one_does():
    """The legacy API carries its round only as the group id (``str(server_round)``): a run resumed at
    round 3 makes its node's first call there, which a per-node call count would seed as round 1."""

    def legacy(rnd: int) -> Message:
        content = RecordDict({"fitins.config": ConfigRecord({"lr": 0.1})})  # no server-round: legacy FedAvg
        return Message(content, 1000, "train", group_id=str(rnd))

    uninterrupted = BatchedGrid(drawing_client(before=1), num_nodes=1, run_config={}, engine="sequential",
                                seed=7)
    for rnd in (1, 2):
        uninterrupted.send_and_receive([legacy(rnd)])
    (going_on,) = uninterrupted.send_and_receive([legacy(3)])
    resumed = BatchedGrid(drawing_client(before=1), num_nodes=1, run_config={}, engine="sequential", seed=7)
    (first_call,) = resumed.send_and_receive([legacy(3)])
    expected = random.Random(derive_seed(7, 1, 3, 1)).random()
    assert first_call.content["metrics"]["before"][0] == going_on.content["metrics"]["before"][0] == expected


def test_the_server_apps_draws_do_not_depend_on_what_the_clients_drew():
    quiet, busy = run(7, client=drawing_client(before=0)), run(7, client=drawing_client(before=5))
    assert server_part(quiet) == server_part(busy)
    seed_globals(derive_seed(7, 0))  # as if there were no clients at all
    assert [numbers for _, numbers in server_part(busy)] == [draws(), draws(), draws()]


@pytest.mark.parametrize("client", ["train-call", "plain"])
def test_the_stacked_engine_gives_every_client_the_sequential_engines_numbers(client):
    make = (lambda: drawing_client(train_call=True)) if client == "train-call" else drawing_client
    sequential = run(7, engine="sequential", client=make())
    stacked = run(7, engine="stacked", client=make())
    assert stacked == sequential  # the draws after a gathered call too, and the ServerApp's
    assert stacked != run(8, engine="stacked", client=make())


def test_without_a_seed_the_generators_are_left_alone():
    # The behaviour before ``seed``: the clients draw on from the process's own streams.
    seed_globals(99)
    log = run(None, rounds=1, evaluations=0)
    seed_globals(99)
    server = draws()
    clients = {1000 + pid: draws(2) for pid in range(NODES)}
    assert log[0] == ("server", server)
    assert {node: list(before) for node, (before, _) in log[1][1].items()} == clients


class Recorder:
    """A GridObserver that writes down what it is told, in the log the clients and ServerApp share."""

    def __init__(self, log: list) -> None:
        self.log = log

    def pushed(self, messages) -> None:
        assert all(m.metadata.message_id and m.metadata.src_node_id == 1 for m in messages)
        self.log.append(("pushed", [(m.metadata.message_id, m.metadata.dst_node_id) for m in messages]))

    def replied(self, replies) -> None:
        self.log.append(("replied", [(r.metadata.reply_to_message_id, r.metadata.src_node_id, r.has_error())
                                     for r in replies]))


@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_the_observer_is_told_of_pushes_before_the_clients_run_and_of_replies_before_the_strategy(engine):
    log: list = []
    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        log.append(("client", pid))
        if pid == 1:
            raise RuntimeError("no data")
        return Message(RecordDict({"metrics": MetricRecord({"pid": pid})}), reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        for _ in range(2):
            replies = grid.send_and_receive([Message(RecordDict(), n, "train") for n in (1002, 1000, 1001)])
            log.append(("server", sorted(r.metadata.src_node_id for r in replies)))

    run_batched(server, client, run_config={}, num_nodes=3, engine=engine, observer=Recorder(log))
    assert [kind for kind, _ in log] == ["pushed", "client", "client", "client", "replied", "server"] * 2
    for at in (0, 6):
        pushed, replied = log[at][1], log[at + 4][1]
        assert [node for _, node in pushed] == [1002, 1000, 1001]  # as the ServerApp sent them
        ids = {node: message_id for message_id, node in pushed}
        assert replied == [(ids[1000], 1000, False), (ids[1001], 1001, True), (ids[1002], 1002, False)]


def test_bad_seeds_are_refused():
    for seed in (-1, 1.5, True, "7"):
        with pytest.raises(ValueError, match="seed"):
            BatchedGrid(drawing_client(), num_nodes=1, run_config={}, seed=seed)
    for parts in ((), (1, -2), (1, 2.0), (True,)):
        with pytest.raises(ValueError, match="seed"):
            derive_seed(*parts)
    for seed in (-1, 2**32, 0.5):
        with pytest.raises(ValueError, match="seed"):
            seed_globals(seed)


def test_derive_seed_is_numpys_seed_sequence_and_globals_kept_puts_every_generator_back():
    assert derive_seed(7, 1, 2, 3) == int(np.random.SeedSequence([7, 1, 2, 3]).generate_state(1)[0])
    assert derive_seed(7, 0) != derive_seed(0, 7) and 0 <= derive_seed(2**40) < 2**32
    seed_globals(5)
    with globals_kept():
        draws(3)
        seed_globals(6)
    after = draws()
    seed_globals(5)
    assert after == draws()


def test_a_saved_state_puts_numpys_pending_gaussian_back_too():
    # numpy's legacy generator keeps the second of each pair of normals it draws for the next draw:
    # the saved state (its key kept as a list of ints, which set_state copies faster) holds it.
    seed_globals(5)
    np.random.randn(3)  # (an odd count: one normal is left pending)
    state = saved_globals()

    def drawn():  # numpy (normals, then uniforms), random, torch
        return (np.random.randn(3).tolist(), np.random.rand(2).tolist(), random.random(),
                torch.rand(2).tolist())

    expected = drawn()
    seed_globals(6)
    np.random.randn(5)
    restore_globals(state)
    assert drawn() == expected


def test_a_saved_state_of_another_numpy_bit_generator_is_put_back_too():
    # An app may give numpy's global generator another bit generator (np.random.set_bit_generator).
    before = np.random.get_bit_generator()
    try:
        np.random.set_bit_generator(np.random.PCG64(3))
        state = saved_globals()
        expected = np.random.rand(3).tolist()
        np.random.rand(5)
        restore_globals(state)
        assert np.random.rand(3).tolist() == expected
    finally:
        np.random.set_bit_generator(before)


@pytest.mark.parametrize("available", [False, True])
def test_cudas_seed_is_queued_back_only_where_cuda_can_start(monkeypatch, available):
    """Without CUDA initialised, restore_globals queues the saved seed for CUDA, as torch.manual_seed
    would: only where a CUDA device is present (elsewhere CUDA never starts; queueing costs a stack trace)."""
    from lips_flwr.experiments import seeding
    from lips_flwr.experiments.seeding import restore_globals, saved_globals

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised: its generators' states are saved and put back instead")
    seeded: list[int] = []
    monkeypatch.setattr(seeding, "_cuda_present", lambda: available)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    torch.manual_seed(11)
    state = saved_globals()
    assert state.cuda is None
    seeded.clear()  # (torch.manual_seed queued its own)
    restore_globals(state)
    assert seeded == ([11] if available else [])


def test_seed_torch_knows_every_backend_torch_manual_seed_seeds():
    """A torch that seeds another backend in manual_seed is noticed here (seed_torch would leave it out)."""
    import inspect
    import re

    from lips_flwr.experiments.seeding import SEEDED_BACKENDS

    source = inspect.getsource(torch.random._manual_seed_impl)
    assert set(re.findall(r"torch\.(\w+)\.manual_seed\w*\(", source)) == {name for name, _ in SEEDED_BACKENDS}
    called = re.findall(r"torch\.(\w+)\.(manual_seed\w*)\(", source)
    assert set(called) == set(SEEDED_BACKENDS)
    assert "_seed_custom_device(seed)" in source  # (a custom backend: seed_torch calls torch.manual_seed)


def test_seed_torch_seeds_what_torch_manual_seed_seeds_on_the_backends_available(monkeypatch):
    from lips_flwr.experiments import seeding
    from lips_flwr.experiments.seeding import SEEDED_BACKENDS, seed_torch

    torch.manual_seed(3)
    theirs = (torch.rand(4), torch.initial_seed())
    seed_torch(np.int64(3))  # (a numpy integer, as torch.manual_seed takes it)
    assert torch.equal(torch.rand(4), theirs[0]) and torch.initial_seed() == theirs[1] == 3

    seeded: list[tuple[str, int]] = []
    available = {"cuda", "mps", "xpu", "mtia"}
    for name, seed_name in SEEDED_BACKENDS:
        module = getattr(torch, name)
        monkeypatch.setattr(module, "is_available", lambda name=name: name in available)
        monkeypatch.setattr(module, seed_name, lambda seed, name=name: seeded.append((name, seed)))
        monkeypatch.setattr(module, "_is_in_bad_fork", lambda: False)
    monkeypatch.setattr(seeding, "_cuda_present", lambda: "cuda" in available)
    seeding._seeded_backends.cache_clear()
    try:
        torch.manual_seed(8)  # every backend available: what torch seeds, seed_torch seeds
        theirs_seeded, seeded[:] = list(seeded), []
        seed_torch(8)
        assert seeded == theirs_seeded and {name for name, _ in seeded} == available
        available.clear()
        available.update({"cuda", "mtia"})
        monkeypatch.setattr(torch.mtia, "_is_in_bad_fork", lambda: True)  # (which torch leaves alone)
        seeding._seeded_backends.cache_clear()
        seeded.clear()
        seed_torch(9)
        assert seeded == [("cuda", 9)] and torch.initial_seed() == 9
        seeded.clear()
        monkeypatch.setattr(torch, torch._C._get_privateuse1_backend_name(), object(), raising=False)
        called = []
        monkeypatch.setattr(torch, "manual_seed", called.append)
        seed_torch(10)  # a custom backend: torch.manual_seed itself
        assert called == [10] and seeded == []
    finally:
        seeding._seeded_backends.cache_clear()
