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
in time and leaves the other nodes out. :class:`ThreadCall` runs one call in
a thread of its own, so that the Grid can stop waiting for it; the call goes
on, and its reply, when it comes, is discarded.

:func:`nodes_awaited` tells the Grid when a strategy asks for its nodes in
order to wait until ``min_available_nodes`` are connected (Flower's
strategies ask again each second, without end): the batched Grid's nodes
never change, so a wait for more than it has would never end.

:func:`round_of` says which server round a message belongs to, for the seed
of the call that answers it and for the runner's observations alike.
"""

from __future__ import annotations

import contextvars
import threading
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Generic, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lips_flwr.experiments.batched.arrays import viewed_record

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


def received_copy(msg: Message) -> Message:
    """``msg`` as a node receives it: the same metadata, its own records.

    Flower sends every node the same ``RecordDict`` object; over the wire each
    client gets a copy, so a mod that edits its message in place (FedBN swaps
    arrays) must not reach the other clients' messages. Each client gets its
    own Array objects, shallow copies over the same (immutable) bytes that
    read faster (:func:`.arrays.viewed_record`).
    """
    content = RecordDict()
    for name, record in msg.content.items():
        if isinstance(record, ArrayRecord):
            content[name] = viewed_record(record)
        elif isinstance(record, MetricRecord):
            content[name] = MetricRecord(dict(record.items()))
        elif isinstance(record, ConfigRecord):
            content[name] = ConfigRecord(dict(record.items()))
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


class ThreadCall(Generic[T]):
    """``fn()`` running in a daemon thread of its own, in a copy of the caller's context
    (``contextvars``), which the caller may stop waiting for.

    Started on construction. :meth:`wait` waits up to ``timeout`` seconds
    (a Ctrl-C interrupts it); :meth:`outcome` is ``fn``'s result, or raises
    what ``fn`` raised.
    """

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._result: T | None = None
        self._error: BaseException | None = None
        # In the caller's context, as asyncio.to_thread runs a call: a thread starts with an empty
        # one, and the call would lose what the caller set (the engine of training.computing_with).
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._run,), name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as err:  # noqa: BLE001 - raised by outcome(), in the caller's thread
            self._error = err

    def wait(self, timeout: float | None) -> bool:
        """Whether ``fn`` has returned (or raised) within ``timeout`` seconds (``None``: no limit)."""
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def outcome(self) -> T:
        """``fn``'s result, or what it raised (raised here); only once :meth:`wait` returned True."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


__all__ = ["CLIENT_APP_CRASHED", "CLIENT_APP_RAISED_EXCEPTION", "ThreadCall", "error_reply", "received_copy",
           "reply_or_error", "round_of"]
