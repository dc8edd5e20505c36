"""How the batched Grid calls a node's ClientApp: its reply or an error reply, and calls with a deadline.

Flower never lets one ClientApp end a run: under ``flwr run`` an exception
becomes that node's error reply (``CLIENT_APP_RAISED_EXCEPTION``, the reason
``"<class 'ZeroDivisionError'>:<'division by zero'>"``), and a ClientApp
that ends without pushing a reply (``sys.exit()``, a return that is not a
reply ``Message``) leaves its SuperNode to answer ``CLIENT_APP_CRASHED``,
"ClientApp stopped responding.". :func:`reply_or_error` does the same in this
process, saying in the reason what the ClientApp did. Only
``KeyboardInterrupt`` passes through: a real Ctrl-C must stop the run.

Flower's ``Grid.send_and_receive(timeout=...)`` returns the replies that came
in time and leaves the other nodes out. :class:`CallsInTurn` runs calls one
after another in a thread that the Grid can stop waiting for; a call past its
deadline goes on, and its reply, when it comes, is discarded.

:func:`nodes_awaited` tells the Grid when a strategy asks for its nodes in
order to wait until ``min_available_nodes`` are connected (Flower's
strategies ask again each second, without end): the batched Grid's nodes
never change, so a wait for more than it has would never end.

:func:`round_of` says which server round a message belongs to, for the seed
of the call that answers it and for the runner's observations alike.
"""

from __future__ import annotations

import contextvars
import os
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Generic, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lips_flwr._records import record_copy
from lips_flwr.experiments.batched.arrays import Shared, viewed_record

T = TypeVar("T")

CLIENT_APP_RAISED_EXCEPTION = 2  # flwr.common.constant.ErrorCode
CLIENT_APP_CRASHED = 8  # flwr.common.constant.ErrorCode
CRASHED = "ClientApp stopped responding."  # the SuperNode's reason for CLIENT_APP_CRASHED


def nodes_awaited(frame: FrameType | None) -> int | None:
    """How many nodes the Flower code in ``frame`` waits for, when it asks the Grid for its nodes to wait.

    Message API: ``sample_nodes(grid, min_available_nodes, sample_size)``
    waits for ``max(min_available_nodes, sample_size)`` (its local, raised
    to that before the wait). Legacy API: the client manager's ``sample``,
    wrapped by Flower's compat layer to ask the Grid first, waits for
    ``min_num_clients`` (else ``num_clients``). ``None`` for any other caller.
    """
    if frame is None:
        return None
    names = frame.f_locals
    if frame.f_code.co_name == "sample_nodes" and isinstance(names.get("min_available_nodes"), int):
        return int(names["min_available_nodes"])
    wrapper = frame.f_back if frame.f_code.co_name == "update_registered_nodes" else None
    wrapped = getattr(wrapper.f_locals.get("original_method"), "__name__", None) if wrapper else None
    if wrapper is None or wrapper.f_code.co_name != "wrapped_method" or wrapped != "sample":
        return None
    args, kwargs = wrapper.f_locals.get("args", ()), wrapper.f_locals.get("kwargs", {})
    wanted = kwargs.get("min_num_clients", args[1] if len(args) > 1 else None)
    if wanted is None:
        wanted = kwargs.get("num_clients", args[0] if args else None)
    return wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else None


_MESSAGE_IDS = random.Random()  # (its own state: seeded from os.urandom, not the generators a run keeps)
if hasattr(os, "register_at_fork"):  # POSIX: a forked child draws other ids than its parent
    os.register_at_fork(after_in_child=_MESSAGE_IDS.seed)


def new_message_id() -> str:
    """A new message id in ``uuid.uuid4()``'s form, from this module's own generator: ``uuid4`` reads
    ``os.urandom``, a system call, in which a client call's thread would let go of the GIL."""
    return str(uuid.UUID(int=_MESSAGE_IDS.getrandbits(128), version=4))


