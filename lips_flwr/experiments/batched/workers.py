"""The threads that run the stacked engine's clients, kept from one delivery to the next.

The stacked engine runs every client of a delivery in its own thread
(:mod:`.rendezvous`). Starting a hundred threads and ending them took ~15 ms
a delivery on the development machine (2 cores), 0.15 ms of every call;
:class:`ClientThreads` keeps them for the next delivery instead.

Each worker thread waits at its *gate*, a lock that is held while it waits:
whoever releases the gate lets the worker go on, to its next task when it is
idle, or, inside a task, to its next turn (the Rendezvous hands the turn from
client to client through the same gates). So giving a worker its task wakes
nothing: the task starts when its client is first given the turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class Worker:
    """One thread of a :class:`ClientThreads`, its gate and its pending task."""

    __slots__ = ("gate", "task", "thread", "retired")

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.gate.acquire()  # held: the worker waits until someone releases it
        self.task: Callable[[], object] | None = None  # what the worker runs when its gate opens next
        self.thread: threading.Thread | None = None
        self.retired = False  # left out of later deliveries: the thread ends with its task


class ClientThreads:
    """Worker threads kept across deliveries (see the module docstring).

    A delivery takes a worker per client (:meth:`assign`), opens their gates
    as its turns go, waits until every task has ended (:meth:`wait_idle`),
    and gives back nothing: its workers are idle again, ready for the next
    delivery. :meth:`close` ends the idle workers; a worker still in its task
    (a client left out past its timeout: :meth:`retire`) ends with it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()  # guards what follows
        self._idle: list[Worker] = []  # workers whose last task has ended, ready for another
        self._busy = 0  # tasks assigned and not ended, those of retired workers aside
        self._closed = False

    def assign(self, tasks: Sequence[Callable[[], object]]) -> list[Worker]:
        """A worker for each task, in order, its task set: it runs once its gate is released.

        Idle workers first, new ones for the rest. Raises ``RuntimeError``
        once closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("these client threads are closed")
            workers, self._idle = self._idle[:len(tasks)], self._idle[len(tasks):]
        try:
            while len(workers) < len(tasks):
                workers.append(self._started(Worker()))
        except BaseException:  # (no thread to start, a Ctrl-C): those taken or started are idle again
            with self._cond:
                self._idle.extend(workers)
            raise
        with self._cond:
            self._busy += len(tasks)
        for worker, task in zip(workers, tasks):
            worker.task = task
        return workers

    def _started(self, worker: Worker) -> Worker:
        worker.thread = threading.Thread(target=self._serve, args=(worker,), name="lips-flwr client",
                                         daemon=True)  # (a daemon: a hung client keeps no process alive)
        worker.thread.start()
        return worker

    def _serve(self, worker: Worker) -> None:
        """A worker thread: each time its gate opens, its task; ends when it finds none, or retired."""
        while True:
            worker.gate.acquire()
            task, worker.task = worker.task, None
            if task is None:
                return  # closed
            kept = False
            try:
                # A Rendezvous task raises nothing (it keeps a client's errors); if one did (a bug), the
                # thread would end without handing the turn on, and a leader without a timeout would hang.
                task()
                kept = True
            finally:
                with self._cond:
                    if not worker.retired:  # (a retired worker's task is no longer counted)
                        self._busy -= 1
                        if self._busy == 0:
                            self._cond.notify_all()
                    kept = kept and not worker.retired and not self._closed
                    if kept:
                        self._idle.append(worker)
            if not kept:
                return

    def retire(self, worker: Worker) -> None:
        """Leave ``worker`` out from now on (its client ran past its timeout): :meth:`wait_idle` no
        longer waits for its task, and its thread ends when the task does."""
        with self._cond:
            if not worker.retired:
                worker.retired = True
                self._busy -= 1
                if self._busy == 0:
                    self._cond.notify_all()

    def wait_idle(self) -> None:
        """Wait until every task assigned has ended (those of retired workers aside)."""
        with self._cond:
            while self._busy > 0:
                self._cond.wait()

    def close(self) -> None:
        """End the idle workers (joined) and every other one once its task ends; no more tasks."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.gate.release()  # (its task is None: the thread returns)
        for worker in idle:
            assert worker.thread is not None
            worker.thread.join()


__all__ = ["ClientThreads", "Worker"]
