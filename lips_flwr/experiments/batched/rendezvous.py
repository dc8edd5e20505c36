"""Gather many clients' training (or evaluation) calls and run them at once.

Each client of a round runs its ClientApp in its own thread, unchanged, up to
its call of ``local_compute().train(...)`` (or ``.evaluate``); there it waits.
When every client thread is either waiting or finished, the leader (the
thread that called :meth:`Rendezvous.run`) runs the gathered calls together,
their models stacked (:mod:`.stacked`), puts their clients in line for the
turn again, in the clients' order, and waits for the next gathering: the
calls of a round fall into phases on their own (train, then the evaluations
after it).

The client threads take turns: one runs its Python (the ClientApp, its
mods, its records) while the others wait, each on its own gate (a lock).
The turn is handed on like a baton: a client that reaches its call or
returns opens the gate of the next client in line (in the clients' order),
and the leader is woken only when no client is left to run, or when the new
holder's time runs out before the turn the leader is timing. A hundred
threads all runnable at once would fight over the GIL, and waking every
waiting thread at each hand-over (a shared lock, one condition, or every
call's result announced at once) costs each call a burst of thread
switches; on a CPU that made a call's overhead several times the sequential
engine's. So a ClientApp must not wait,
outside its calls, on something another client does (a lock another client
holds across its call): that client cannot run until this one reaches its
call or returns. Its calls must come from its own thread: one made from a
thread it started (``asyncio.to_thread``) is a ``RuntimeError``.

Calls are stacked only with calls of the same work (kind, data shapes,
settings) whose models have the same signature (:mod:`.signature`: classes,
modes, hooks, ``requires_grad``...); a call that no other call matches runs
alone, as :data:`~.training.SEQUENTIAL` would, and ``on_split`` is told why
the calls of one work differ. If a stacked chunk fails for any reason but
memory, its calls run one by one, so that one client's error stays that
client's error reply.

With a ``timeout``, a client that has held the turn for longer, counted
from the moment its gate opens (not its waits in line or for its gathered
calls), is abandoned: the leader takes its turn back and goes on without
it; the thread runs on, its result is discarded, and a call it makes after
is a ``RuntimeError``.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from logging import WARNING
from typing import Any, TypeVar

import torch
from flwr.common.logger import log
from torch import nn

import lips_flwr.experiments.batched.chunks as chunks
from lips_flwr.experiments.batched.chunks import GatheredCall
from lips_flwr.experiments.batched.signature import Entry, alone_reason, difference
from lips_flwr.experiments.batched.workers import ClientThreads, Worker
from lips_flwr.experiments.seeding import restore_globals, saved_globals

T = TypeVar("T")


class Rendezvous:
    """A :class:`~.training.LocalCompute` shared by a round's client threads (see the module docstring).

    Parameters
    ----------
    chunk_size : int or None
        The most calls run at once; ``None``: all of a gathering. A chunk that
        raises a CUDA out-of-memory error is halved (down to one call), and
        the smaller size is kept in :attr:`chunk_size`.
    autocast : torch.dtype or None
        Stacked calls' forward passes under ``torch.autocast`` in this dtype
        (e.g. ``torch.bfloat16``); ``None``: float32, as the ClientApp.
    keep_generators : bool (default: False)
        Give every client its own process-wide generators (``random``,
        numpy's, torch's): their states are saved when a client hands over
        its turn and put back when it gets it again, so what a client draws
        does not depend on the other clients. A call run alone draws from
        its client's generators (as under the sequential engine); a stacked
        call's dropout draws from its own seeded generator and leaves the
        clients' untouched.
    on_split : callable or None
        Called with a sentence naming the difference whenever calls of the
        same work are not stacked together because their models differ.
    """

    def __init__(self, chunk_size: int | None = None, autocast: torch.dtype | None = None,
                 keep_generators: bool = False, on_split: Callable[[str], None] | None = None) -> None:
        self.chunk_size, self.autocast, self.keep_generators = chunk_size, autocast, keep_generators
        self.on_split = on_split
        self._cond = threading.Condition()  # guards what follows; the leader waits on it
        self._calls: list[GatheredCall] = []
        self._running = 0  # client threads neither waiting in a call, finished nor abandoned
        self._thread = threading.local()  # .index: the client a thread runs; .turn: it holds the turn
        self._workers: list[Worker] = []  # client i's thread, which waits for the turn at its gate
        self._next: deque[int] = deque()  # the clients in line for the turn, in the order they get it
        self._holder: int | None = None  # the client holding the turn, and since when (time.monotonic())
        self._since = 0.0
        self._held: list[float] = []  # each client's time holding the turn, past turns
        self._timeout: float | None = None
        self._wake_at: float | None = None  # when the waiting leader looks at the holder's time next
        self._names: Sequence[str] = ()
        self.abandoned: dict[int, threading.Thread] = {}  # clients past their timeout, by index
        self._stopped: BaseException | None = None  # what stopped the leader (a Ctrl-C), if anything
        self.stacked = 0  # calls run stacked with others
        self.one_by_one = 0  # calls run alone (a group of one, or after a stacked chunk failed)

    # -- the clients' side (LocalCompute) ------------------------------------------------------
    def train(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> float:
        return self._wait(GatheredCall("train", net, x, y, kwargs))

    def evaluate(self, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        return self._wait(GatheredCall("evaluate", net, x, y))

    def _wait(self, call: GatheredCall) -> Any:
        if not getattr(self._thread, "turn", False):
            # A thread the client started: its parent keeps the turn while it waits for it, so
            # no other client could reach its call and the gathering would never complete.
            raise RuntimeError("a Rendezvous call (local_compute().train/.evaluate) from a thread the "
                               "Rendezvous did not start: make it from the ClientApp's own thread")
        call.index = self._thread.index
        if self.keep_generators:
            call.generators = saved_globals()
        with self._cond:
            if call.index in self.abandoned:
                raise RuntimeError("this client ran past its timeout and was left out of the round: "
                                   "its calls are not run")
            if self._stopped is not None:
                raise RuntimeError(f"the round was stopped ({self._stopped!r}): its calls are not run")
            self._calls.append(call)
            self._running -= 1
            self._pass_turn()
        self._await_turn()  # (the leader puts this client in line once its call's result is in)
        if call.generators is not None:  # (a call run alone has drawn from them meanwhile)
            restore_globals(call.generators)
        if call.error is not None:
            raise call.error
        return call.result

    def _await_turn(self) -> None:
        """Wait until this client thread's gate opens: the turn is its own."""
        self._workers[self._thread.index].gate.acquire()
        self._thread.turn = True

    def _pass_turn(self) -> None:
        """Hand the turn on (the thread holding it, under ``_cond``)."""
        self._thread.turn = False
        index = self._thread.index
        if self._holder == index:  # (not a client the leader has counted out since)
            self._held[index] += time.monotonic() - self._since
            self._holder = None
            self._open_next()

    def _open_next(self) -> None:
        """Give the free turn to the next client in line; with none left to run, wake the leader
        (under ``_cond``)."""
        if self._next:
            self._holder, self._since = self._next.popleft(), time.monotonic()
            self._workers[self._holder].gate.release()
            if self._timeout is not None and (self._wake_at is None or self._deadline() < self._wake_at):
                self._cond.notify()  # the leader times this turn, which runs out before the one it waits for
        elif self._running == 0:
            self._cond.notify()  # the leader, the only one waiting on it

    # -- the leader's side ---------------------------------------------------------------------
    def run(self, clients: Sequence[Callable[[], T]], timeout: float | None = None,
            names: Sequence[str] | None = None, threads: ClientThreads | None = None) -> list[T | None]:
        """Run each client in its own thread, gathering their calls; their results, in order.

        A client must not raise (wrap it); if one does, its exception is
        raised here once every client has ended (those abandoned aside). A client abandoned past
        ``timeout`` seconds of its own (see the module docstring) has the
        result ``None`` and its thread in :attr:`abandoned`. ``names`` name
        the clients in :attr:`on_split`'s sentences (default: ``client i``).
        ``threads``: the worker threads to run the clients in, kept for the
        caller's next call (:mod:`.workers`); ``None``: threads of this call's own.
        """
        results: list[Any] = [None] * len(clients)
        errors: list[BaseException] = []
        self._timeout, self._held, self.abandoned = timeout, [0.0] * len(clients), {}
        self._stopped = None
        self._names = names or [f"client {i}" for i in range(len(clients))]

        def client_thread(i: int) -> None:  # (run by a worker whose gate has opened: the turn is its own)
            self._thread.index, self._thread.turn = i, True
            result: Any = None
            error: BaseException | None = None
            try:
                result = clients[i]()
            except BaseException as err:  # noqa: BLE001 - re-raised by the leader
                error = err
            with self._cond:
                if i in self.abandoned:
                    return  # the leader has counted it out and taken its turn back
                if error is not None:
                    errors.append(error)
                results[i] = result
                self._running -= 1
                self._pass_turn()

        pool = threads if threads is not None else ClientThreads()
        try:
            # Each client in a copy of the caller's context (contextvars), as the sequential engine's calls.
            self._workers = pool.assign([functools.partial(contextvars.copy_context().run, client_thread, i)
                                         for i in range(len(clients))])
            self._running = len(clients)
            self._next, self._holder = deque(range(len(clients))), None
            with self._cond:
                self._open_next()  # client 0 first
            try:
                failure = self._lead(pool)
            except BaseException as stop:  # a Ctrl-C while the leader waits: no client left waiting
                self._release_waiting(stop)
                raise
            pool.wait_idle()  # (every client's thread done with it, those left out aside)
        finally:
            if threads is None:
                pool.close()
        if failure is not None:
            raise failure
        if errors:
            raise errors[0]
        return [None if i in self.abandoned else result for i, result in enumerate(results)]

    def _lead(self, pool: ClientThreads) -> BaseException | None:
        """Run the gathered calls until every client thread has finished; what failed them, if anything."""
        failure: BaseException | None = None  # raised by running gathered calls (a stop, a bug)
        while True:
            with self._cond:
                while self._running > 0:
                    left = self._time_left()
                    self._wake_at = None if left is None else time.monotonic() + left
                    self._cond.wait(left)
                    self._abandon_overdue(pool)
                self._wake_at = None
                calls, self._calls = self._calls, []
            if not calls:
                break  # every client thread has finished
            # In the clients' order, not the order their threads arrived in: which net is the
            # template, whose seed seeds the global RNG, each client's dropout draws (by its place
            # in the stack) and the chunks all follow it, so a run gives the same numbers every time.
            calls.sort(key=lambda call: call.index)
            if failure is None:
                try:
                    self._execute(calls)
                except BaseException as err:  # noqa: BLE001 - raised below, once no client waits
                    failure = err
            if failure is not None:  # every call without a result fails, so no client waits forever
                for call in calls:
                    if call.result is None and call.error is None:
                        call.error = RuntimeError(f"the gathered calls failed: {failure!r}")
            self._line_up(calls)
        return failure

    def _line_up(self, calls: Sequence[GatheredCall]) -> None:
        """Put the clients of ``calls`` (results or errors in) in line for the turn, in order."""
        with self._cond:
            self._running += len(calls)
            self._next.extend(call.index for call in calls)
            if self._holder is None:
                self._open_next()

    def _release_waiting(self, stop: BaseException) -> None:
        """Fail every gathered call and every later one, so that no client thread waits for ever."""
        with self._cond:
            self._stopped = stop
            calls, self._calls = self._calls, []
            if self._holder in self.abandoned:  # (stopped while counting it out: its turn goes on)
                self._holder = None
        for call in calls:
            call.error = RuntimeError(f"the round was stopped ({stop!r}): its calls are not run")
        self._line_up(calls)

    def _time_left(self) -> float | None:
        """Seconds until the client holding the turn runs past the timeout (``None``: nothing to time)."""
        if self._timeout is None or self._holder is None:
            return None
        return max(0.0, self._deadline() - time.monotonic())

    def _deadline(self) -> float:
        """When the client holding the turn runs past the timeout (``time.monotonic()``)."""
        assert self._timeout is not None and self._holder is not None
        return self._since + self._timeout - self._held[self._holder]

    def _abandon_overdue(self, pool: ClientThreads) -> None:
        """Leave out the client holding the turn if it ran past the timeout (the leader, under ``_cond``)."""
        left = self._time_left()
        if left is None or left > 0 or self._holder is None:
            return
        worker = self._workers[self._holder]
        assert worker.thread is not None
        self.abandoned[self._holder] = worker.thread
        pool.retire(worker)
        self._holder = None
        self._running -= 1
        self._open_next()

    def _execute(self, calls: list[GatheredCall]) -> None:
        groups = self._groups(calls)
        for group in groups:
            start = 0
            while start < len(group):
                size = self.chunk_size or len(group)
                chunk = group[start:start + size]
                try:
                    chunks.run_together(chunk, self.autocast)
                    self.stacked += len(chunk) if len(chunk) > 1 else 0
                    self.one_by_one += 1 if len(chunk) == 1 else 0
                except torch.cuda.OutOfMemoryError:
                    if size == 1:
                        raise
                    torch.cuda.empty_cache()
                    self.chunk_size = max(1, min(size, len(chunk)) // 2)
                    continue
                except Exception as err:  # noqa: BLE001 - find whose call it is: one by one
                    log(WARNING, "stacked %s of %d clients failed (%r); running them one by one",
                        chunk[0].kind, len(chunk), err)
                    chunks.run_one_by_one(chunk)
                    self.one_by_one += len(chunk)
                start += len(chunk)

    def _groups(self, calls: list[GatheredCall]) -> list[list[GatheredCall]]:
        """The calls that may be stacked together: the same work and model signature, in client order."""
        groups: dict[tuple, list[GatheredCall]] = {}
        first_of_work: dict[tuple, tuple[list[Entry], GatheredCall]] = {}
        reported: set[tuple] = set()
        for call in calls:
            try:
                work, signature = call.work(), call.signature()
                alone = alone_reason(signature) is not None  # (even if clients share that net)
                groups.setdefault((work, ("alone", id(call)) if alone else tuple(signature)), []).append(call)
            except Exception as err:  # noqa: BLE001 - a malformed call fails alone
                call.error = err
                continue
            first_signature, first = first_of_work.setdefault(work, (signature, call))
            if self.on_split is not None and work not in reported and signature != first_signature:
                reported.add(work)
                self.on_split(f"stacked engine: {self._names[call.index]}'s {call.kind} call differs from "
                              f"{self._names[first.index]}'s ({difference(signature, first_signature)})")
        return list(groups.values())


__all__ = ["Rendezvous"]
