"""The reply gate both Flower APIs share: which replies the wrapped strategy aggregates, and a retry.

One round's train replies pass through :meth:`ReplyGate.admit` (per reply:
its records, its weight, its arrays' headers against the global model's; then
the Message API's vote on records and metric keys, and the cast to the
global model's dtypes) and :meth:`ReplyGate.aggregate` (the wrapped strategy's aggregation,
its aggregate checked for NaN/Inf in one pass, and on a bad aggregate the
culprit's search, its drop and a retry from the chain's state as it was).
Each API gives the gate a :class:`ReplyAccess` for its replies
(:mod:`.message_access`, :mod:`.legacy_access`) and a :class:`ModelCodec`
for its models (the adapter); a fix to reply handling lands here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from logging import ERROR, WARNING
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
from flwr.common import log

from ...core.checks import nonfinite_arrays
from .checks import culprit_among, num_examples_problem
from .dtypes import cast_array, round_dtypes
from .headers import HeaderCache, ModelHeaders, fast_reply_problem

R = TypeVar("R")  # one reply in the API's type
Model = dict[str, np.ndarray]


class ReadReply:
    """What the gate reads of one reply, once: filled by a :class:`ReplyAccess`, checked by the gate.

    ``reason``: a problem the access found in the reply's structure (``None``:
    none); ``names``/``datas``: its arrays' names and ``.npy`` bytes, in its
    order (``in_order``: the global model's); ``weight`` under ``weight_key``
    (``None``: the wrapped strategy does not weight); ``signature``: what it
    must share with the other replies (Message API); ``dtypes``: its arrays'
    dtypes, set by the checks.
    """

    __slots__ = ("datas", "dtypes", "in_order", "names", "reason", "reply", "signature", "weight",
                 "weight_key")

    def __init__(self, reply: Any, reason: str | None = None) -> None:
        self.reply, self.reason = reply, reason
        self.names: list[str] = []
        self.datas: list = []
        self.in_order = False
        self.weight: object = None
        self.weight_key: str | None = None
        self.signature: tuple = ()
        self.dtypes: Mapping[str, np.dtype] = {}


class ReplyAccess(ABC, Generic[R]):
    """One API's replies of one round, as the gate sees them.

    ``candidates``: the replies to check (the Message API's error replies are
    not among them: they pass on to the wrapped strategy untouched).
    """

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

    def vote(self, reads: list[ReadReply]) -> dict[int, str]:
        """``{index: reason}`` of the replies whose records differ from most others' (Message API)."""
        return {}

    def stype_problem(self, reply: R) -> str | None:
        """Why an array's serialization is not numpy's (Message API ``Array.stype``), or ``None``."""
        return None

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


class ModelCodec(Protocol):
    """How the gate reads a global model and an aggregate in the API's type (the adapter)."""

    def _serialized(self, model: Any) -> tuple[list[str], list[Any]]: ...
    def _views(self, model: Any) -> Model: ...
    def _parse_aggregate(self, aggregate: Any) -> Model: ...


class Aggregated(NamedTuple):
    """The wrapped strategy's aggregate as the gate let it through (all ``None``: none)."""

    aggregate: Any
    metrics: Any
    views: Model | None  # read-only, in the global model's order, finite


class ReplyGate:
    """The checks, the dtype cast and the retry of one LIPS strategy, for both APIs.

    It keeps, between rounds, the global model's headers and the headers
    replies sent in another dtype (:class:`.headers.HeaderCache`).
    """

    def __init__(self, models: ModelCodec) -> None:
        self.models = models
        self.headers = HeaderCache()

    # ------------------------------------------------------------ the global model
    def model_headers(self, previous: Any) -> ModelHeaders:
        """The headers of the round's global model ``previous``, read once per model."""
        return self.headers.of(previous, *self.models._serialized(previous))

    def _current_headers(self, previous: Any) -> ModelHeaders | None:
        return None if previous is None else self.headers.cached(previous, *self.models._serialized(previous))

    def previous_views(self, previous: Any) -> Model | None:
        """Read-only views of the round's global model (``None`` when there is none)."""
        if previous is None:
            return None
        headers = self._current_headers(previous)
        return self.models._views(previous) if headers is None else headers.views

    def aggregate_views(self, aggregate: Any, previous: Any) -> Model:
        """Read-only views of an aggregate, in the global model's order.

        An aggregate with the global model's names in its order (the usual
        case) is viewed through the round's headers, which parse only the
        headers that differ from the global model's; any other is parsed.
        """
        headers = self._current_headers(previous)
        if headers is not None:
            names, datas = self.models._serialized(aggregate)
            if names == headers.name_list:
                return dict(zip(names, headers.read_in_order(datas)))
        return self.models._parse_aggregate(aggregate)

    # --------------------------------------------------------------- admission
    def admit(self, access: ReplyAccess[R], previous: Any) -> list[R]:
        """The train replies the wrapped strategy may aggregate, their arrays cast to the round's dtypes.

        A reply that does not fit the global model, or (Message API) whose
        records differ from most others', is logged and dropped; an array in
        another dtype than the global model's is re-serialized in it (:mod:`.dtypes`).
        """
        headers = self.model_headers(previous)
        reads = []
        for reply in access.candidates:
            read = access.read(reply, headers)
            reason = read.reason or self._problem(access, read, headers)
            if reason is None:
                reads.append(read)
            else:
                self.drop(access, reply, reason)
        reads = self._voted(access, reads)
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
        return [read.reply for read in self._voted(access, reads)]

    def _problem(self, access: ReplyAccess[R], read: ReadReply, headers: ModelHeaders) -> str | None:
        """Why a reply cannot be aggregated into the global model: its weight, then its arrays' headers.

        Arrays in the global model's order whose headers are known (the usual
        case) are recognised in C loops (:meth:`ModelHeaders.dtypes_in_order`);
        only the others are read one by one. On that path the arrays'
        serialization (``stype``) is left unread: the wrapped strategy raises
        on bytes in another one, and :meth:`aggregate` then drops them.
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

    def _voted(self, access: ReplyAccess[R], reads: list[ReadReply]) -> list[ReadReply]:
        odd = access.vote(reads) if len(reads) > 1 else {}
        for index, reason in odd.items():
            self.drop(access, reads[index].reply, reason)
        return [read for i, read in enumerate(reads) if i not in odd] if odd else reads

    def drop(self, access: ReplyAccess[R], reply: R, reason: str) -> None:
        """Leave ``reply`` out: one line, the same in both APIs (tests and users grep it)."""
        log(WARNING, "LIPS: ignoring reply from %s: %s", access.sender(reply), reason)
        access.dropped(reply)

    # --------------------------------------------------------------- aggregation
    def aggregate(self, access: ReplyAccess[R], replies: list[R], chain: list, server_round: int,
                  previous: Any) -> Aggregated:
        """The wrapped strategy's aggregate of ``replies``, finite, or nothing.

        The aggregate, not each reply, is checked for NaN/Inf: one pass on a
        good round. When it is not finite, the reply that made it so (NaN/Inf,
        or values that overflow) is dropped, the wrapped chain's state is put
        back as it was before the aggregation, and the rest are aggregated
        again. An aggregate that stays non-finite is not returned: the round
        keeps the previous global model. When the wrapped strategy raises on
        replies that passed the header checks, those it cannot read (another
        serialization) are dropped and the rest aggregated again; when it
        names none, the exception is the wrapped strategy's own and
        propagates. A chain with a privacy accountant is checked reply by
        reply before it aggregates instead: a retry would compose its
        privacy release twice.
        """
        replies = list(replies)
        access.snapshot(replies)
        state = chain_state(chain)
        inner = type(chain[1] if len(chain) > 1 else chain[0]).__name__
        irreversible = any(getattr(strategy, "accountant", None) is not None for strategy in chain)
        if irreversible:
            while (found := self._culprit(access, replies)) is not None and found[1].startswith("NaN or Inf"):
                self.drop(access, replies.pop(found[0]), found[1])
            self._drop_all(access, replies, self._unreadable(access, replies))
        try:
            aggregate, metrics = access.aggregate(replies)
        except Exception as err:
            bad = [] if irreversible else self._unreadable(access, replies)
            if not bad:
                raise
            log(WARNING, "LIPS: round %d: %s raised %s: %s; dropping the %d replies it cannot read "
                "and aggregating the rest again", server_round, inner, type(err).__name__, err, len(bad))
            restore_chain_state(state)
            self._drop_all(access, replies, bad)
            access.restore()
            aggregate, metrics = access.aggregate(replies)
        views = None if aggregate is None else self.aggregate_views(aggregate, previous)
        while views is not None and nonfinite_arrays(views):
            restore_chain_state(state)
            found = None if irreversible else self._culprit(access, replies)
            if found is None:
                why = ("a retry would compose its privacy release twice" if irreversible
                       else "no reply explains it")
                log(ERROR, "LIPS: round %d: the aggregate of %s has NaN or Inf in %s and %s; it is "
                    "not broadcast, the global model stays as it was",
                    server_round, inner, nonfinite_arrays(views)[:5], why)
                return Aggregated(None, None, None)  # nor the metrics of that aggregate
            self.drop(access, replies.pop(found[0]), found[1])
            access.restore()
            aggregate, metrics = access.aggregate(replies)
            views = None if aggregate is None else self.aggregate_views(aggregate, previous)
        return Aggregated(aggregate, metrics, views)

    def _culprit(self, access: ReplyAccess[R], replies: list[R]) -> tuple[int, str] | None:
        """``(index, reason)`` of the reply that makes an aggregate non-finite (reads every array)."""
        access.restore()
        return culprit_among([access.views(reply) for reply in replies],
                             [access.overflow_weight(reply) for reply in replies])

    def _unreadable(self, access: ReplyAccess[R], replies: list[R]) -> list[tuple[int, str]]:
        """``(index, reason)`` of each reply with an array in another serialization than numpy's."""
        access.restore()
        found = enumerate(map(access.stype_problem, replies))
        return [(i, reason) for i, reason in found if reason is not None]

    def _drop_all(self, access: ReplyAccess[R], replies: list[R], found: list[tuple[int, str]]) -> None:
        for index, reason in sorted(found, reverse=True):
            self.drop(access, replies.pop(index), reason)


# A retry must undo whatever the wrapped chain did while it aggregated, its own bookkeeping
# included (a DP wrapper pops its pending privacy event; a user's strategy counts rounds), not
# only the state a checkpoint declares (resume/chain_state.py): so this snapshot stays generic.
# Flower's strategies rebind what they keep (``self.current_arrays = ...``) or edit a dict or
# list they hold, so references and containers copied one level deep undo an aggregation; no
# array data is copied on a good round.
def chain_state(chain: list) -> list[tuple[Any, dict, dict]]:
    """Each strategy of the chain with a copy of its attributes, containers one level deep."""
    return [
        (inner, dict(vars(inner)),
         {k: v.copy() for k, v in vars(inner).items() if isinstance(v, (dict, list, set))})
        for inner in chain
    ]


def restore_chain_state(state: list[tuple[Any, dict, dict]]) -> None:
    """Put each strategy's attributes back as :func:`chain_state` found them."""
    for inner, attributes, containers in state:
        vars(inner).clear()
        vars(inner).update(attributes)
        for name, saved in containers.items():
            live = attributes[name]
            live.clear()
            live.update(saved) if not isinstance(live, list) else live.extend(saved)


__all__ = ["Aggregated", "ModelCodec", "ReadReply", "ReplyAccess", "ReplyGate", "chain_state",
           "restore_chain_state"]
