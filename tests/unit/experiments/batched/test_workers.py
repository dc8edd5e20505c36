"""The stacked engine's client threads, kept from one delivery to the next (issue 39)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched import run_batched
from lips_flwr.experiments.batched.workers import ClientThreads
from lips_flwr.experiments.task.training import local_compute
from watchdog import finishes


def _run(workers, tasks_done: list[threading.Event]) -> None:
    """Open every worker's gate (the turn, one after another here) and wait for its task."""
    for worker, done in zip(workers, tasks_done):
        worker.gate.release()
        assert done.wait(timeout=30)


def test_a_pool_runs_each_task_once_its_gate_opens_and_keeps_its_threads_for_the_next_tasks():
    pool = ClientThreads()
    ran: list[tuple[int, int]] = []

    def tasks(n: int) -> tuple[list, list[threading.Event]]:
        done = [threading.Event() for _ in range(n)]

        def task(i: int):
            return lambda: (ran.append((i, threading.get_ident())), done[i].set())
        return [task(i) for i in range(n)], done

    first, done = tasks(3)
    workers = pool.assign(first)
    assert ran == []  # nothing runs before its gate opens
    _run(workers, done)
    pool.wait_idle()
    threads = [ident for _, ident in ran]
    second, done = tasks(3)
    assert pool.assign(second) == workers  # the same workers, in the same order
    _run(workers, done)
    pool.wait_idle()
    assert [ident for _, ident in ran[3:]] == threads and len(set(threads)) == 3
    pool.close()
    assert not any(worker.thread.is_alive() for worker in workers)
    with pytest.raises(RuntimeError, match="closed"):
        pool.assign(second)


def test_a_retired_worker_is_not_waited_for_nor_reused_and_its_thread_ends_with_its_task():
    pool = ClientThreads()
    release, started = threading.Event(), threading.Event()
    hung = pool.assign([lambda: (started.set(), release.wait(timeout=60))])[0]
    hung.gate.release()
    assert started.wait(timeout=30)
    pool.retire(hung)
    # (it would wait for ever for the hung task)
    assert "error" not in finishes(pool.wait_idle, 10, hung="waited for a retired worker")
    done = threading.Event()
    fresh = pool.assign([done.set])[0]
    assert fresh is not hung
    _run([fresh], [done])
    release.set()
    hung.thread.join(timeout=30)
    assert not hung.thread.is_alive()
    pool.close()
    assert not fresh.thread.is_alive()


@pytest.mark.usefixtures("task_identity")
def test_a_run_on_the_stacked_engine_serves_every_round_from_the_same_threads_which_end_with_it():
    seen: dict[int, set[int]] = {}
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.content["config"]["server-round"])
        seen.setdefault(rnd, set()).add(threading.get_ident())
        local_compute().train(torch.nn.Linear(2, 2), torch.zeros(4, 2), torch.zeros(4, dtype=torch.long),
                              epochs=1, batch_size=2, seed=0)
        content = {"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}
        return Message(RecordDict(content), reply_to=msg)

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        FedAvg(fraction_evaluate=0.0).start(grid=grid, num_rounds=3, initial_arrays=ArrayRecord(
            {"w": Array(np.ones(2, np.float32))}))

    before = set(threading.enumerate())
    out = finishes(lambda: run_batched(server, app, run_config={}, num_nodes=4, engine="stacked"), 60,
                   hung="the run hung")
    assert "error" not in out, out.get("error")
    assert sorted(seen) == [1, 2, 3] and seen[1] == seen[2] == seen[3] and len(seen[1]) == 4
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]  # ended with the run


def test_a_pool_that_cannot_start_a_thread_keeps_the_workers_it_has_for_the_next_tasks(monkeypatch):
    pool = ClientThreads()
    done = [threading.Event()]
    first = pool.assign([done[0].set])
    _run(first, done)
    pool.wait_idle()
    started = ClientThreads._started

    def one_more_then_none(self, worker):
        if len(created) == 1:
            raise RuntimeError("can't start new thread")
        created.append(worker)
        return started(self, worker)

    created: list = []
    monkeypatch.setattr(ClientThreads, "_started", one_more_then_none)
    with pytest.raises(RuntimeError, match="can't start"):
        pool.assign([done[0].set] * 3)  # the idle worker taken, one started, the third fails
    monkeypatch.setattr(ClientThreads, "_started", started)
    assert "error" not in finishes(pool.wait_idle, 10, hung="counted tasks that were never given")
    done = [threading.Event() for _ in range(2)]
    again = pool.assign([event.set for event in done])
    assert set(again) == {first[0], created[0]}  # the same two workers, nothing lost
    _run(again, done)
    pool.wait_idle()
    pool.close()
    assert not any(worker.thread.is_alive() for worker in again)
