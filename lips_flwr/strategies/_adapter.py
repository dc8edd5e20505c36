"""The round's sequence, written once for both Flower APIs.

A LIPS strategy is an adapter between Flower and :class:`~lips_flwr.core.lips.LIPSCore`.
Data flows one way through a round::

    configure:  [checkpoint the previous round] -> remember the global model
                -> lips-* keys (lips_flwr.protocol) -> wrapped strategy's instructions
    aggregate:  replies -> checks -> wrapped strategy's aggregate
                -> core.round(round, aggregate, previous)   (one call)
                -> zeros into the wrapped strategies' caches -> log -> broadcast

:class:`LIPSAdapter` holds that sequence; :mod:`.message` and :mod:`.legacy`
subclass it and supply only what differs between the APIs: how a model is
read as ``name -> ndarray`` and written back (records vs ``Parameters``), how
replies carry their arrays, and their own loop (``start()`` vs the legacy
``Server``). The schedule's round of a loop round after a resume
(:meth:`LIPSAdapter._round`) is solved here, for both.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Mapping
from logging import ERROR, INFO, WARNING
from types import MappingProxyType
from typing import Any, TypedDict, TypeVar

import numpy as np
from flwr.common import log

from .._npy import npy_header
from ..core.checks import nonfinite_arrays
from ..core.layers import LayerSpec
from ..core.lips import OPTIONS, TRIGGER_OPTIONS, LIPSCore, RoundOutcome
from ..protocol import evaluate_config, train_config
from ._cache_sync import snapshot_caches, strategy_chain, sync_cached_models
from ._checkpointing import CheckpointKeeper
from ._reply_checks import ModelHeaders
from ._strategy_state import ndarray_state, ndarray_value
from .overrides import with_forced

CHECKPOINT_OPTIONS = ("checkpoint_path", "resume")
CORE_OPTIONS = (*OPTIONS, *TRIGGER_OPTIONS)  # what LIPSCore takes
Model = dict[str, np.ndarray]
Reply = TypeVar("Reply")


class LIPSOptions(TypedDict, total=False):
    """The keyword arguments every LIPS strategy takes, written once.

    The README's Options table is their one description (defaults, ranges,
    meaning); :class:`~lips_flwr.core.lips.LIPSCore` validates them.
    """

    num_rounds: int | None
    tau0: float
    every: int
    start_round: int
    decay: str
    score: str
    layers: LayerSpec
    mode: str
    seed: int
    inertia_t0: int | None
    trigger: str
    trigger_window: int
    trigger_factor: float
    checkpoint_path: str | os.PathLike[str] | None
    resume: bool | str


def split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the LIPS options out of ``kwargs`` (the FedAvg subclasses pass the rest to FedAvg)."""
    return {k: kwargs.pop(k) for k in (*CORE_OPTIONS, *CHECKPOINT_OPTIONS) if k in kwargs}


