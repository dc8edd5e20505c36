"""Which Message API replies the wrapped strategy may aggregate, read from their headers.

Flower's Message strategies stop the whole run (``InconsistentMessageReplies``
or a ``TypeError``) when one reply differs from the others in its record
names, its metric keys or a metric's type. LIPS keeps the replies that agree
with most of the others and drops the rest with a logged reason, for train
and evaluate replies alike. Everything here reads record names, metric
values and ``.npy`` headers only: on a good round it costs no pass over the
arrays (the NaN/Inf check runs on the aggregate, in :mod:`._adapter`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord

from .._npy import read_npy
from ._reply_checks import (
    MISSING,
    ModelHeaders,
    culprit_among,
    fast_reply_problem,
    num_examples_problem,
    round_dtypes,
    serialization_problem,
)

_R = TypeVar("_R")
_V = TypeVar("_V")
_DATA, _STYPE = attrgetter("data"), attrgetter("stype")


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
    return list(record), list(map(_DATA, record.values()))


class TrainReply:
    """What the checks read from one train reply, once: everything later steps need from it.

    ``reason``: why it cannot be aggregated, or ``None``; ``content`` and
    ``items``: its RecordDict and that dict's ``(name, record)`` pairs as
    they came. When ``reason`` is ``None``: ``record``, its one ArrayRecord,
    and ``arrays``, that record's ``name -> Array``; ``dtypes``, its arrays'
    dtypes; ``signature``, what it must share with the other replies
    (:func:`consistent`).
    """

    __slots__ = ("arrays", "content", "dtypes", "items", "reason", "record", "signature")

    def __init__(self, reason: str | None, content: Any, items: list[tuple[str, Any]]) -> None:
        self.reason, self.content, self.items = reason, content, items
        self.record: ArrayRecord | None = None
        self.arrays: dict[str, Array] = {}
        self.dtypes: Mapping[str, np.dtype] = {}
        self.signature: tuple = ((), ())


def train_problem(msg: Message, headers: ModelHeaders, weight_key: str | None) -> TrainReply:
    """Why a train reply cannot be aggregated into the global model (``.reason``), and what was read.

    One numpy-serialized ArrayRecord whose names and shapes match the global
    model and whose arrays are real numbers; when the wrapped strategy weights
    by a metric, one MetricRecord with a positive, finite scalar for it.
    Headers only (:func:`._reply_checks.fast_reply_problem`); one pass over
    the reply's records, and over its arrays' attributes, in C loops when its
    arrays have known headers (:meth:`ModelHeaders.dtypes_in_order`).
    On that path the arrays' ``stype`` is left to :func:`serialization_culprits`.
    The reply's consistency signature (:func:`signature`) is built here too.
    """
    content = msg.content
    items = list(content.items())
    found, metrics = split_records(items)
    if len(found) != 1:
        return TrainReply(f"expected one ArrayRecord, got {len(found)}", content, items)
    record_name, record = found[0]
    arrays = record_dict(record)
    metric_dicts = [(name, record_dict(metric)) for name, metric in metrics]  # read once; C lookups after
    if weight_key is not None:
        reason = _weight(metric_dicts, weight_key)[0]
        if reason is not None:
            return TrainReply(reason, content, items)
    datas = list(map(_DATA, arrays.values()))
    in_order = list(arrays) == headers.name_list
    # Not read on these two paths: each Array's ``stype`` (one more object per array to
    # reach). Bytes with the expected header and another stype make the wrapped strategy's
    # ``Array.numpy()`` raise; the adapter then drops them (:func:`serialization_culprits`).
    known = headers.dtypes_in_order(datas) if in_order else None  # the usual case
    if known is not None:
        dtypes: Mapping[str, np.dtype] = known
        names = headers.sorted_names
    else:  # the example count is checked above
        reason = serialization_problem(dict(zip(arrays, map(_STYPE, arrays.values()))))
        if reason is not None:
            return TrainReply(reason, content, items)
        reason, dtypes = fast_reply_problem(headers, dict(zip(arrays, datas)))
        if reason is not None:
            return TrainReply(reason, content, items)
        names = tuple(sorted(arrays))
    checked = TrainReply(None, content, items)
    checked.record, checked.arrays, checked.dtypes = record, arrays, dtypes
    checked.signature = (((record_name, names),), _metric_part(metric_dicts))
    return checked


def evaluate_problem(msg: Message, weight_key: str | None) -> str | None:
    """Why an evaluate reply cannot be aggregated, or ``None``: its weight, as for train replies."""
    return None if weight_key is None else _weight(split_records(list(msg.content.items()))[1], weight_key)[0]


def _weight(metrics: Sequence[tuple[str, Mapping[str, Any]]], weight_key: str) -> tuple[str | None, object]:
    if len(metrics) != 1:
        return f"expected one MetricRecord, got {len(metrics)}", None
    value = metrics[0][1].get(weight_key, MISSING)
    return num_examples_problem(value, weight_key), value


def signature(msg: Message, arrays: bool) -> tuple:
    """What replies must share to be aggregated together: record names, array names, metric kinds."""
    found, metrics = split_records(list(msg.content.items()))
    array_part: tuple = ()
    if arrays:
        array_part = tuple((name, tuple(sorted(record.keys()))) for name, record in found)
    return array_part, _metric_part(metrics)


def _metric_part(metrics: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple:
    """Per MetricRecord, its name and sorted ``(key, kind)`` pairs (``kind``: scalar, or a list's length)."""
    return tuple(
        (name, tuple(sorted([(key, ("list", len(value)) if isinstance(value, list) else "scalar")
                             for key, value in record.items()])))
        for name, record in metrics
    )


def consistent(
    replies: list[Message], arrays: bool, signatures: list[tuple] | None = None
) -> tuple[list[Message], dict[int, str]]:
    """The replies that share the most common signature, and why each other one differs.

    Ties go to the signature of the first reply that has one of the tied
    signatures (replies in arrival order). ``signatures``: each reply's
    :func:`signature`, when already built (:func:`train_problem`). Returns
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
    chosen = next(sig for sig in signatures if counts[sig] == best)
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


def reply_views(msg: Message) -> dict[str, np.ndarray]:
    """Read-only views of a train reply's arrays (headers parsed once, no copy)."""
    return {n: read_npy(a.data) for n, a in records(msg, ArrayRecord)[0][1].items()}


def cast_replies(
    replies: list[Message], dtypes: list[Mapping[str, np.dtype]], previous: Mapping[str, np.dtype]
) -> tuple[set[int], Mapping[str, np.dtype]]:
    """Re-serialize, in place, every array in another dtype than most replies'.

    Returns the ``id`` of each reply cast and the dtypes chosen.
    ``dtypes`` holds each reply's dtypes (from :func:`train_problem`).
    Flower's aggregation accumulates into the first reply's dtype: a float16
    or integer reply listed first would otherwise narrow the whole aggregate
    (see :func:`._reply_checks.common_dtypes`). On a good round nothing is cast.
    """
    chosen, mixed = round_dtypes(dtypes, previous)
    if not mixed:
        return set(), chosen
    cast = set()
    for msg, found in zip(replies, dtypes):
        odd = [name for name, dtype in found.items() if dtype != chosen[name]]
        if not odd:
            continue
        record = records(msg, ArrayRecord)[0][1]
        for name in odd:
            data = read_npy(record[name].data)
            # astype(order="C"), not ascontiguousarray: that makes a 0-d buffer 1-d
            record[name] = Array(data.astype(chosen[name], order="C"))
        cast.add(id(msg))
    return cast, chosen


def serialization_culprits(replies: list[Message]) -> list[tuple[int, str]]:
    """``(index, reason)`` of each reply with an array in another serialization than numpy's.

    Asked only when the wrapped strategy raised on replies that passed
    :func:`train_problem` (which does not read ``stype`` on its fast path).
    """
    found = []
    for index, msg in enumerate(replies):
        for _, record in records(msg, ArrayRecord):
            reason = serialization_problem({name: array.stype for name, array in record.items()})
            if reason is not None:
                found.append((index, reason))
                break
    return found


def nonfinite_culprit(replies: list[Message]) -> tuple[int, str] | None:
    """The reply that made an aggregate non-finite, as ``(index, reason)``, or ``None``.

    Only called when the aggregate is not finite (this reads every array):
    see :func:`culprit_among`.
    """
    return culprit_among([reply_views(msg) for msg in replies])
