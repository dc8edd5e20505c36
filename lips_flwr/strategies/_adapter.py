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

import os
from collections.abc import Mapping
from logging import ERROR, INFO, WARNING
from types import MappingProxyType
from typing import Any, TypedDict, TypeVar

import numpy as np
from flwr.common import log

from ..core.layers import LayerSpec
from ..core.lips import OPTIONS, TRIGGER_OPTIONS, LIPSCore, RoundOutcome
from ..protocol import evaluate_config, train_config
from ._cache_sync import snapshot_caches, strategy_chain, sync_cached_models
from ._checkpointing import CheckpointKeeper
from ._strategy_state import ndarray_state, ndarray_value
from .overrides import with_forced
from .replies.gate import ReplyAccess, ReplyGate
from .replies.headers import ModelHeaders

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
    :meth:`_begin_round` and :meth:`_aggregate_round` (with their reply access) from
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
        self._lips_gate = ReplyGate(self)

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
        self._lips_gate.headers.forget()  # of the last global model: read from this one when replies come
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
        """The headers of the round's global model (the gate's, read once per model)."""
        return self._lips_gate.model_headers(self._lips_previous)

    def _previous_views(self) -> Model | None:
        """``name -> ndarray`` read-only views of the round's global model (``_lips_previous``)."""
        return self._lips_gate.previous_views(self._lips_previous)

    def _aggregate_round(
        self, server_round: int, replies: ReplyAccess
    ) -> tuple[Any, Any, dict[str, int | float]]:
        """admit -> inner aggregate -> core.round -> caches -> log, for both APIs.

        ``replies`` is the API's access to the round's replies
        (:class:`.replies.gate.ReplyAccess`). Returns ``(model, inner metrics,
        lips metrics)``: ``model`` is the model to broadcast (in the API's
        type; ``None``, with no LIPS metrics, when nothing was aggregated).
        """
        previous = self._lips_previous
        kept = replies.candidates if previous is None else self._lips_gate.admit(replies, previous)
        before = snapshot_caches(self)
        chain = list(strategy_chain(self))
        aggregated = self._lips_gate.aggregate(replies, kept, chain, server_round, previous)
        aggregate, views = aggregated.aggregate, aggregated.views
        outcome = self.core.round(server_round, views, self._previous_views(), aggregate_finite=True)
        if aggregate is None:  # nothing to mask, nothing to report: the global model stays
            self._log_round(server_round, outcome, replies, kept)
            return aggregate, aggregated.metrics, {}
        if outcome.model is not None:
            sync_cached_models(self, before, outcome.masks, self._cached_to_numpy, self._numpy_to_cached)
            assert views is not None  # set whenever there is an aggregate
            aggregate = self._with_model(aggregate, outcome.model, views)
        self._log_round(server_round, outcome, replies, kept)
        self._lips_keeper.report(outcome.metrics)
        return aggregate, aggregated.metrics, outcome.metrics

    def _log_round(self, server_round: int, outcome: RoundOutcome, replies: ReplyAccess, kept: list) -> None:
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
            if replies.client_reports(kept) == 0:
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


def _inner_name(owner: Any) -> str:
    """The class name of the strategy LIPS wraps (``owner`` itself for the FedAvg subclasses)."""
    return type(getattr(owner, "strategy", owner)).__name__
