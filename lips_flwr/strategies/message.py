"""LIPS for Flower's Message API (``aggregate_train``): a wrapper around any Strategy."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy
from flwr.common import log

from ..layers import LayerSpec
from ..records import numpy_to_record, record_to_numpy, record_views
from ..sparsifier import LIPS_OPTIONS, TransientSparsifier
from ..validation import MISSING, model_shapes, reply_problem, serialization_problem
from ._cache_sync import snapshot_caches, strategy_chain
from ._common import check_model, log_no_aggregate, log_round, log_settings, sparsify_aggregate
from ._message_loop import empty_history, history_from_json, run_start
from ._resume import CheckpointKeeper
from ._strategy_state import ndarray_state, ndarray_value

CHECKPOINT_OPTIONS = ("checkpoint_path", "resume")


def _cached_to_numpy(value: Any) -> dict[str, np.ndarray] | None:
    if isinstance(value, ArrayRecord):
        return record_to_numpy(value)
    if isinstance(value, dict) and all(isinstance(v, (np.ndarray, np.generic)) for v in value.values()):
        return {name: np.asarray(v) for name, v in value.items()}
    return None


def _numpy_to_cached(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, ArrayRecord):
        return numpy_to_record(arrays, value, arrays)
    return {name: arrays[name] for name in value}


def _to_state(value: Any) -> tuple[str, dict[str, np.ndarray]] | None:
    if isinstance(value, ArrayRecord):
        return ("arrayrecord", record_views(value)) if len(value) else None
    return ndarray_state(value)


def _from_state(kind: str, arrays: dict[str, np.ndarray]) -> Any:
    return numpy_to_record(arrays) if kind == "arrayrecord" else ndarray_value(kind, arrays)


class _LIPSMixin:
    """The LIPS hooks; ``super()`` is the strategy whose aggregate is sparsified."""

    sparsifier: TransientSparsifier
    _lips_previous: ArrayRecord | None = None
    _lips_keeper: CheckpointKeeper  # set by the constructors (_init_checkpoint)
    _lips_history: dict | None = None

    def _init_checkpoint(self, checkpoint_path: Any, resume_mode: Any) -> None:
        self._lips_keeper = CheckpointKeeper(checkpoint_path, resume_mode)

    def summary(self) -> None:
        """Log the LIPS settings, then the wrapped strategy's."""
        log_settings("LIPS", self.sparsifier.describe())
        super().summary()  # type: ignore[misc]

    def start(  # pylint: disable=too-many-arguments
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds; also the schedule's ``T`` unless set at construction.

        With ``resume`` and a checkpoint after round ``r``, rounds
        ``r+1..num_rounds`` run from the checkpoint's model (``initial_arrays``
        only fixes names and shapes); every method gets the schedule's round
        numbers, and the returned ``Result`` holds all rounds, those before
        the checkpoint from the checkpoint. Flower's ``[ROUND i/n]`` log lines
        count the rounds of this call.
        """
        if self.sparsifier.num_rounds is None:
            self.sparsifier.set_num_rounds(num_rounds)
        elif self.sparsifier.num_rounds != num_rounds:
            log(WARNING, "LIPS: schedule uses num_rounds=%d but start() runs %d rounds",
                self.sparsifier.num_rounds, num_rounds)
        keeper = self._lips_keeper
        resumed = keeper.begin(self, self.sparsifier)
        done, arrays = 0, initial_arrays
        # Metrics are kept only to checkpoint them: the Result of a resumed run is then whole.
        self._lips_history = None if keeper.path is None else empty_history()
        if resumed is not None:
            keeper.restore(self, resumed, record_views(initial_arrays), _to_state, _from_state)
            done, arrays = resumed.round, numpy_to_record(resumed.model)
            self._lips_history = history_from_json(resumed.history)
        result = run_start(self, grid, arrays, num_rounds, done, self._lips_history,  # type: ignore[arg-type]
                           timeout, train_config, evaluate_config, evaluate_fn)
        self._save_checkpoint(num_rounds, result.arrays)  # no configure_train follows the last round
        return result

    def _save_checkpoint(self, server_round: int, model: ArrayRecord) -> None:
        """Write the checkpoint after ``server_round`` (``model``: the global model then)."""
        if self._lips_keeper.path is not None:
            self._lips_keeper.save(self, self.sparsifier, server_round, record_views(model),
                                   _to_state, self._lips_history)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the global model (for ``dw``) and add the ``lips-*`` config keys.

        With a ``checkpoint_path``, first save the state reached after the
        previous round (its evaluation included, so that the resumed run draws
        the same random numbers).
        """
        self._lips_keeper.before_round()
        if self._lips_previous is None:
            check_model(self.sparsifier, record_to_numpy(arrays))
        self._save_checkpoint(server_round - 1, arrays)
        self._lips_previous = arrays
        config = ConfigRecord(dict(config))  # start() passes the same record every round
        needs_model = self.sparsifier.mode == "client" and self.sparsifier.schedule.tau(server_round) > 0
        model = record_to_numpy(arrays) if needs_model else {}
        config.update(self.sparsifier.client_config(server_round, model))
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluate messages; the run key added when checkpointing."""
        extra = self.sparsifier.evaluate_config(server_round)
        if extra:
            config = ConfigRecord({**dict(config), **extra})
        return super().configure_evaluate(server_round, arrays, config, grid)  # type: ignore[misc]

    def _weight_key(self) -> str | None:
        """The MetricRecord key the wrapped chain weights replies by (FedAvg's ``weighted_by_key``)."""
        for inner in strategy_chain(self):
            key = getattr(inner, "weighted_by_key", None)
            if isinstance(key, str):
                return key
        return None

    def _reply_problem(self, msg: Message, expected: dict, weight_key: str | None) -> str | None:
        """Why a reply must not be aggregated (see :func:`lips_flwr.validation.reply_problem`)."""
        records = list(msg.content.array_records.values())
        if len(records) != 1:
            return f"expected one ArrayRecord, got {len(records)}"
        reason = serialization_problem({n: a.stype for n, a in records[0].items()})
        if reason is not None:
            return reason
        num_examples = None
        if weight_key is not None:  # FedAvg and its family need one MetricRecord with the key
            metrics = list(msg.content.metric_records.values())
            if len(metrics) != 1:
                return f"expected one MetricRecord, got {len(metrics)}"
            num_examples = metrics[0].get(weight_key, MISSING)
        tensors = {n: a.data for n, a in records[0].items()}
        return reply_problem(expected, tensors, num_examples, weight_key or "num-examples")

    def _drop_mismatched(self, replies: list[Message]) -> list[Message]:
        """Drop (and log) replies that do not fit the global model or hold bad values.

        Names, count and shapes must match the global model; arrays must be
        numpy-serialized real numbers without NaN/Inf; when the wrapped
        strategy weights by a metric (``weighted_by_key``), the reply needs one
        MetricRecord with a positive, finite value for it.
        """
        if self._lips_previous is None:
            return replies
        expected = model_shapes({name: a.data for name, a in self._lips_previous.items()})
        weight_key = self._weight_key()
        kept = []
        for msg in replies:
            if not msg.has_error():
                reason = self._reply_problem(msg, expected, weight_key)
                if reason is not None:
                    log(WARNING, "LIPS: ignoring reply from node %s: %s",
                        msg.metadata.src_node_id, reason)
                    continue
            kept.append(msg)
        return kept

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate with the wrapped strategy, then sparsify on mask rounds."""
        replies = self._drop_mismatched(list(replies))
        before = snapshot_caches(self)
        arrays, metrics = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        if arrays is None:
            log_no_aggregate(server_round, self.sparsifier)
            return arrays, metrics
        masks = self.sparsifier.masks_aggregate(server_round)
        aggregate, previous = {}, None
        if self.sparsifier.needs_aggregate(server_round):
            # Layers are chosen in the global model's order: the aggregate's
            # follows whichever client replied first.
            # Read-only views of the records' bytes: sparsify copies what it masks.
            unordered = record_views(arrays)
            order = list(self._lips_previous) if self._lips_previous is not None else []
            order = order if set(order) == set(unordered) else list(unordered)
            aggregate = {name: unordered[name] for name in order}
            if masks and self._lips_previous is not None:
                previous = record_views(self._lips_previous)
        masked, lips_metrics = sparsify_aggregate(
            self, self.sparsifier, server_round, aggregate if masks else {}, previous, before,
            _cached_to_numpy, _numpy_to_cached,
        )
        if masked is not None:
            changed = [n for n in masked if masked[n] is not aggregate[n]]
            arrays = numpy_to_record(masked, arrays, changed, order=list(masked))
        lips_metrics.update(self.sparsifier.observe(server_round, masked or aggregate))
        reports = 0  # only a client-mode mask round logs it: count only then
        if self.sparsifier.mode == "client" and lips_metrics.get("lips-mask-round"):
            reports = sum(
                any("lips-client-zeros" in m for m in msg.content.metric_records.values())
                for msg in replies if not msg.has_error()
            )
        log_round(server_round, lips_metrics, self.sparsifier.mode, reports)
        self._lips_keeper.report(lips_metrics)
        metrics = MetricRecord() if metrics is None else metrics
        for key, value in lips_metrics.items():
            metrics[key] = value
        return arrays, metrics


class _Wrapper(Strategy):
    """A Strategy that delegates everything to ``self.strategy``."""

    strategy: Strategy

    def __getattr__(self, name: str) -> Any:
        # Reach the wrapped strategy's own API (e.g. a DP wrapper's privacy_spent()).
        if name == "strategy" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)


class LIPS(_LIPSMixin, _Wrapper):
    """LIPS transient sparsity around any Message API strategy.

    In server mode (the paper), on mask rounds the aggregate of the wrapped
    strategy is sparsified: in each eligible layer the fraction ``tau(t)`` of
    weights with the lowest score (``|dw * w|``, ``dw`` = aggregate minus the
    previous global model) is zeroed before the model is broadcast. In client
    mode the model stays dense and clients mask their own copy (use
    :func:`lips_flwr.clients.lips_mod`). Each round's ``lips-*`` metrics are
    merged into the aggregated train MetricRecord.

    Wrap the outermost layer: ``LIPS(DifferentialPrivacy...(FedAvg(...)))``.

    Parameters
    ----------
    strategy : Strategy
        The strategy whose aggregate is sparsified (FedAvg, FedProx, FedAdam,
        FedAvgM, the DP wrappers, ...).
    num_rounds : int, optional
        ``T`` of the schedule; by default the ``num_rounds`` given to ``start()``.
    tau0 : float (default: 0.5)
        Sparsity of the first mask round, in [0, 1). ``0`` reproduces ``strategy``.
    every : int (default: 5)
        Mask every ``every`` rounds (``k``), starting at ``start_round``.
    start_round : int (default: 1)
        First mask round.
    decay : str (default: "linear")
        ``tau(t) = tau0 * (1 - t/T)``; or ``"cosine"``, ``"constant"``.
    score : str (default: "sensitivity")
        ``"sensitivity"``, ``"magnitude"`` or ``"random"``.
    layers : str, list of str or callable (default: "middle")
        ``"middle"``, ``"all"``, ``"reference"``, names/glob patterns, or a
        predicate ``(name, array) -> bool``.
    mode : str (default: "server")
        ``"server"`` or ``"client"``.
    seed : int (default: 0)
        Seed of the random score.
    inertia_t0 : int, optional
        Add per-layer inertia metrics (``inertia-cos-t0/<layer>``: cosine
        similarity to the model of round ``inertia_t0``; ``inertia-cos-prev/<layer>``;
        ``inertia-step/<layer>``) to each round's train metrics; ``None``: off.
    checkpoint_path : str or PathLike, optional
        Save the strategy's state to this ``.npz`` file at the start of every
        round and after the last (atomically): the global model, the round,
        LIPS's layer choice, inertia series and run key, the wrapped
        strategies' state (model-shaped arrays such as FedAvgM's momentum,
        numbers that changed such as an adaptive clipping norm, objects with
        a JSON ``state_dict()`` such as a privacy accountant), the state of
        Python's and numpy's global RNGs and the metrics so far. See
        :mod:`lips_flwr.checkpoint` and :mod:`._strategy_state`.
    resume : bool or "auto" (default: False)
        ``True``: continue from ``checkpoint_path`` (it must exist); ``"auto"``:
        continue when it exists, else start at round 1. The checkpoint must
        come from a strategy with the same settings, ``num_rounds`` and model.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        num_rounds: int | None = None,
        tau0: float = 0.5,
        every: int = 5,
        start_round: int = 1,
        decay: str = "linear",
        score: str = "sensitivity",
        layers: LayerSpec = "middle",
        mode: str = "server",
        seed: int = 0,
        inertia_t0: int | None = None,
        checkpoint_path: str | None = None,
        resume: bool | str = False,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(
                "`strategy` must be a flwr.serverapp.strategy.Strategy (Message API); "
                f"got {type(strategy).__name__}. For legacy strategies use LegacyLIPS."
            )
        self.strategy = strategy
        self.sparsifier = TransientSparsifier(
            num_rounds=num_rounds, tau0=tau0, every=every, start_round=start_round,
            decay=decay, score=score, layers=layers, mode=mode, seed=seed, inertia_t0=inertia_t0,
        )
        self._init_checkpoint(checkpoint_path, resume)

    def __repr__(self) -> str:
        return f"LIPS({self.strategy!r})"


class LIPSFedAvg(_LIPSMixin, FedAvg):
    """FedAvg with LIPS built in: ``LIPSFedAvg(tau0=0.5, every=5, min_train_nodes=10)``.

    Takes the keyword arguments of :class:`LIPS` (``num_rounds``, ``tau0``,
    ``every``, ``start_round``, ``decay``, ``score``, ``layers``, ``mode``,
    ``seed``, ``inertia_t0``, ``checkpoint_path``, ``resume``) and passes all
    others to Flower's ``FedAvg``.
    """

    def __init__(self, **kwargs: Any) -> None:
        lips = {k: kwargs.pop(k) for k in LIPS_OPTIONS if k in kwargs}
        checkpoint = {k: kwargs.pop(k) for k in CHECKPOINT_OPTIONS if k in kwargs}
        self.sparsifier = TransientSparsifier(**lips)
        self._init_checkpoint(checkpoint.get("checkpoint_path"), checkpoint.get("resume", False))
        super().__init__(**kwargs)