def received_copy(msg: Message, shared: Shared | None = None) -> Message:
    """``msg`` as a node receives it: the same metadata, its own records.

    Flower sends every node the same ``RecordDict`` object; over the wire each
    client gets a copy, so a mod that edits its message in place (FedBN swaps
    arrays) must not reach the other clients' messages. Each client gets its
    own Array objects, shallow copies over the same (immutable) bytes that
    read faster, parsed once for the calls that share ``shared``
    (:func:`.arrays.viewed_record`).
    """
    content = RecordDict()
    for name, record in msg.content.items():
        if isinstance(record, ArrayRecord):
            content[name] = viewed_record(record, shared)
        elif isinstance(record, (MetricRecord, ConfigRecord)):
            content[name] = record_copy(record)  # (Flower's class, as the wire's copy would be)
        else:
            raise TypeError(f"unsupported record {name!r} of type {type(record).__name__}")
    received = Message(content, msg.metadata.dst_node_id, msg.metadata.message_type,
                       ttl=msg.metadata.ttl, group_id=msg.metadata.group_id)
    received.metadata.__dict__.update(vars(msg.metadata))
    return received


def reply_or_error(client_app: ClientApp, msg: Message, context: Context) -> Message:
    """``client_app``'s reply to ``msg``, or the error reply Flower would send for it.

    - an exception: ``CLIENT_APP_RAISED_EXCEPTION``, ``"<class 'E'>:<'message'>"``
      and the traceback;
    - ``SystemExit`` (``sys.exit()``): ``CLIENT_APP_CRASHED``, "ClientApp
      stopped responding. It raised <class 'SystemExit'>:<'code'> (sys.exit)"
      and the traceback;
    - a return that is not a ``Message`` replying to ``msg``:
      ``CLIENT_APP_CRASHED``, "ClientApp stopped responding. It returned ...".

    ``KeyboardInterrupt`` is raised. ``msg`` is the node's own copy.
    """
    try:
        reply = client_app(msg, context)
    except KeyboardInterrupt:
        raise
    except SystemExit as err:
        reason = f"{CRASHED} It raised {type(err)}:<'{err}'> (sys.exit)\n{traceback.format_exc()}"
        return error_reply(msg, CLIENT_APP_CRASHED, reason)
    except BaseException as err:  # noqa: BLE001 - as Flower's runtime: reported, not raised
        reason = f"{type(err)}:<'{err}'>\n{traceback.format_exc()}"
        return error_reply(msg, CLIENT_APP_RAISED_EXCEPTION, reason)
    if not isinstance(reply, Message):
        return error_reply(msg, CLIENT_APP_CRASHED,
                           f"{CRASHED} It returned {type(reply)}, not a reply Message.")
    if reply.metadata.reply_to_message_id != msg.metadata.message_id:
        return error_reply(msg, CLIENT_APP_CRASHED,
                           f"{CRASHED} It returned a Message that is not a reply to its message "
                           f"(reply_to_message_id {reply.metadata.reply_to_message_id!r}; "
                           "build it with Message(content, reply_to=message)).")
    return reply


def round_of(msg: Message) -> int | None:
    """The server round of ``msg``; ``None`` when it does not say.

    A config record's ``server-round`` (Flower's Message-API strategies set
    it) when it is an int >= 0, else the group id when it is a number (the
    legacy API's strategies send ``str(server_round)``, and no round in their
    config unless the app adds one).
    """
    for record in msg.content.config_records.values():
        value = record.get("server-round")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    group = msg.metadata.group_id
    return int(group) if group.isascii() and group.isdigit() else None


def error_reply(msg: Message, code: int, reason: str) -> Message:
    """The error reply to ``msg`` with Flower's error ``code`` and ``reason``."""
    return Message(Error(code=code, reason=reason), reply_to=msg)


