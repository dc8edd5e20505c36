"""A strategy that waits for more nodes than the batched Grid has fails at once, naming both numbers.

Flower's strategies wait, without end, until ``min_available_nodes`` nodes are
connected; the batched Grid's nodes are all there from its start, so such a
run would hang (``Waiting for nodes to connect``) forever.
"""

from __future__ import annotations

import threading

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from lips_flwr.errors import ConfigError
from lips_flwr.experiments.batched import run_batched


def client() -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        metrics = MetricRecord({"num-examples": 1})
        return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"loss": 1.0, "num-examples": 1})}), reply_to=msg)

    return app


def server(**strategy) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        arrays = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
        FedAvg(**strategy).start(grid=grid, initial_arrays=arrays, num_rounds=1)

    return app


def legacy_server(min_available_clients: int) -> ServerApp:
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    def server_fn(context: Context) -> ServerAppComponents:
        strategy = LegacyFedAvg(min_available_clients=min_available_clients,
                                initial_parameters=ndarrays_to_parameters([np.zeros(3, np.float32)]))
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=1))

    return ServerApp(server_fn=server_fn)


def within(seconds: float, fn) -> BaseException | None:
    """What ``fn()`` raised (``None``), run in a thread that must end within ``seconds``: no hang."""
    out: dict = {}

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the run waits for nodes that never come"
    return out.get("error")


def run(app: ServerApp, num_nodes: int) -> BaseException | None:
    return within(30.0, lambda: run_batched(app, client(), run_config={}, num_nodes=num_nodes,
                                            engine="sequential", seed=0))


def test_flowers_default_of_two_nodes_on_a_grid_of_one_fails_at_once_naming_both():
    error = run(server(), num_nodes=1)
    assert isinstance(error, ConfigError)
    assert "the strategy waits for 2 nodes" in str(error) and "this run has 1" in str(error)
    assert run(server(), num_nodes=2) is None  # enough: the run goes through


def test_the_nodes_a_round_samples_count_as_awaited_too():
    error = run(server(min_available_nodes=2, min_train_nodes=3), num_nodes=2)
    assert isinstance(error, ConfigError) and "waits for 3 nodes" in str(error) and "has 2" in str(error)


def test_a_legacy_strategy_waiting_for_more_clients_fails_at_once_naming_both():
    error = run(legacy_server(min_available_clients=3), num_nodes=2)
    assert isinstance(error, ConfigError), error
    assert "waits for 3 nodes" in str(error) and "this run has 2" in str(error)


def test_a_legacy_strategy_with_enough_nodes_runs():
    assert run(legacy_server(min_available_clients=3), num_nodes=3) is None


def test_on_call_is_told_as_each_client_call_ends():
    """The runner's stall timeout hears of a run's progress through it, call by call."""
    calls: list[int] = []
    run_batched(server(), client(), run_config={}, num_nodes=3, engine="sequential", seed=0,
                on_call=lambda: calls.append(1))
    assert len(calls) == 6  # one round: 3 train calls, 3 evaluate calls
