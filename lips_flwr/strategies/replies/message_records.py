"""Reading Message API replies: their records, once, and the signature replies vote on.

Flower's Message strategies stop the whole run (``InconsistentMessageReplies``
or a ``TypeError``) when one reply differs from the others in its record
names, its metric keys or a metric's type. The gate keeps the replies that
agree with most of the others (:func:`consistent`) and drops the rest with a
logged reason, for train and evaluate replies alike. Everything here reads
record names, metric values and ``.npy`` headers only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

from ..._npy import read_npy

_R = TypeVar("_R")
_V = TypeVar("_V")
DATA = attrgetter("data")


def records(msg: Message, kind: type[_R]) -> list[tuple[str, _R]]:
    """``(name, record)`` of the reply's records of one kind, in one pass over its content.

    (``RecordDict.array_records`` builds and type-checks a new mapping on every
    access: for 100 replies that was most of the checks' time.)
    """
    return [(name, record) for name, record in msg.content.items() if isinstance(record, kind)]


def split_records(items: list[tuple[str, Any]]) -> tuple[list[tuple[str, ArrayRecord]],
                                                          list[tuple[str, MetricRecord]]]:
    """The ArrayRecords and the MetricRecords among a reply's ``(name, record)`` items, in one pass.

    The same as :func:`records` of each kind; Flower's own record types are
    recognised by ``type(...) is`` (``isinstance`` of these abstract-base
    subclasses goes through ``ABCMeta``), any other by ``isinstance``.
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
    """The error replies and the ``kept`` ones, in the order ``replies`` came.

    LIPS does not reorder: the wrapped strategy sums in the order it would
    without LIPS, so ``tau0=0`` reproduces it bit for bit. (An app that wants
    the same bits in every run orders replies by content itself: the paper
    app's ``StableFedAvg``; node ids are new in every simulation run.)
    ``kept`` is drawn from ``replies``' non-error replies: when it holds as
    many as ``replies``, nothing was dropped and no reply is an error.
    """
    if len(kept) == len(replies):
        return list(replies)
    keep = {id(msg) for msg in kept}
    return [msg for msg in replies if msg.has_error() or id(msg) in keep]


def record_dict(record: Mapping[str, _V]) -> dict[str, _V]:
    """``dict(record.items())``, as one C copy when ``items()`` is a view of a dict (Flower's records)."""
    items = record.items()
    mapping = getattr(items, "mapping", None)  # a dict view's read-only proxy of its dict
    return mapping.copy() if type(mapping) is MappingProxyType else dict(items)


def record_bytes(record: ArrayRecord) -> tuple[list[str], list[Any]]:
    """The names and the serialized arrays (``Array.data``) of an ArrayRecord, in its order."""
    return list(record), list(map(DATA, record.values()))


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
    """The replies that share the most common signature, and why each other one differs.

    A tie never goes by arrival order (which an attacker may win): to the
    signature of the previous accepted round (``previous``), then to one with
    its arrays in the record the model was sent in (``array_key``), then to
    the one with the fewest records and metric keys (what is extra is odd),
    then to the least in sort order. ``signatures``: each reply's
    :func:`signature`, when already built (the gate's reads). Returns
    ``(kept, {index in replies: reason})``.
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


__all__ = [
    "consistent", "in_arrival_order", "metric_signature", "record_bytes", "record_dict", "records",
    "reply_views", "signature", "split_records",
]
