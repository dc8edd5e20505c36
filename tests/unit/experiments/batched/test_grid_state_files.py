"""The batched Grid writes the clients' state files behind their calls, and has them all before the strategy.

A LIPS strategy that checkpoints resumes its clients from these files, so a
round's files must be written before the strategy aggregates (and
checkpoints) that round, on both engines, however slow the disk.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import lips_flwr.clients.persist as persist
from lips_flwr.clients import lips_mod, persistent_state_mod
from lips_flwr.experiments.batched import run_batched
from lips_flwr.persistence.npz_store import read_meta
from lips_flwr.strategies import LIPS

NODES = 3


def client() -> ClientApp:
    app = ClientApp(mods=[persistent_state_mod, lips_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        step = 0.1 * (1 + int(context.node_config["partition-id"]))
        arrays = ArrayRecord({name: Array(array.numpy() + np.float32(step))
                              for name, array in msg.content["arrays"].items()})
        return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"loss": 1.0, "num-examples": 1})}), reply_to=msg)

    return app


class FilesChecked(FedAvg):
    """FedAvg that notes, as it aggregates a round, the rounds of the clients' state files on disk."""

    def __init__(self, folder, seen: dict) -> None:
        super().__init__(fraction_evaluate=0.0)
        self.folder, self.seen = folder, seen

    def aggregate_train(self, server_round, replies):
        files = sorted(self.folder.glob("lips-client-*.npz"))
        self.seen[server_round] = sorted(read_meta(path, "state")["round"] for path in files
                                         if not path.name.endswith(".prev.npz"))
        return super().aggregate_train(server_round, replies)


def server(folder, seen: dict) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        arrays = ArrayRecord({"mid.weight": Array(np.ones((4, 4), np.float32)),
                              "last.bias": Array(np.zeros(2, np.float32))})
        strategy = LIPS(FilesChecked(folder, seen), num_rounds=3, every=2, mode="client", tau0=0.5,
                        checkpoint_path=str(folder / "checkpoint.npz"))
        strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

    return app


def slow_writes(monkeypatch, seconds: float) -> list[str]:
    """Each state file written ``seconds`` late; the names of the threads that write them."""
    write_groups, writers = persist.write_groups, []

    def slow(*args, **kwargs):
        writers.append(threading.current_thread().name)
        time.sleep(seconds)
        return write_groups(*args, **kwargs)

    monkeypatch.setattr(persist, "write_groups", slow)
    return writers


@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_every_state_file_of_a_round_is_written_before_the_strategy_aggregates_it(tmp_path, monkeypatch, engine):
    writers = slow_writes(monkeypatch, 0.05)  # a file written after its call returned would come late
    seen: dict = {}
    run_batched(server(tmp_path, seen), client(), run_config={"lips-state-dir": str(tmp_path)},
                num_nodes=NODES, engine=engine)
    assert writers == ["lips-flwr client state"] * 3 * NODES  # behind the calls, not in them
    assert seen == {rnd: [rnd] * NODES for rnd in (1, 2, 3)}


def test_a_write_that_fails_other_than_by_the_os_stops_the_run_with_its_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr(persist, "write_groups", broken)
    seen: dict = {}
    with pytest.raises(RuntimeError, match="a bug in the writer"):
        run_batched(server(tmp_path, seen), client(), run_config={"lips-state-dir": str(tmp_path)},
                    num_nodes=NODES, engine="sequential")
    assert seen == {}  # nothing aggregated from that delivery
