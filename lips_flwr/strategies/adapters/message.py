"""LIPS for Flower's Message API (``aggregate_train``): a wrapper around any Strategy.

Only what is particular to the Message API is here: its codec
(:class:`..codecs.MessageCodec`: ArrayRecords as ``name -> ndarray`` and back),
the keys replies are read by, and the ``start()`` loop (fresh or resumed,
:mod:`.message_loop`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import WARNING
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from ..._records import numpy_to_record
from ..chain import strategy_chain
from ..codecs import MessageCodec
from ..options import LIPSOptions, split_options
from ..replies.message_access import MessageReplies, in_arrival_order
from .base import LIPSAdapter
from .delegation import MessageWrapper
from .message_loop import empty_history, history_from_json, run_start

if TYPE_CHECKING:  # no runtime dependency: the annotations are strings
    from typing_extensions import Unpack


class _LIPSMixin(LIPSAdapter):
    """The Message API's LIPS hooks; ``super()`` is the strategy whose aggregate is masked."""

    # Rounds: these methods get the schedule's rounds from start()'s loop (.message_loop).

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
        if self.core.num_rounds is None:
            self.core.set_num_rounds(num_rounds)
        elif self.core.num_rounds != num_rounds:
            log(WARNING, "LIPS: schedule uses num_rounds=%d but start() runs %d rounds",
                self.core.num_rounds, num_rounds)
        keeper = self._lips_keeper
        try:  # however the run ends (a thread pool keeps a failed one's traceback), its lock goes
            resumed = keeper.begin(self, self.core)
            self._lips_done, arrays = 0, initial_arrays
            self._lips_history = None if keeper.path is None else empty_history()
            if resumed is not None:
                codec = self._lips_codec
                keeper.restore(self, resumed, codec.views(initial_arrays), codec.to_arrays, codec.from_arrays)
                self._lips_done, arrays = resumed.round, numpy_to_record(resumed.model)
                self._lips_history = history_from_json(resumed.history)
            result = run_start(self, grid, arrays, num_rounds, self._lips_done, self._lips_history,  # type: ignore[arg-type]
                               timeout, train_config, evaluate_config, evaluate_fn)
            self._save_checkpoint(num_rounds, result.arrays)  # no configure_train follows the last round
        finally:
            keeper.release()
        return result

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the global model (for ``dw``) and add the ``lips-*`` config keys."""
        config = ConfigRecord({**dict(config), **self._begin_round(server_round, arrays)})
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the usable replies with the wrapped strategy, in the order they came (error
        replies included), then let LIPS mask on mask rounds; the round's ``lips-*`` metrics join."""
        access = MessageReplies(list(replies), server_round, self._weight_key(),
                                super().aggregate_train, self._chain_key("arrayrecord_key"))  # type: ignore[misc]
        arrays, metrics, lips_metrics = self._aggregate_round(server_round, access)
        if arrays is not None:  # the round's lips-* metrics join the wrapped strategy's
            metrics = MetricRecord() if metrics is None else metrics
            for key, value in lips_metrics.items():
                metrics[key] = value
        return arrays, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The wrapped strategy's evaluate aggregate of the usable replies (weights and keys checked)."""
        access = MessageReplies(list(replies), server_round, self._weight_key())
        usable = self._lips_gate.admit_evaluate(access)
        return super().aggregate_evaluate(  # type: ignore[misc]
            server_round, in_arrival_order(access.replies, usable))

    def _weight_key(self) -> str | None:
        """The metric the wrapped chain weights replies by (Message FedAvg's ``weighted_by_key``)."""
        return self._chain_key("weighted_by_key")

    def _chain_key(self, setting: str) -> str | None:
        """A key the wrapped chain reads replies by (``weighted_by_key``, ``arrayrecord_key``: the
        record it sends the model in), from the outermost strategy that has it."""
        for inner in strategy_chain(self):
            key = getattr(inner, setting, None)
            if isinstance(key, str):
                return key
        return None

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluate messages; the run key added when checkpointing."""
        extra = self._evaluate_keys(server_round)
        if extra:
            config = ConfigRecord({**dict(config), **extra})
        return super().configure_evaluate(server_round, arrays, config, grid)  # type: ignore[misc]


class LIPS(_LIPSMixin, MessageWrapper):
    """LIPS transient sparsity around any Message API strategy.

    In server mode (the paper), on mask rounds the aggregate of the wrapped
    strategy is masked: in each selected layer the fraction ``tau(t)`` of
    weights with the lowest score (``|dw * w|``, ``dw`` = aggregate minus the
    previous global model) is zeroed before the model is broadcast. In client
    mode the model stays dense and clients mask their own copy (use
    :func:`lips_flwr.clients.lips_mod`). Each round's ``lips-*`` metrics are
    merged into the aggregated train MetricRecord.

    Wrap the outermost layer: ``LIPS(DifferentialPrivacy...(FedAvg(...)))``.
    A checkpoint holds the wrapped strategies' declared state: Flower's own
    strategies' is listed in :mod:`lips_flwr.strategies.flower_state`; a
    strategy of your own declares its state in a class attribute,
    ``lips_state = ("attr", ...)``, and what to leave out in ``lips_state_exclude``.

    Parameters
    ----------
    strategy : Strategy
        The strategy whose aggregate is masked (FedAvg, FedProx, FedAdam,
        FedAvgM, the DP wrappers, ...).
    **options
        Keyword-only: ``num_rounds``, ``tau0``, ``every``, ``start_round``, ``decay``,
        ``score``, ``layers``, ``mode``, ``seed``, ``inertia_t0``, ``trigger``,
        ``trigger_window``, ``trigger_factor``, ``checkpoint_path``, ``resume``,
        ``skip_undeclared_state``;
        the README's Options table is the one list of their meanings, defaults
        and allowed values. ``num_rounds`` defaults to the one given to
        ``start()``.
    """

    def __init__(self, strategy: Strategy, **options: Unpack[LIPSOptions]) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError("`strategy` must be a flwr.serverapp.strategy.Strategy (Message API); "
                             f"got {type(strategy).__name__}. For legacy strategies use LegacyLIPS.")
        self.strategy = strategy
        self._init_lips(options, MessageCodec())

    def summary(self) -> None:
        """Log the LIPS settings, then the wrapped strategy's."""
        super().summary()
        self.strategy.summary()

    def __repr__(self) -> str:
        return f"LIPS({self.strategy!r})"


class LIPSFedAvg(_LIPSMixin, FedAvg):
    """FedAvg with LIPS built in: ``LIPSFedAvg(tau0=0.5, every=5, min_train_nodes=10)``.

    Takes the keyword arguments of :class:`LIPS` (the README's Options table)
    and passes all others to Flower's ``FedAvg``.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._init_lips(split_options(kwargs), MessageCodec())
        super().__init__(**kwargs)

    def summary(self) -> None:
        """Log the LIPS settings, then FedAvg's."""
        LIPSAdapter.summary(self)
        FedAvg.summary(self)


__all__ = ["LIPS", "LIPSFedAvg"]
