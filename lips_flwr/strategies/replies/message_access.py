"""The gate's access to Message API replies: their records read once, their vote, their snapshot.

A train reply must hold one numpy-serialized ArrayRecord whose names and
shapes match the global model and whose arrays are real numbers; when the
wrapped strategy weights by a metric (FedAvg's ``weighted_by_key``), one
MetricRecord with a positive, finite scalar for it. Flower's Message
strategies stop the whole run (``InconsistentMessageReplies`` or a
``TypeError``) when one reply differs from the others in its record names,
metric keys or a metric's type: the replies that agree with most others are
kept (:func:`consistent`), the rest dropped with a logged reason, train and
evaluate replies alike. Error replies are not checked: they pass on to the
wrapped strategy, which counts them as failures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord

from ..._npy import read_npy
from ..._records import record_dict
from ...protocol import KEY_CLIENT_ZEROS
from .checks import MISSING, serialization_problem
from .gate import ReadReply, ReplyAccess
from .headers import ModelHeaders

_R = TypeVar("_R")
DATA, _STYPE = attrgetter("data"), attrgetter("stype")
InnerAggregate = Callable[[int, list[Message]], tuple[Any, Any]]


def records(msg: Message, kind: type[_R]) -> list[tuple[str, _R]]:
    """``(name, record)`` of the reply's records of one kind, in one pass over its content
    (``RecordDict.array_records`` builds and type-checks a new mapping on every access)."""
    return [(name, record) for name, record in msg.content.items() if isinstance(record, kind)]


def split_records(items: list[tuple[str, Any]]) -> tuple[list[tuple[str, ArrayRecord]],
                                                          list[tuple[str, MetricRecord]]]:
    """:func:`records` of both kinds among a reply's ``(name, record)`` items, in one pass.

    Flower's own record types are recognised by ``type(...) is`` (``isinstance``
    of these abstract-base subclasses goes through ``ABCMeta``), others by ``isinstance``.
    """
    arrays, metrics = [], []
    for item in items:
        record = item[1]
        kind = type(record)
        if kind is ArrayRecord:
            arrays.append(item)
        elif kind is MetricRecord:
            metrics.append(item)
        elif kind is not ConfigRecord:
            if isinstance(record, ArrayRecord):
                arrays.append(item)
            if isinstance(record, MetricRecord):
                metrics.append(item)
    return arrays, metrics


def in_arrival_order(replies: list[Message], kept: list[Message]) -> list[Message]:
    """The error replies and the ``kept`` ones (drawn from the others), in the order ``replies`` came.

    LIPS does not reorder: the wrapped strategy sums in the order it would
    without LIPS, so ``tau0=0`` reproduces it bit for bit (an app that wants
    the same bits in every run orders replies by content: the paper app's
    ``StableFedAvg``).
    """
    if len(kept) == len(replies):
        return list(replies)
    keep = {id(msg) for msg in kept}
    return [msg for msg in replies if msg.has_error() or id(msg) in keep]


def reply_views(msg: Message) -> dict[str, np.ndarray]:
    """Read-only views of a train reply's arrays (headers parsed once, no copy)."""
    return {n: read_npy(a.data) for n, a in records(msg, ArrayRecord)[0][1].items()}


def signature(msg: Message, arrays: bool) -> tuple:
    """What replies must share to be aggregated together: record names, array names, metric kinds."""
    found, metrics = split_records(list(msg.content.items()))
    array_part: tuple = ()
    if arrays:
        array_part = tuple((name, tuple(sorted(record.keys()))) for name, record in found)
    return array_part, metric_signature(metrics)


def metric_signature(metrics: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple:
    """Per MetricRecord, its name and sorted ``(key, kind)`` pairs (``kind``: scalar, or a list's length)."""
    return tuple(
        (name, tuple(sorted([(key, ("list", len(value)) if isinstance(value, list) else "scalar")
                             for key, value in record.items()])))
        for name, record in metrics
    )


def consistent(
    replies: list[Message], arrays: bool, signatures: list[tuple] | None = None,
    previous: tuple | None = None, array_key: str | None = None,
) -> tuple[list[Message], dict[int, str]]:
    """``(kept, {index in replies: reason})``: the replies that share the most common signature
    (``signatures``: each reply's :func:`signature`, when built), and why each other one differs.

    A tie never goes by arrival order (which an attacker may win): to the
    previous accepted round's signature (``previous``), then to one with its
    arrays in the record the model was sent in (``array_key``), then to the
    fewest records and metric keys (what is extra is odd), then to sort order.
    """
    if len(replies) < 2:
        return replies, {}
    if signatures is None:
        signatures = [signature(msg, arrays) for msg in replies]
    first = signatures[0]
    if signatures.count(first) == len(signatures):  # a good round: one signature
        return replies, {}
    counts = Counter(signatures)
    best = max(counts.values())

    def rank(sig: tuple) -> tuple:
        names_kept = [name for name, _ in sig[0]]
        size = len(sig[0]) + sum(1 + len(keys) for _, keys in sig[1])
        return sig != previous, array_key is not None and names_kept != [array_key], size, repr(sig)

    chosen = min((sig for sig, count in counts.items() if count == best), key=rank)
    kept, reasons = [], {}
    for i, (msg, sig) in enumerate(zip(replies, signatures)):
        if sig == chosen:
            kept.append(msg)
        else:
            reasons[i] = "records or metric keys differ from the other replies' " + _difference(sig, chosen)
    return kept, reasons


def _difference(sig: tuple, chosen: tuple) -> str:
    (arrays, metrics), (want_arrays, want_metrics) = sig, chosen
    if arrays != want_arrays:
        return f"(ArrayRecords {[n for n, _ in arrays]} with other names than {[n for n, _ in want_arrays]})"
    got = {name: dict(keys) for name, keys in metrics}
    want = {name: dict(keys) for name, keys in want_metrics}
    if set(got) != set(want):
        return f"(MetricRecords {sorted(got)}, expected {sorted(want)})"
    for name in want:
        extra = sorted(set(got[name]) - set(want[name]))
        missing = sorted(set(want[name]) - set(got[name]))
        other = sorted(k for k in set(got[name]) & set(want[name]) if got[name][k] != want[name][k])
        if extra or missing or other:
            return f"(metric keys: extra {extra}, missing {missing}, other type {other})"
    return ""


class MessageRead(ReadReply):
    """:class:`.gate.ReadReply` of a Message: its RecordDict (``content``) and its ``(name, record)``
    ``items`` as they came; its one ArrayRecord (``record``) and its ``name -> Array`` (``arrays``)."""

    __slots__ = ("arrays", "content", "items", "record")

    def __init__(self, msg: Message, content: Any, items: list[tuple[str, Any]]) -> None:
        super().__init__(msg)
        self.content, self.items = content, items
        self.record: ArrayRecord | None = None
        self.arrays: dict[str, Array] = {}


def read_train_reply(msg: Message, headers: ModelHeaders, weight_key: str | None) -> MessageRead:
    """What the gate checks of a train reply, in one pass over its records, with its signature
    (which shares the global model's sorted names when the arrays come in its order)."""
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
    """One round's Message replies for the gate; ``inner``, the wrapped strategy's aggregation, gets
    them in the order they came, error replies included (:func:`in_arrival_order`)."""

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


__all__ = [
    "MessageRead", "MessageReplies", "consistent", "in_arrival_order", "metric_signature", "read_train_reply",
    "record_dict", "records", "reply_views", "signature", "split_records",
]
