"""The round's sequence, written once for both Flower APIs.

A LIPS strategy is an adapter between Flower and :class:`~lips_flwr.core.lips.LIPSCore`.
Data flows one way through a round::

    configure:  [checkpoint the previous round] -> remember the global model
                -> lips-* keys (lips_flwr.protocol) -> wrapped strategy's instructions
    aggregate:  admit (the reply gate) -> wrapped strategy's aggregate
                -> core.round(round, aggregate, previous)   (one call)
                -> zeros into the wrapped strategies' caches -> log -> checkpoint

:mod:`.message` and :mod:`.legacy` subclass :class:`LIPSAdapter` and supply
only what differs: their model codec (:mod:`..codecs`), an access object for
their replies (:mod:`..replies`), and their own loop (``start()``, the legacy
``Server``).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any, ClassVar, NamedTuple

import numpy as np
from flwr.common import log

from ...core.lips import LIPSCore
from ...protocol import evaluate_config, train_config
from ..chain import inner_name, strategy_chain
from ..codecs import ModelCodec
from ..options import CORE_OPTIONS, lips_options
from ..replies.gate import ReplyAccess, ReplyGate
from ..resume.keeper import CheckpointKeeper
from .cache_sync import snapshot_caches, sync_cached_models
from .round_log import log_round

Model = dict[str, np.ndarray]


class RoundResult(NamedTuple):
    """What :meth:`LIPSAdapter._aggregate_round` gives back to an API's ``aggregate_*`` method."""

    model: Any  # the model to broadcast, in the API's type; None: nothing aggregated
    metrics: Any  # the wrapped strategy's metrics
    lips_metrics: dict[str, int | float]  # the round's lips-* metrics (empty without a model)


class LIPSAdapter(ABC):
    """The LIPS hooks of both APIs; ``super()`` is the strategy whose aggregate is masked.
    Subclasses give :meth:`_init_lips` their API's codec and call :meth:`_begin_round` and
    :meth:`_aggregate_round` from their Flower methods."""

    # The legacy Server calls no configure after the last round: the round saves the final model.
    # (The Message API's start() saves it after its loop, the last evaluation included.)
    SAVE_AFTER_LAST_ROUND: ClassVar[bool] = False

    core: LIPSCore
    _lips_codec: ModelCodec  # the API's models as arrays and back (..codecs)
    _lips_keeper: CheckpointKeeper
    _lips_gate: ReplyGate  # the reply checks, their header cache, the retry (..replies)
    _lips_previous: Any = None  # the global model of the current round, in the API's type
    _lips_done = 0  # rounds done before this run (from the checkpoint)
    _lips_history: dict | None = None  # per-round metrics to checkpoint (Message API's start())

    # ------------------------------------------------------------ construction
    def _init_lips(self, options: Mapping[str, Any], codec: ModelCodec) -> None:
        options = lips_options(type(self).__name__, options)  # forced: lips-flwr compare's arm with LIPS off
        self.core = LIPSCore(**{k: v for k, v in options.items() if k in CORE_OPTIONS})
        self._lips_keeper = CheckpointKeeper(options.get("checkpoint_path"), options.get("resume", False),
                                             options.get("skip_undeclared_state", False))
        self._lips_codec = codec
        self._lips_gate = ReplyGate(codec)

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
        if self._lips_done and shifted > (total := self.core.schedule.num_rounds):
            raise ValueError(f"round {loop_round} of this run is round {shifted} of the schedule, past "
                             f"num_rounds={total}: the checkpoint has {self._lips_done} rounds done, so run "
                             f"the {total - self._lips_done} rounds left (legacy API: "
                             "ServerConfig(num_rounds=strategy.rounds_left))")
        return shifted

    def _begin_round(self, server_round: int, model: Any) -> dict:
        """Checkpoint the previous round, remember ``model`` (for ``dw``); the round's ``lips-*`` keys.
        The checkpoint comes first: it holds the state after the previous round, its evaluation
        included, so that a resumed run draws the same random numbers."""
        self._lips_keeper.before_round()
        self._lips_gate.headers.forget()  # of the last global model: read from this one when replies come
        views = self._lips_codec.views(model)
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

    def _aggregate_round(self, server_round: int, replies: ReplyAccess[Any]) -> RoundResult:
        """admit -> inner aggregate -> core.round -> caches -> log -> checkpoint, for both APIs
        (``replies``: the API's access to them; not checked without a configure call before)."""
        previous, gate = self._lips_previous, self._lips_gate
        kept = replies.candidates if previous is None else gate.admit(replies, previous)
        chain = list(strategy_chain(self))
        before = snapshot_caches(self)
        aggregated = gate.aggregate(replies, kept, chain, server_round, previous)
        aggregate, views = aggregated.aggregate, aggregated.views
        outcome = self.core.round(server_round, views, gate.previous_views(previous), aggregate_finite=True)
        if outcome.model is not None:  # masked: the wrapped strategies' caches get the same zeros
            assert views is not None  # a masked model comes from an aggregate
            codec = self._lips_codec
            # Only the masked layers are serialized anew; every other array is the aggregate's own.
            masked = codec.from_arrays(codec.model_kind, outcome.model, like=aggregate,
                                       changed={n for n, a in outcome.model.items() if a is not views[n]})
            sync_cached_models(self, before, outcome.masks, codec, aggregate, masked)
            aggregate = masked
        log_round(server_round, outcome, self.core, inner_name(chain), replies, kept)
        self._checkpoint_round(server_round, aggregate, outcome.metrics)
        return RoundResult(aggregate, aggregated.metrics, outcome.metrics)

    # -------------------------------------------------------------- checkpoint
    def _checkpoint_round(self, server_round: int, model: Any, metrics: dict) -> None:
        """The round's checkpoint step: the seconds of the save before it go into its metrics; after
        the last round, where no configure follows (:data:`SAVE_AFTER_LAST_ROUND`), the save."""
        if model is not None:
            self._lips_keeper.report(metrics)
        if self.SAVE_AFTER_LAST_ROUND and server_round == self.core.schedule.num_rounds:
            final = model if model is not None else self._lips_previous
            if final is not None:
                self._save_checkpoint(server_round, final)
                if model is not None:
                    self._lips_keeper.report(metrics)

    def _save_checkpoint(self, server_round: int, model: Any) -> None:
        """Write the checkpoint after ``server_round`` (``model``: the global model then)."""
        if self._lips_keeper.path is not None:
            self._lips_keeper.save(self, self.core, server_round, self._lips_codec.views(model),
                                   self._lips_codec.to_arrays, self._lips_history)


__all__ = ["LIPSAdapter", "RoundResult"]