class CallsInTurn(Generic[T]):
    """``calls`` run one after another in a daemon thread, each with ``timeout`` seconds from its own start
    and in a copy of the caller's context (``contextvars``), as a thread of its own per call would run it.

    A thread per call cost 0.2-0.6 ms a call in its start and the two hand-overs of the GIL between it
    and the waiting caller (more with the client state files' writer thread running; benchmarks/README.md
    section 8). Here one thread runs the calls back to back, and the caller sleeps until the running
    call's deadline or the last call's end. A call past its deadline is abandoned: its thread finishes
    it, discards what it returns and ends, and the calls after it go on in a new thread.
    """

    def __init__(self, calls: Sequence[Callable[[], T]], timeout: float, name: Callable[[int], str]) -> None:
        self._calls, self._timeout, self._name = calls, timeout, name
        self._context = contextvars.copy_context()  # (the caller's: a new thread starts with an empty one)
        self._turn = threading.Condition()  # guards what follows
        self._next = 0  # the call running, or the next to run
        self._running = False  # whether call _next runs (from _started on): only a running call is abandoned
        self._started = 0.0  # when it started (time.monotonic)
        self._results: list[T | None] = [None] * len(calls)
        self._error: BaseException | None = None
        self._over = False  # every call done, or one raised, or the caller stopped waiting

    def run(self, on_abandoned: Callable[[int, threading.Thread], None]) -> list[T | None]:
        """Each call's result (``None`` for an abandoned call), or what the first call to raise raised
        (raised here; the calls after it do not run). ``on_abandoned(index, thread)`` is told of each
        abandoned call as it is abandoned; a Ctrl-C in the wait stops the calls not yet started."""
        with self._turn:
            if not self._calls:
                return []
            worker = self._start()
            try:
                while not self._over:
                    if not self._running:  # a new thread not yet in its first call: it says when it is
                        self._turn.wait()
                        continue
                    left = self._started + self._timeout - time.monotonic()
                    if left > 0:
                        self._turn.wait(left)
                        continue
                    abandoned, worker.abandoned = self._next, True  # (its thread sees it under this lock)
                    on_abandoned(abandoned, worker.thread)
                    self._next += 1
                    if self._next == len(self._calls):
                        break
                    worker = self._start()
            finally:
                self._over = True  # (a Ctrl-C: the thread starts no further call)
        if self._error is not None:
            raise self._error
        return self._results

    def _start(self) -> _Worker:
        """A new thread for the calls from ``_next`` on (called under the lock)."""
        worker, self._running = _Worker(), False
        worker.thread = threading.Thread(target=self._work, args=(worker,), name=self._name(self._next),
                                         daemon=True)
        worker.thread.start()
        return worker

    def _work(self, worker: _Worker) -> None:
        with self._turn:
            index = self._take(worker)
        while index is not None:
            try:
                result = self._context.copy().run(self._calls[index])
            except BaseException as err:  # noqa: BLE001 - raised by run(), in the caller's thread
                with self._turn:
                    if not worker.abandoned:
                        self._error, self._over = err, True
                        self._turn.notify()
                return
            with self._turn:
                if worker.abandoned:  # past its deadline: what it returned is discarded
                    return
                self._results[index], self._next = result, index + 1
                index = self._take(worker)  # (in the same turn: no moment without a running call)

    def _take(self, worker: _Worker) -> int | None:
        """The call ``worker`` runs next, running from now on, or ``None`` (called under the lock)."""
        if worker.abandoned or self._over:
            return None
        if self._next == len(self._calls):
            self._over = True
            self._turn.notify()
            return None
        if not self._running:  # (a thread's first call: the caller waits for it to start)
            self._running = True
            self._turn.notify()
        self._started = time.monotonic()
        return self._next


class _Worker:
    """One thread of :class:`CallsInTurn`, abandoned with the call it runs past that call's deadline."""

    thread: threading.Thread
    abandoned = False


__all__ = ["CLIENT_APP_CRASHED", "CLIENT_APP_RAISED_EXCEPTION", "CallsInTurn", "error_reply",
           "new_message_id", "received_copy", "reply_or_error", "round_of"]
