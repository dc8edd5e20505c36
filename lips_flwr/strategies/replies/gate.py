"""The reply gate both Flower APIs share: which replies the wrapped strategy aggregates, and a retry.

A round's train replies pass :meth:`ReplyGate.admit` (per reply its records,
its weight and its arrays' headers against the global model's; the Message
API's vote on records and metric keys; bad metric values out; the cast to the
global model's dtypes), then :meth:`ReplyGate.aggregate` (:mod:`.retry`). Each
API gives the gate a :class:`ReplyAccess` for its replies (:mod:`.message_access`,
:mod:`.legacy_access`) and its :class:`~..codecs.ModelCodec` for its models:
a fix to reply handling lands here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, MutableMapping
from logging import WARNING
from typing import Any, Generic, TypeVar

import numpy as np
from flwr.common import log

from ..codecs import ModelCodec
from .checks import MAX_METRIC, metric_ok, num_examples_problem, stand_in
from .dtypes import cast_array, round_dtypes
from .headers import HeaderCache, ModelHeaders, fast_reply_problem
from .retry import Aggregated, Retry

R = TypeVar("R")  # one reply in the API's type
Model = dict[str, np.ndarray]


class ReadReply:
    """What the gate reads of one reply, once: filled by a :class:`ReplyAccess`, checked by the gate."""

    __slots__ = ("datas", "dtypes", "in_order", "names", "reason", "reply", "signature", "weight",
                 "weight_key")

    def __init__(self, reply: Any, reason: str | None = None) -> None:
        self.reply, self.reason = reply, reason  # reason: a problem in the reply's structure, or None
        self.names: list[str] = []  # its arrays' names and .npy bytes, in its order
        self.datas: list = []
        self.in_order = False  # names: the global model's, in its order
        self.weight: object = None  # the value of weight_key (None: the wrapped strategy does not weight)
        self.weight_key: str | None = None
        self.signature: tuple = ()  # what it must share with the other replies (Message API)
        self.dtypes: Mapping[str, np.dtype] = {}  # its arrays' dtypes, set by the checks


class ReplyAccess(ABC, Generic[R]):
    """One API's replies of one round, as the gate sees them; ``candidates``: the replies to check
    (not the Message API's error replies: they pass on to the wrapped strategy untouched)."""

    candidates: list[R]

    @abstractmethod
    def sender(self, reply: R) -> str:
        """Who sent ``reply``, for the log."""

    @abstractmethod
    def read(self, reply: R, headers: ModelHeaders) -> ReadReply:
        """What the checks need of a train reply, read once."""

    @abstractmethod
    def read_metrics(self, reply: R) -> ReadReply:
        """What the checks need of an evaluate reply: its weight (and signature)."""

    def vote(self, reads: list[ReadReply], previous: tuple | None) -> dict[int, str]:
        """``{index: reason}`` of the replies whose records differ from most others' (Message API);
        ``previous``: the signature of the last round's accepted replies, for a tie."""
        return {}

    def stype_problem(self, reply: R) -> str | None:
        """Why an array's serialization is not numpy's (Message API ``Array.stype``), or ``None``."""
        return None

    @abstractmethod
    def metric_records(self, reply: R) -> list[MutableMapping[str, Any]]:
        """The reply's metrics, as mappings the gate may change (a bad value out)."""

    @abstractmethod
    def replace(self, read: ReadReply, index: int, array: np.ndarray) -> None:
        """Serialize ``array`` in place of the reply's ``index``-th array (and in ``read.datas``)."""

    @abstractmethod
    def snapshot(self, replies: list[R]) -> None:
        """Remember the replies as they are now: the wrapped strategy may consume or rebind them."""

    @abstractmethod
    def restore(self) -> None:
        """Put the replies back as :meth:`snapshot` found them."""

    @abstractmethod
    def views(self, reply: R) -> Model:
        """Read-only views of a reply's arrays."""

    def overflow_weight(self, reply: R) -> object:
        """What the wrapped strategy multiplies a reply's values by before it divides (legacy)."""
        return None

    @abstractmethod
    def aggregate(self, replies: list[R]) -> tuple[Any, Any]:
        """The wrapped strategy's aggregation of ``replies``: ``(aggregate or None, metrics)``."""

    def dropped(self, reply: R) -> None:
        """A reply left out of the round (legacy: it goes to the failures)."""

    @abstractmethod
    def client_reports(self, replies: list[R]) -> int:
        """How many replies carry ``lips-client-zeros`` (client mode: clients that masked)."""


class ReplyGate:
    """The checks, the dtype cast and the retry of one LIPS strategy, for both APIs; between rounds
    it keeps the headers (:class:`.headers.HeaderCache`) and the last accepted replies' signature."""

    def __init__(self, codec: ModelCodec) -> None:
        self.codec = codec
        self.headers = HeaderCache()
        self.accepted: dict[str, tuple] = {}  # "train"/"evaluate" -> the last accepted replies' signature

    # ------------------------------------------------------------ the global model
    def model_headers(self, previous: Any) -> ModelHeaders:
        """The headers of the round's global model ``previous``, read once per model."""
        return self.headers.of(previous, *self.codec.serialized(previous))

    def _current_headers(self, previous: Any) -> ModelHeaders | None:
        return None if previous is None else self.headers.cached(previous, *self.codec.serialized(previous))

    def previous_views(self, previous: Any) -> Model | None:
        """Read-only views of the round's global model (``None`` when there is none)."""
        if previous is None:
            return None
        headers = self._current_headers(previous)
        return self.codec.views(previous) if headers is None else headers.views

    def aggregate_views(self, aggregate: Any, previous: Any) -> Model:
        """Read-only views of an aggregate, in the global model's order: through the round's headers
        when it has the global model's names in its order (the usual case), else parsed."""
        headers = self._current_headers(previous)
        if headers is not None:
            names, datas = self.codec.serialized(aggregate)
            if names == headers.name_list:
                return dict(zip(names, headers.read_in_order(datas)))
        return self.codec.in_order(aggregate, [] if previous is None else self.codec.serialized(previous)[0])

    # --------------------------------------------------------------- admission
    def admit(self, access: ReplyAccess[R], previous: Any) -> list[R]:
        """The train replies the wrapped strategy may aggregate, their arrays cast to the round's
        dtypes (:mod:`.dtypes`); any other is logged and dropped."""
        headers = self.model_headers(previous)
        reads = []
        for reply in access.candidates:
            read = access.read(reply, headers)
            reason = read.reason or self._problem(access, read, headers)
            if reason is None:
                reads.append(read)
            else:
                self.drop(access, reply, reason)
        reads = self._voted(access, reads, "train")
        self._leave_out_bad_metrics(access, reads)
        chosen, mixed = round_dtypes([read.dtypes for read in reads], headers.dtype)
        if mixed:
            for read in reads:
                for index, name in enumerate(read.names):
                    if read.dtypes[name] != chosen[name]:
                        access.replace(read, index, cast_array(read.datas[index], chosen[name]))
        self.headers.remember(headers, chosen, dict(zip(reads[0].names, reads[0].datas)) if reads else None)
        return [read.reply for read in reads]

    def admit_evaluate(self, access: ReplyAccess[R]) -> list[R]:
        """The evaluate replies the wrapped strategy may aggregate (weights and keys checked)."""
        reads = []
        for reply in access.candidates:
            read = access.read_metrics(reply)
            reason = read.reason
            if reason is None and read.weight_key is not None:
                reason = num_examples_problem(read.weight, read.weight_key)
            if reason is None:
                reads.append(read)
            else:
                self.drop(access, reply, reason)
        reads = self._voted(access, reads, "evaluate")
        self._leave_out_bad_metrics(access, reads)
        return [read.reply for read in reads]

    def _problem(self, access: ReplyAccess[R], read: ReadReply, headers: ModelHeaders) -> str | None:
        """Why a reply cannot be aggregated into the global model: its weight, then its arrays' headers.

        Arrays with known headers in the global model's order (the usual case)
        pass in C loops (:meth:`ModelHeaders.dtypes_in_order`), their ``stype``
        unread: the wrapped strategy raises on bytes in another serialization,
        and :meth:`aggregate` then drops them.
        """
        if read.weight_key is not None:
            reason = num_examples_problem(read.weight, read.weight_key)
            if reason is not None:
                return reason
        known = headers.dtypes_in_order(read.datas) if read.in_order else None
        if known is not None:
            read.dtypes = known
            return None
        reason = access.stype_problem(read.reply)
        if reason is None:
            reason, read.dtypes = fast_reply_problem(headers, dict(zip(read.names, read.datas)))
        return reason

    def _voted(self, access: ReplyAccess[R], reads: list[ReadReply], kind: str) -> list[ReadReply]:
        odd = access.vote(reads, self.accepted.get(kind)) if len(reads) > 1 else {}
        for index, reason in odd.items():
            self.drop(access, reads[index].reply, reason)
        kept = [read for i, read in enumerate(reads) if i not in odd] if odd else reads
        if kept:
            self.accepted[kind] = kept[0].signature
        return kept

    def _leave_out_bad_metrics(self, access: ReplyAccess[R], reads: list[ReadReply]) -> None:
        """Leave NaN, Inf and values beyond ``MAX_METRIC`` out of the aggregated metrics, a WARNING each.

        A bad value becomes the weighted mean of the other replies' good values
        of its form for its key (:func:`.checks.stand_in`), so that a weighted
        mean of all replies is theirs; without any, the key goes from the
        replies with a bad value. The reply's arrays still count.
        """
        found = [(read, record) for read in reads for record in access.metric_records(read.reply)]
        bad: dict[str, list[tuple[ReadReply, MutableMapping[str, Any]]]] = {}
        for read, record in found:
            for key, value in record.items():
                if not metric_ok(value):
                    bad.setdefault(key, []).append((read, record))
        for key, spoilt in bad.items():
            for read, record in spoilt:
                log(WARNING, "LIPS: leaving the metric %r of %s (%r) out of the aggregate: not a finite "
                    "number within +-%.3g", key, access.sender(read.reply), record[key], MAX_METRIC)
            left_out = {id(record) for _, record in spoilt}
            good = [(record[key], _weight(read.weight)) for read, record in found
                    if key in record and id(record) not in left_out]
            for _, record in spoilt:
                value = stand_in(record[key], good)
                if value is None:
                    record.pop(key, None)
                else:
                    record[key] = value

    def drop(self, access: ReplyAccess[R], reply: R, reason: str) -> None:
        """Leave ``reply`` out: one line, the same in both APIs (tests and users grep it)."""
        log(WARNING, "LIPS: ignoring reply from %s: %s", access.sender(reply), reason)
        access.dropped(reply)

    # --------------------------------------------------------------- aggregation
    def aggregate(self, access: ReplyAccess[R], replies: list[R], chain: list, server_round: int,
                  previous: Any) -> Aggregated:
        """The wrapped strategy's aggregate of ``replies``, finite with the chain's state, or nothing
        (:mod:`.retry` says how)."""
        return Retry(self, access, chain, server_round, previous).aggregate(replies)


def _weight(weight: object) -> float:
    """A reply's weight in a mean of its metrics: its example count when it is a number, else 1."""
    return float(weight) if isinstance(weight, (int, float)) and not isinstance(weight, bool) else 1.0


__all__ = ["Aggregated", "ReadReply", "ReplyAccess", "ReplyGate"]
