"""The gate's access to Message API replies: their records read once, their snapshot, their vote.

A train reply must hold one numpy-serialized ArrayRecord whose names and
shapes match the global model and whose arrays are real numbers; when the
wrapped strategy weights by a metric (FedAvg's ``weighted_by_key``), one
MetricRecord with a positive, finite scalar for it. Error replies are not
checked: they pass on to the wrapped strategy, which counts them as failures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from ...protocol import KEY_CLIENT_ZEROS
from .checks import MISSING, serialization_problem
from .gate import ReadReply, ReplyAccess
from .headers import ModelHeaders
from .message_records import (
    DATA,
    consistent,
    in_arrival_order,
    metric_signature,
    record_dict,
    records,
    reply_views,
    split_records,
)

_STYPE = attrgetter("stype")
InnerAggregate = Callable[[int, list[Message]], tuple[Any, Any]]


class MessageRead(ReadReply):
    """:class:`.gate.ReadReply` of a Message: its RecordDict (``content``) and that dict's
    ``(name, record)`` ``items`` as they came; its one ArrayRecord (``record``) and that
    record's ``name -> Array`` (``arrays``), when it has one."""

    __slots__ = ("arrays", "content", "items", "record")

    def __init__(self, msg: Message, content: Any, items: list[tuple[str, Any]]) -> None:
        super().__init__(msg)
        self.content, self.items = content, items
        self.record: ArrayRecord | None = None
        self.arrays: dict[str, Array] = {}


def read_train_reply(msg: Message, headers: ModelHeaders, weight_key: str | None) -> MessageRead:
    """What the gate checks of a train reply, in one pass over its records; its signature too.

    The signature (what it must share with the other replies: its record
    names, array names and metric kinds) shares the global model's sorted
    names when the reply's arrays come in its order.
    """
    content = msg.content
    items = list(content.items())
    read = MessageRead(msg, content, items)
    found, metrics = split_records(items)
    if len(found) != 1:
        read.reason = f"expected one ArrayRecord, got {len(found)}"
        return read
    record_name, read.record = found[0]
    arrays = read.arrays = record_dict(read.record)
    metric_dicts = [(name, record_dict(metric)) for name, metric in metrics]  # read once; C lookups after
    if weight_key is not None:
        _weigh(read, metric_dicts, weight_key)
    read.names, read.datas = list(arrays), list(map(DATA, arrays.values()))
    read.in_order = read.names == headers.name_list
    names = headers.sorted_names if read.in_order else tuple(sorted(arrays))
    read.signature = (((record_name, names),), metric_signature(metric_dicts))
    return read


def _weigh(read: ReadReply, metrics: Sequence[tuple[str, Mapping[str, Any]]], weight_key: str) -> None:
    """The reply's weight: the value of ``weight_key`` in its one MetricRecord."""
    if len(metrics) != 1:
        read.reason = read.reason or f"expected one MetricRecord, got {len(metrics)}"
    else:
        read.weight, read.weight_key = metrics[0][1].get(weight_key, MISSING), weight_key


class MessageReplies(ReplyAccess[Message]):
    """One round's Message replies for the gate; ``inner`` is the wrapped strategy's aggregation.

    The replies reach ``inner`` in the order they came, error replies
    included, as they would without LIPS (``tau0=0`` reproduces it bit for bit).
    """

    def __init__(self, replies: list[Message], server_round: int, weight_key: str | None,
                 inner: InnerAggregate | None = None, array_key: str | None = None) -> None:
        self.replies, self._array_key = replies, array_key
        self.candidates = [msg for msg in replies if not msg.has_error()]
        self._round, self._weight_key, self._inner = server_round, weight_key, inner
        self._reads: dict[int, MessageRead] = {}
        self._contents: list[tuple[ArrayRecord, dict]] = []  # each ArrayRecord with its arrays then
        self._bindings: list[tuple[Any, list]] = []  # each RecordDict with its records then

    def sender(self, reply: Message) -> str:
        return f"node {reply.metadata.src_node_id}"

    def read(self, reply: Message, headers: ModelHeaders) -> ReadReply:
        read = self._reads[id(reply)] = read_train_reply(reply, headers, self._weight_key)
        return read

    def read_metrics(self, reply: Message) -> ReadReply:
        content = reply.content
        items = list(content.items())
        read = MessageRead(reply, content, items)
        metrics = split_records(items)[1]
        if self._weight_key is not None:
            _weigh(read, metrics, self._weight_key)
        read.signature = ((), metric_signature(metrics))
        return read

    def vote(self, reads: list[ReadReply], previous: tuple | None) -> dict[int, str]:
        return consistent([read.reply for read in reads], True, [read.signature for read in reads],
                          previous, self._array_key)[1]

    def stype_problem(self, reply: Message) -> str | None:
        for _, record in records(reply, ArrayRecord):
            reason = serialization_problem(dict(zip(record, map(_STYPE, record.values()))))
            if reason is not None:
                return reason
        return None

    def metric_records(self, reply: Message) -> list[Any]:
        return [record for _, record in records(reply, MetricRecord)]

    def replace(self, read: ReadReply, index: int, array: np.ndarray) -> None:
        assert isinstance(read, MessageRead) and read.record is not None
        name, new = read.names[index], Array(array)
        read.record[name] = read.arrays[name] = new
        read.datas[index] = new.data

    def snapshot(self, replies: list[Message]) -> None:
        # Some strategies consume the replies (FedMedian pops their arrays), DP wrappers rebind
        # a reply's records (content[name] = clipped): keep the arrays and the bindings.
        self._contents, self._bindings = [], []
        for msg in replies:
            read = self._reads.get(id(msg))
            if read is None or read.record is None:  # not checked (no global model yet): read it here
                content = msg.content
                items = list(content.items())
                self._contents += [(record, record_dict(record)) for _, record in split_records(items)[0]]
            else:
                content, items = read.content, read.items
                self._contents.append((read.record, read.arrays))
            self._bindings.append((content, items))

    def restore(self) -> None:
        for content, items in self._bindings:
            for name, record in items:
                if content.get(name) is not record:
                    content[name] = record
        for record, arrays in self._contents:
            record.clear()
            record.update(arrays)

    def views(self, reply: Message) -> dict[str, np.ndarray]:
        return reply_views(reply)

    def aggregate(self, replies: list[Message]) -> tuple[Any, Any]:
        assert self._inner is not None
        return self._inner(self._round, in_arrival_order(self.replies, replies))

    def client_reports(self, replies: list[Message]) -> int:
        return sum(any(KEY_CLIENT_ZEROS in m for _, m in records(msg, MetricRecord))
                   for msg in replies if not msg.has_error())


__all__ = ["MessageRead", "MessageReplies", "read_train_reply"]
