"""A Flower ``Grid`` that runs a round's clients in this process, together on one device.

``flwr run`` gives every client its own ClientApp call in a Ray worker: the
real path, and the one a deployment takes. For a research sweep on one
machine (many seeds of long runs, homogeneous clients) most of a GPU round
is per-client overhead, not arithmetic. :class:`BatchedGrid` implements
:class:`flwr.serverapp.Grid`: a ServerApp's own code (``LIPS(FedAvg(...)).start(grid=...)``)
runs on it unchanged, and each message of a round goes through the
*real* ClientApp (its mods and functions) with the node's own ``Context``,
kept across rounds as a SuperNode keeps it. The replies are real reply
``Message``\\ s, or error replies as Flower sends them: a ClientApp that
raises, calls ``sys.exit()`` or returns something other than a reply
``Message`` gets its own error reply (:mod:`.calls`); only a Ctrl-C
(``KeyboardInterrupt``) stops the run.

What it changes is where the clients' training and evaluation run:

- ``"sequential"``: one client after another, as the ClientApp would run
  them (the fastest on a few CPU cores).
- ``"stacked"``: every client of the round in its own thread up to the
  ClientApp's call of :func:`~lips_flwr.experiments.task.training.local_compute`;
  the calls are gathered and run at once, the clients' models stacked
  (:mod:`.stacked`), in chunks of ``chunk_size`` clients. A chunk
  that does not fit in GPU memory is halved until it does. Only calls whose
  models train alike are stacked (:mod:`.signature`); the others run on
  their own, exactly as the sequential engine runs them, with one WARNING
  per run naming the difference.
- ``"auto"`` (default): stacked on CUDA, sequential otherwise.

A ClientApp that calls ``train_tensors`` directly still works on this Grid;
its clients are then trained one after another whatever the engine.

``send_and_receive(timeout=...)`` (Flower's strategies pass their
``start(timeout=...)``) returns the replies that come in time, as Flower's
Grid does; a node that does not answer is left out of the round, with a
WARNING. Since the sequential engine runs one call after another, each call
gets the whole ``timeout`` from its own start (in a thread that can be
abandoned, one per delivery: :class:`.calls.CallsInTurn`); on the stacked
engine a client's time is the time it runs its own Python
(:mod:`.rendezvous`). An abandoned call runs on, and its reply is discarded;
its node is left out of every delivery until the call ends.
``pull_messages`` answers every pending message, with no time limit, before
it returns.

``seed`` makes a run reproducible for an app that never seeds: the
ServerApp starts with the process-wide generators (``random``, numpy's,
torch's) seeded from ``derive_seed(seed, 0)``, every client call with them
seeded from ``derive_seed(seed, 1 + partition-id, round, kind)``
(:meth:`BatchedGrid.call_seed`), the ServerApp's own states put back after
it. On the stacked engine each client keeps its own generators across its
turns, so it draws what it would on the sequential engine, except a stacked
call's dropout (a generator of its own, seeded from its first client's
``seed``); stacked training agrees with sequential to rounding, not bit for
bit. A call that times out goes on drawing from the shared generators (the
run is then not exactly reproducible).
``observer`` (a :class:`GridObserver`) is told of every push and every
delivery's replies as they happen.

A client's state file (:func:`~lips_flwr.clients.persistent_state_mod`) is
written behind the next clients' calls, and every file of a delivery is
written before its replies go on, within the delivery's ``timeout`` after
its calls (:func:`~lips_flwr.clients.saves_behind.saves_behind`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from logging import WARNING
from typing import Protocol

import flwr.serverapp.grid.grid as _grid_module
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid

from lips_flwr.clients.saves_behind import saves_behind
from lips_flwr.errors import ConfigError
from lips_flwr.experiments.batched.arrays import Shared, view_records
from lips_flwr.experiments.batched.calls import (
    CallsInTurn,
    new_message_id,
    nodes_awaited,
    received_copy,
    reply_or_error,
    round_of,
)
from lips_flwr.experiments.batched.rendezvous import Rendezvous
from lips_flwr.experiments.batched.workers import ClientThreads
from lips_flwr.experiments.seeding import derive_seed, globals_kept, seed_globals
from lips_flwr.experiments.task.training import computing_with

Run = _grid_module.Run  # flwr moved ``Run`` between releases; the Grid's own module always has it

ENGINES = ("auto", "sequential", "stacked")
SUPERLINK_NODE_ID = 1  # the sender of every instruction, as in Flower
CALL_KINDS = {MessageType.TRAIN: 1, MessageType.EVALUATE: 2, MessageType.QUERY: 3}  # any other: 4
Answered = list[tuple[Message, Message]]  # (instruction, reply) pairs, in node order


class GridObserver(Protocol):
    """What the batched Grid tells a watcher (the experiment runner) about a run, as it happens."""

    def pushed(self, messages: Sequence[Message]) -> None:
        """Instructions just pushed (message ids, source and destination set), before any client runs."""

    def replied(self, replies: Sequence[Message]) -> None:
        """The replies of one delivery, in node order, error replies included, before the strategy
        sees them (a node left out of the round, e.g. timed out, has none)."""


class BatchedGrid(Grid):
    """Run ``client_app`` for ``num_nodes`` simulated nodes in this process (see the module docstring).

    Parameters
    ----------
    client_app : ClientApp
        The app's ClientApp object, the one ``flwr run`` would load.
    num_nodes : int
        Nodes ``0 .. num_nodes - 1`` (``partition-id``); their node ids are
        fixed (``1000 + partition-id``), so a run is repeatable.
    run_config : dict
        The run config each node's ``Context`` carries.
    engine : str (default: ``"auto"``)
        ``"sequential"``, ``"stacked"`` or ``"auto"``.
    chunk_size : int or None (default: None)
        The most clients trained at once by the stacked engine; ``None``: a
        whole round, halved on a CUDA out-of-memory error.
    autocast : torch.dtype or None (default: None)
        With the stacked engine, the clients' forward passes under
        ``torch.autocast`` in this dtype (``torch.bfloat16``); ``None``: float32.
    run_id : int (default: 1)
    observer : GridObserver or None (default: None)
        Told of every push and every delivery's replies (see :class:`GridObserver`).
    seed : int or None (default: None)
        A non-negative int: every client call runs with the process-wide
        generators seeded for it, and the caller's generators kept (see
        :meth:`call_seed`); ``None``: the generators are left alone.
    on_call : callable or None (default: None)
        Called with no argument as each client call ends, in the thread that
        ran it: a heartbeat for a watcher of the run (the runner's stall timeout).
    """

    def __init__(
        self,
        client_app: ClientApp,
        *,
        num_nodes: int,
        run_config: dict,
        engine: str = "auto",
        chunk_size: int | None = None,
        autocast: torch.dtype | None = None,
        run_id: int = 1,
        observer: GridObserver | None = None,
        seed: int | None = None,
        on_call: Callable[[], None] | None = None,
    ) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"`seed` must be None or an integer >= 0, got {seed!r}")
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"`num_nodes` must be an integer >= 1, got {num_nodes!r}")
        if engine not in ENGINES:
            raise ValueError(f"`engine` must be one of {ENGINES}, got {engine!r}")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise ValueError(f"`chunk_size` must be None or an integer >= 1, got {chunk_size!r}")
        if engine == "auto":
            engine = "stacked" if torch.cuda.is_available() else "sequential"
        self.client_app, self.engine, self.chunk_size = client_app, engine, chunk_size
        self.autocast, self.observer, self.seed, self.on_call = autocast, observer, seed, on_call
        self._calls_made: Counter[tuple[int, str]] = Counter()  # (node, message type base): calls so far
        self._run = Run.create_empty(run_id)
        self._run.override_config = dict(run_config)
        self.contexts = {
            1000 + pid: Context(run_id=run_id, node_id=1000 + pid,
                                node_config={"partition-id": pid, "num-partitions": num_nodes},
                                state=RecordDict(), run_config=dict(run_config))
            for pid in range(num_nodes)
        }
        self._pending: dict[str, Message] = {}
        self._replies: dict[str, Message] = {}
        self._busy: dict[int, threading.Thread] = {}  # nodes whose abandoned call may still run
        self._threads: ClientThreads | None = None  # the stacked engine's, kept across deliveries
        self._split_reported = False
        self.client_seconds = 0.0  # time spent in the clients' calls (for the benchmarks)
        self.stacked_calls = self.one_by_one_calls = 0  # the stacked engine's calls, by how they ran
        self.first_error: str | None = None  # the first error reply's reason (with its traceback), if any

    # -- Grid ----------------------------------------------------------------------------------
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The nodes; ``ConfigError`` when a strategy asks to wait for more (:func:`~.calls.nodes_awaited`).

        This Grid's nodes are all there from its start and never more: a
        strategy waiting for more would wait forever.
        """
        awaited = nodes_awaited(sys._getframe(1))
        if awaited is not None and awaited > len(self.contexts):
            raise ConfigError(
                f"the strategy waits for {awaited} nodes (its min_available_nodes, or the nodes it samples), "
                f"but this run has {len(self.contexts)} (num_nodes, --num-supernodes): it would wait "
                f"forever; run it with {awaited} nodes or more, or lower the strategy's min_available_nodes")
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        pushed: list[Message] = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self.contexts:
                raise ValueError(f"no node {msg.metadata.dst_node_id} in this grid")
            msg.metadata.__dict__["_message_id"] = message_id = new_message_id()
            msg.metadata.__dict__["_run_id"] = self._run.run_id
            msg.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            self._pending[message_id] = msg
            pushed.append(msg)
        if self.observer is not None:
            self.observer.pushed(pushed)
        return [msg.metadata.message_id for msg in pushed]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self._deliver(timeout=None)
        return self._take(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        self._deliver(timeout)
        return self._take(ids)

    def _take(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies to ``message_ids`` that are in, each handed out once."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    @contextlib.contextmanager
    def client_threads_kept(self) -> Iterator[None]:
        """Within the block, the stacked engine's deliveries share worker threads (:mod:`.workers`),
        which end with it; outside it, each delivery's threads are its own."""
        if self.engine != "stacked" or self._threads is not None:
            yield
            return
        self._threads = ClientThreads()
        try:
            yield
        finally:
            threads, self._threads = self._threads, None
            threads.close()

    def busy_nodes(self) -> list[int]:
        """The nodes whose call ran past its timeout and has not ended yet (left out until it does)."""
        return [node for node, thread in self._busy.items() if thread.is_alive()]

    # -- the clients ---------------------------------------------------------------------------
    def call_seed(self, msg: Message) -> int | None:
        """The seed of the client call that answers ``msg`` (``None`` without ``seed``); counts the call.

        ``derive_seed(seed, 1 + partition-id, round, kind)``: ``round`` is the
        message's round (:func:`~.calls.round_of`: a resumed run's calls get
        an uninterrupted one's seeds), else the number of this node's calls
        of this kind so far, this one included; ``kind`` is 1 for ``train``, 2
        for ``evaluate``, 3 for ``query``, 4 for any other (``"train.custom"``: train).
        """
        if self.seed is None:
            return None
        node, base = msg.metadata.dst_node_id, msg.metadata.message_type.split(".")[0]
        self._calls_made[(node, base)] += 1
        rnd = round_of(msg)
        if rnd is None:
            rnd = self._calls_made[(node, base)]
        pid = int(self.contexts[node].node_config["partition-id"])
        return derive_seed(self.seed, 1 + pid, rnd, CALL_KINDS.get(base, 4))

    def _call_client(self, msg: Message, seed: int | None = None, shared: Shared | None = None) -> Message:
        """The node's ClientApp on its own copy of ``msg``: its reply, or an error reply (:mod:`.calls`).

        With ``seed``, the process-wide generators are seeded with it first;
        with ``shared``, the delivery's parsed broadcast Arrays (:mod:`.arrays`).
        """
        context = self.contexts[msg.metadata.dst_node_id]
        received = received_copy(msg, shared)
        if seed is not None:
            seed_globals(seed)
        reply = reply_or_error(self.client_app, received, context)
        if reply.has_content():
            view_records(reply.content)  # what the strategy reads, read faster (arrays.py)
        reply.metadata.__dict__["_message_id"] = new_message_id()
        if self.on_call is not None:
            self.on_call()
        return reply

    def _deliver(self, timeout: float | None) -> None:
        """Answer every pushed message (one round's worth, usually) with the chosen engine."""
        # By node: a strategy samples its nodes in a random order (Flower's FedAvg does, unseeded),
        # and the stacked engine's numbers depend on the clients' order in a stack.
        pending = sorted(self._pending.values(), key=lambda msg: msg.metadata.dst_node_id)
        self._pending = {}
        if not pending:
            return
        callable_now = [msg for msg in pending if not self._still_busy(msg.metadata.dst_node_id)]
        seeds = [self.call_seed(msg) for msg in callable_now]  # in node order, whichever engine
        start = time.perf_counter()
        # The clients' state files are written behind the calls; the wait for them counts as the clients'
        # time and is bounded as a call is (TimeoutError: a stuck disk stops the run rather than hang it).
        # With a seed, the ServerApp's generators are kept across the delivery (each call seeds them first).
        kept = globals_kept() if self.seed is not None else contextlib.nullcontext()
        with saves_behind(timeout), kept:
            if self.engine == "sequential":
                answered = self._run_sequential(callable_now, seeds, timeout)
            else:
                answered = self._run_stacked(callable_now, seeds, timeout)
        self.client_seconds += time.perf_counter() - start
        replies = [reply for _, reply in answered]
        if self.first_error is None:
            self.first_error = next((r.error.reason for r in replies if r.has_error()), None)
        if self.observer is not None:
            self.observer.replied(replies)
        for msg, reply in answered:
            self._replies[msg.metadata.message_id] = reply

    def _run_sequential(self, calls: list[Message], seeds: list[int | None],
                        timeout: float | None) -> Answered:
        """One call after another, each with the whole ``timeout`` from its own start
        (:class:`.calls.CallsInTurn`: in one thread, and a new one after a call it abandons)."""
        shared: Shared = {}  # (the delivery's broadcast Arrays, parsed once for all its calls)
        if timeout is None:  # nothing to abandon: in this thread, each call in a copy of its context
            return [(msg, contextvars.copy_context().run(self._call_client, msg, seed, shared))
                    for msg, seed in zip(calls, seeds)]
        in_turn = CallsInTurn([functools.partial(self._call_client, msg, seed, shared)
                               for msg, seed in zip(calls, seeds)],
                              timeout, name=lambda index: f"node {calls[index].metadata.dst_node_id}")
        replies = in_turn.run(on_abandoned=lambda index, thread: self._left_out(
            calls[index].metadata.dst_node_id, thread, timeout))
        return [(msg, reply) for msg, reply in zip(calls, replies) if reply is not None]

    def _run_stacked(self, calls: list[Message], seeds: list[int | None], timeout: float | None) -> Answered:
        """Every call in its own thread, their training calls gathered (:mod:`.rendezvous`)."""
        rendezvous = Rendezvous(chunk_size=self.chunk_size, autocast=self.autocast,
                                keep_generators=self.seed is not None, on_split=self._report_split)
        shared: Shared = {}
        replies = rendezvous.run([_bound(self._call_client, msg, seed, shared, rendezvous)
                                  for msg, seed in zip(calls, seeds)], timeout=timeout,
                                 names=[f"node {msg.metadata.dst_node_id}" for msg in calls],
                                 threads=self._threads)
        self.chunk_size = rendezvous.chunk_size  # a halving on OOM holds for later rounds
        self.stacked_calls += rendezvous.stacked
        self.one_by_one_calls += rendezvous.one_by_one
        for index, thread in rendezvous.abandoned.items():
            self._left_out(calls[index].metadata.dst_node_id, thread, timeout)
        return [(msg, reply) for msg, reply in zip(calls, replies) if reply is not None]

    def _left_out(self, node: int, thread: threading.Thread, timeout: float | None) -> None:
        """``node``'s call ran past ``timeout``: no reply this round, and none while the call runs."""
        self._busy[node] = thread
        log(WARNING, "node %d did not reply within %s s: left out of this round (its call runs on; "
            "a late reply is discarded)", node, timeout)

    def _still_busy(self, node: int) -> bool:
        """Whether ``node``'s earlier, abandoned call still runs (then it is left out, logged)."""
        thread = self._busy.get(node)
        if thread is not None and thread.is_alive():
            log(WARNING, "node %d is still running an earlier call that timed out: left out of this "
                "round", node)
            return True
        self._busy.pop(node, None)
        return False

    def _report_split(self, difference: str) -> None:
        """Log, once per run, that the stacked engine did not stack calls whose models differ."""
        if not self._split_reported:
            self._split_reported = True
            log(WARNING, "%s: calls are stacked only with calls whose models train alike; the others "
                "run on their own, as the sequential engine runs them (logged once per run)", difference)


def _bound(call: Callable[[Message, int | None, Shared], Message], msg: Message, seed: int | None,
           shared: Shared, engine) -> Callable[[], Message]:
    def client() -> Message:
        with computing_with(engine):
            return call(msg, seed, shared)  # (seeded here, in this client thread's own turn)
    return client


__all__ = ["BatchedGrid", "ENGINES", "GridObserver"]