class LIPSAdapter:
    """The LIPS hooks of both APIs; ``super()`` is the strategy whose aggregate is masked.

    Subclasses implement the conversions (``_views``, ``_serialized``,
    ``_with_model``, ``_cached_to_numpy``, ``_numpy_to_cached``; optionally
    ``_parse_aggregate``, ``_to_state``, ``_from_state``) and call
    :meth:`_begin_round`, :meth:`_checked` and :meth:`_aggregate_round` from
    their Flower methods.
    """

    core: LIPSCore
    _lips_keeper: CheckpointKeeper
    _lips_previous: Any = None  # the global model of the current round, in the API's type
    _lips_done = 0  # rounds done before this run (from the checkpoint)
    _lips_history: dict | None = None  # per-round metrics to checkpoint (Message API's start())
    # The global model's headers for the reply checks, read once per global model:
    # (the model, its ModelHeaders, its serialized arrays then).
    _lips_headers: tuple[Any, ModelHeaders, list] | None = None
    # name -> .npy header the replies sent last round where their dtype was not the
    # global model's (ModelHeaders' `replied`: the fast path of the next round's checks).
    _lips_replied: Mapping[str, bytes] = MappingProxyType({})  # replaced, never mutated

    # ------------------------------------------------------------ construction
    def _init_lips(self, options: Mapping[str, Any]) -> None:
        options = with_forced(type(self).__name__, options)  # lips-flwr compare's arm with LIPS off
        unknown = sorted(set(options) - {*CORE_OPTIONS, *CHECKPOINT_OPTIONS})
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {unknown}; "
                            f"the LIPS options are {[*CORE_OPTIONS, *CHECKPOINT_OPTIONS]}")
        self.core = LIPSCore(**{k: v for k, v in options.items() if k in CORE_OPTIONS})
        self._lips_keeper = CheckpointKeeper(options.get("checkpoint_path"), options.get("resume", False))

    def summary(self) -> None:
        """Log the LIPS settings in Flower's log-tree style."""
        items = self.core.describe()
        log(INFO, "\t├──> %s settings:", "LIPS")
        for i, (label, value) in enumerate(items):
            log(INFO, "\t│\t%s── %s: %s", "└" if i == len(items) - 1 else "├", label, value)

    # ------------------------------------------------------------------- rounds
    def _round(self, loop_round: int) -> int:
        """The schedule's round of a loop's ``server_round``, which counts from 1 in every run."""
        shifted = loop_round + self._lips_done
        if self._lips_done and shifted > self.core.schedule.num_rounds:
            raise ValueError(
                f"round {loop_round} of this run is round {shifted} of the schedule, past "
                f"num_rounds={self.core.schedule.num_rounds}: the checkpoint has "
                f"{self._lips_done} rounds done, so run the "
                f"{self.core.schedule.num_rounds - self._lips_done} "
                "rounds left (legacy API: ServerConfig(num_rounds=strategy.rounds_left))"
            )
        return shifted

    def _begin_round(self, server_round: int, model: Any) -> dict:
        """Checkpoint the previous round, remember ``model`` (for ``dw``); the round's ``lips-*`` keys.

        The checkpoint comes first: it holds the state reached after the
        previous round, its evaluation included, so that a resumed run draws
        the same random numbers.
        """
        self._lips_keeper.before_round()
        self._lips_headers = None  # of the last global model: read from this one when replies come
        views = self._views(model)
        if self._lips_previous is None:
            self._check_first_model(views)
        self._save_checkpoint(server_round - 1, model)
        self._lips_previous = model
        plan = self.core.client_plan(server_round, views)
        return train_config(server_round, self.core.mode, self._lips_keeper.run_key, **plan)

    def _check_first_model(self, model: Model) -> None:
        """Resolve the layers on the first global model: bad names fail before any training."""
        if not self.core.layer_names(model):  # raises ValueError for unmatched names
            log(WARNING, "LIPS: layers=%r selects no tensor of this model (%d arrays); "
                "nothing will be masked", self.core.layers, len(model))

    def _evaluate_keys(self, server_round: int) -> dict:
        """The ``lips-*`` keys of an evaluate config (the run key and round, when checkpointing)."""
        return evaluate_config(server_round, self._lips_keeper.run_key)

    def _model_headers(self) -> ModelHeaders:
        """The headers of the round's global model (:class:`ModelHeaders`), read once per model.

        Read again when the model holds other names or other serialized
        arrays than when they were read (it is the caller's object: it may change).
        """
        headers = self._cached_headers()
        if headers is None:
            names, datas = self._serialized(self._lips_previous)
            headers = ModelHeaders(dict(zip(names, datas)), self._lips_replied)
            self._lips_headers = (self._lips_previous, headers, datas)
        return headers

    def _remember_replied(self, headers: ModelHeaders, chosen: Mapping[str, np.dtype],
                          kept: Mapping[str, Any] | None) -> None:
        """Keep, for the next round's checks, the headers of the arrays replies sent in another
        dtype than the global model's (``chosen``: the dtypes aggregated; ``kept``: one kept
        reply's ``name -> .npy bytes``, already in those dtypes)."""
        if chosen is headers.replied_dtype:  # the headers already known (none, or last round's)
            return
        replied = {}
        for name, dtype in chosen.items():
            data = None if kept is None else kept.get(name)
            found = None if data is None or dtype == headers.dtype.get(name) else npy_header(data)
            if found is not None and found[2] == dtype:
                replied[name] = found[0]
        self._lips_replied = replied

    def _cached_headers(self) -> ModelHeaders | None:
        """:meth:`_model_headers` if they were read from the global model as it is now, else ``None``."""
        cached, model = self._lips_headers, self._lips_previous
        if cached is None or cached[0] is not model:
            return None
        names, datas = self._serialized(model)
        same = (cached[1].names == tuple(names) and len(datas) == len(cached[2])
                and all(map(operator.is_, datas, cached[2])))
        return cached[1] if same else None

    def _previous_views(self) -> Model:
        """``name -> ndarray`` read-only views of the round's global model (``_lips_previous``)."""
        headers = self._cached_headers()  # read by this round's reply checks
        return self._views(self._lips_previous) if headers is None else headers.views

    def _checked(
        self, replies: Iterable[Reply], problem: Callable[[Reply], tuple[str, str | None]]
    ) -> tuple[list[Reply], list[Reply]]:
        """``(kept, dropped)``: each reply whose ``problem`` is ``(sender, reason)``
        with a reason is logged and dropped."""
        kept, dropped = [], []
        for reply in replies:
            sender, reason = problem(reply)
            if reason is None:
                kept.append(reply)
            else:
                self._log_drop(sender, reason)
                dropped.append(reply)
        return kept, dropped

    def _log_drop(self, sender: str, reason: str) -> None:
        """The one line a dropped reply gets, the same in both APIs (tests and users grep it)."""
        log(WARNING, "LIPS: ignoring reply from %s: %s", sender, reason)

    def _aggregate_round(
        self,
        server_round: int,
        replies: list[Reply],
        inner: Callable[[list[Reply]], tuple[Any, Any]],
        culprit: Callable[[list[Reply]], tuple[int, str] | None],
        drop: Callable[[Reply, str], None],
        client_reports: Callable[[], int],
        unreadable: Callable[[list[Reply]], list[tuple[int, str]]] | None = None,
    ) -> tuple[Any, Any, dict[str, int | float]]:
        """Inner aggregate -> finite? -> the core's one call -> caches -> log.

        ``replies`` passed the header checks; ``inner(replies)`` is the
        wrapped strategy's aggregation. Returns ``(model, inner metrics, lips
        metrics)``: ``model`` is the model to broadcast (in the API's type;
        ``None``, with the inner metrics untouched and no LIPS metrics, when
        nothing was aggregated).

        ``unreadable(replies)`` names, as ``(index, reason)``, the replies the
        wrapped strategy cannot read although they passed the header checks
        (the Message API's checks leave each array's ``stype`` unread on a
        good round). It is asked when ``inner`` raises: those replies are
        dropped (the error logged) and the rest aggregated again; when it
        names none, the exception is the wrapped strategy's own and
        propagates. A chain with a privacy accountant is asked before it
        aggregates instead, as for NaN/Inf.

        The aggregate, not each reply, is checked for NaN/Inf: one pass on a
        good round. When it is not finite, ``culprit(replies)`` names the
        reply that made it so (NaN/Inf, or values that overflow); ``drop``
        logs and removes it, the wrapped chain's state is put back as it was
        before the aggregation, and the rest are aggregated again. An
        aggregate that stays non-finite is never broadcast: the round keeps
        the previous global model. ``client_reports()`` counts the replies
        carrying ``lips-client-zeros`` (asked only on a client-mode mask round).
        """
        before = snapshot_caches(self)
        state = _chain_state(self)
        replies = list(replies)
        irreversible = _irreversible(self)
        if irreversible:
            # An aggregation with effects LIPS cannot undo (a privacy accountant composes a
            # release) must not see a bad reply at all: check each reply first, at its cost.
            while (found := culprit(replies)) is not None and found[1].startswith("NaN or Inf"):
                drop(replies.pop(found[0]), found[1])
            _drop_all(replies, [] if unreadable is None else unreadable(replies), drop)
        try:
            aggregate, metrics = inner(replies)
        except Exception as err:
            bad = [] if unreadable is None or irreversible else unreadable(replies)
            if not bad:
                raise
            log(WARNING, "LIPS: round %d: %s raised %s: %s; dropping the %d replies it cannot read "
                "and aggregating the rest again",
                server_round, _inner_name(self), type(err).__name__, err, len(bad))
            _restore_chain_state(state)
            _drop_all(replies, bad, drop)
            aggregate, metrics = inner(replies)
        views = None if aggregate is None else self._aggregate_views(aggregate)
        while views is not None and nonfinite_arrays(views):
            _restore_chain_state(state)
            found = None if irreversible else culprit(replies)
            if found is None:
                why = ("a retry would compose its privacy release twice" if irreversible
                       else "no reply explains it")
                log(ERROR, "LIPS: round %d: the aggregate of %s has NaN or Inf in %s and %s; it is "
                    "not broadcast, the global model stays as it was",
                    server_round, _inner_name(self), nonfinite_arrays(views)[:5], why)
                aggregate = views = metrics = None  # nor the metrics of that aggregate
                break
            index, reason = found
            drop(replies.pop(index), reason)
            aggregate, metrics = inner(replies)
            views = None if aggregate is None else self._aggregate_views(aggregate)
        previous = None if self._lips_previous is None else self._previous_views()
        outcome = self.core.round(server_round, views, previous, aggregate_finite=True)  # checked above
        if aggregate is None:  # nothing to mask, nothing to report: the global model stays
            self._log_round(server_round, outcome, client_reports)
            return aggregate, metrics, {}
        if outcome.model is not None:
            sync_cached_models(self, before, outcome.masks, self._cached_to_numpy, self._numpy_to_cached)
            assert views is not None  # set whenever there is an aggregate
            aggregate = self._with_model(aggregate, outcome.model, views)
        self._log_round(server_round, outcome, client_reports)
        self._lips_keeper.report(outcome.metrics)
        return aggregate, metrics, outcome.metrics

    def _log_round(self, server_round: int, outcome: RoundOutcome, client_reports: Callable[[], int]) -> None:
        """One line per mask round, the same in both APIs (tests and users grep it)."""
        if outcome.problem is not None and not outcome.metrics:
            log(WARNING, "LIPS: round %d has no aggregate (no usable reply): nothing masked; "
                "the global model stays as it was", server_round)
        elif outcome.problem is not None:
            log(ERROR, "LIPS: round %d not masked: %s; the aggregate of %s is returned "
                "unchanged", server_round, outcome.problem, _inner_name(self))
        metrics = outcome.metrics
        if not metrics.get("lips-mask-round"):
            return
        decision = outcome.decision
        if decision is not None:  # trigger="inertia": which layers stagnate, if any
            if decision.stagnant:
                found = f"{len(decision.stagnant)} stagnating layers {decision.stagnant}"
            elif decision.ready:
                found = "no layer stagnates, nothing masked"
            else:
                found = f"no baseline before round {self.core.trigger_window + 2}, nothing masked"
            log(INFO, "LIPS: round %d: inertia trigger: %s", server_round, found)
            if not decision.stagnant:
                return
        if self.core.mode == "client":
            log(INFO, "LIPS: round %d asks clients to mask (tau=%.4f)", server_round, metrics["lips-tau"])
            if client_reports() == 0:
                log(WARNING, "LIPS: no client reported a mask in round %d: client mode needs "
                    "lips_mod (Message API) or LIPSNumPyClient (legacy) on the clients", server_round)
        else:
            log(INFO, "LIPS: round %d masked %d weights in %d layers (tau=%.4f, %.3fs)",
                server_round, metrics["lips-zeros"], metrics["lips-layers-masked"],
                metrics["lips-tau"], metrics["lips-seconds"])

    def _weight_key(self) -> str | None:
        """The metric the wrapped chain weights replies by (Message FedAvg's ``weighted_by_key``)."""
        for inner in strategy_chain(self):
            key = getattr(inner, "weighted_by_key", None)
            if isinstance(key, str):
                return key
        return None

    # -------------------------------------------------------------- checkpoint
    def _save_checkpoint(self, server_round: int, model: Any) -> None:
        """Write the checkpoint after ``server_round`` (``model``: the global model then)."""
        if self._lips_keeper.path is not None:
            self._lips_keeper.save(self, self.core, server_round, self._views(model),
                                   self._to_state, self._lips_history)

    def _to_state(self, value: Any) -> tuple[str, dict[str, np.ndarray]] | None:
        """A wrapped strategy's attribute as checkpoint state: a model-shaped value, else ``None``."""
        return ndarray_state(value)

    def _from_state(self, kind: str, arrays: Mapping[str, np.ndarray]) -> Any:
        return ndarray_value(kind, arrays)

    # -------------------------------------------- conversions (per API)
    def _views(self, model: Any) -> Model:
        """``name -> ndarray`` read-only views of a global model in the API's type."""
        raise NotImplementedError

    def _serialized(self, model: Any) -> tuple[list[str], list[Any]]:
        """The names and the ``.npy`` bytes of a global model's arrays, in its order."""
        raise NotImplementedError

    def _aggregate_views(self, aggregate: Any) -> Model:
        """Read-only views of the wrapped strategy's aggregate, in the global model's order.

        An aggregate with the global model's names in its order (the usual
        case) is viewed through the round's :class:`ModelHeaders`, which
        parses only the headers that differ from the global model's; any
        other through :meth:`_parse_aggregate`.
        """
        headers = self._cached_headers()
        if headers is not None:
            names, datas = self._serialized(aggregate)
            if names == headers.name_list:
                return dict(zip(names, headers.read_in_order(datas)))
        return self._parse_aggregate(aggregate)

    def _parse_aggregate(self, aggregate: Any) -> Model:
        """:meth:`_aggregate_views` of any aggregate, its headers parsed."""
        return self._views(aggregate)

    def _with_model(self, aggregate: Any, model: Model, views: Model) -> Any:
        """The aggregate with the core's ``model`` in it (only its changed tensors re-serialized)."""
        raise NotImplementedError

    def _cached_to_numpy(self, value: Any) -> Mapping[str, np.ndarray] | None:
        raise NotImplementedError

    def _numpy_to_cached(self, value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
        raise NotImplementedError


def _drop_all(replies: list, found: list[tuple[int, str]], drop: Callable[[Any, str], None]) -> None:
    """Drop ``replies[index]`` for each ``(index, reason)`` in ``found``, in place."""
    for index, reason in sorted(found, reverse=True):
        drop(replies.pop(index), reason)


def _inner_name(owner: Any) -> str:
    """The class name of the strategy LIPS wraps (``owner`` itself for the FedAvg subclasses)."""
    return type(getattr(owner, "strategy", owner)).__name__


def _irreversible(owner: Any) -> bool:
    """Whether aggregating has an effect a retry cannot undo: a privacy accountant in the chain."""
    return any(getattr(inner, "accountant", None) is not None for inner in strategy_chain(owner))


def _chain_state(owner: Any) -> list[tuple[Any, dict, dict]]:
    """Each strategy of the chain with a copy of its attributes, containers one level deep.

    Flower's strategies rebind what they keep between rounds
    (``self.current_arrays = ...``) or edit a dict or list they hold (a DP
    wrapper's pending events), so this is enough to undo an aggregation; it
    copies references, no array data, on a good round.
    """
    return [
        (inner, dict(vars(inner)),
         {k: _copy(v) for k, v in vars(inner).items() if isinstance(v, (dict, list, set))})
        for inner in strategy_chain(owner)
    ]


def _copy(container: Any) -> Any:
    return container.copy()


def _restore_chain_state(state: list[tuple[Any, dict, dict]]) -> None:
    for inner, attributes, containers in state:
        vars(inner).clear()
        vars(inner).update(attributes)
        for name, saved in containers.items():
            live = attributes[name]
            live.clear()
            live.update(saved) if not isinstance(live, list) else live.extend(saved)
