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
from collections.abc import Mapping
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord

from .._npy import read_npy
from ._reply_checks import (
    MISSING,
    ModelHeaders,
    common_dtypes,
    culprit_among,
    fast_reply_problem,
    num_examples_problem,
    serialization_problem,
)

_R = TypeVar("_R")


def records(msg: Message, kind: type[_R]) -> list[tuple[str, _R]]:
    """``(name, record)`` of the reply's records of one kind, in one pass over its content.

    (``RecordDict.array_records`` builds and type-checks a new mapping on every
    access: for 100 replies that was most of the checks' time.)
    """
    return [(name, record) for name, record in msg.content.items() if isinstance(record, kind)]


def in_arrival_order(replies: list[Message], kept: list[Message]) -> list[Message]:
    """The error replies and the ``kept`` ones, in the order ``replies`` came.

    LIPS does not reorder: the wrapped strategy sums in the order it would
    without LIPS, so ``tau0=0`` reproduces it bit for bit. (An app that wants
    the same bits in every run orders replies by content itself: the paper
    app's ``StableFedAvg``; node ids are new in every simulation run.)
    """
    keep = {id(msg) for msg in kept}
    return [msg for msg in replies if msg.has_error() or id(msg) in keep]


def train_problem(
    msg: Message, headers: ModelHeaders, weight_key: str | None
) -> tuple[str | None, Mapping[str, np.dtype], dict[str, Array]]:
    """Why a train reply cannot be aggregated into the global model, or ``None``; its dtypes and arrays.

    One numpy-serialized ArrayRecord whose names and shapes match the global
    model and whose arrays are real numbers; when the wrapped strategy weights
    by a metric, one MetricRecord with a positive, finite scalar for it.
    Headers only (:func:`._reply_checks.fast_reply_problem`).
    """
    found = records(msg, ArrayRecord)
    if len(found) != 1:
        return f"expected one ArrayRecord, got {len(found)}", {}, {}
    arrays = dict(found[0][1].items())
    reason = serialization_problem({n: a.stype for n, a in arrays.items()})
    if reason is not None:
        return reason, {}, arrays
    num_examples: object = None
    if weight_key is not None:
        reason, num_examples = _weight(msg, weight_key)
        if reason is not None:
            return reason, {}, arrays
    tensors = {n: a.data for n, a in arrays.items()}
    reason, dtypes = fast_reply_problem(headers, tensors, num_examples, weight_key or "num-examples")
    return reason, dtypes, arrays


def evaluate_problem(msg: Message, weight_key: str | None) -> str | None:
    """Why an evaluate reply cannot be aggregated, or ``None``: its weight, as for train replies."""
    return None if weight_key is None else _weight(msg, weight_key)[0]


def _weight(msg: Message, weight_key: str) -> tuple[str | None, object]:
    metrics = records(msg, MetricRecord)
    if len(metrics) != 1:
        return f"expected one MetricRecord, got {len(metrics)}", None
    value = metrics[0][1].get(weight_key, MISSING)
    return num_examples_problem(value, weight_key), value


def _signature(msg: Message, arrays: bool) -> tuple:
    """What replies must share to be aggregated together: record names, array names, metric kinds."""
    array_part: tuple = ()
    if arrays:
        array_part = tuple((name, tuple(sorted(record.keys()))) for name, record in records(msg, ArrayRecord))
    metric_part = tuple(
        (name, tuple(sorted((key, _kind(value)) for key, value in record.items())))
        for name, record in records(msg, MetricRecord)
    )
    return array_part, metric_part


def _kind(value: object) -> object:
    return ("list", len(value)) if isinstance(value, list) else "scalar"


def consistent(replies: list[Message], arrays: bool) -> tuple[list[Message], dict[int, str]]:
    """The replies that share the most common signature, and why each other one differs.

    Ties go to the signature of the first reply that has one of the tied
    signatures (replies in arrival order). Returns ``(kept, {index in replies: reason})``.
    """
    if len(replies) < 2:
        return replies, {}
    signatures = [_signature(msg, arrays) for msg in replies]
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
) -> set[int]:
    """Re-serialize, in place, every array in another dtype than most replies'; ``id`` of each reply cast.

    ``dtypes`` holds each reply's dtypes (from :func:`train_problem`).
    Flower's aggregation accumulates into the first reply's dtype: a float16
    or integer reply listed first would otherwise narrow the whole aggregate
    (see :func:`._reply_checks.common_dtypes`). On a good round nothing is cast.
    """
    chosen = common_dtypes(dtypes, previous)
    cast = set()
    for msg, found in zip(replies, dtypes):
        odd = [name for name, dtype in found.items() if dtype != chosen[name]]
        if not odd:
            continue
        record = records(msg, ArrayRecord)[0][1]
        for name in odd:
            data = read_npy(record[name].data)
            record[name] = Array(np.ascontiguousarray(data.astype(chosen[name])))
        cast.add(id(msg))
    return cast


def nonfinite_culprit(replies: list[Message]) -> tuple[int, str] | None:
    """The reply that made an aggregate non-finite, as ``(index, reason)``, or ``None``.

    Only called when the aggregate is not finite (this reads every array):
    see :func:`culprit_among`.
    """
    return culprit_among([reply_views(msg) for msg in replies])
