"""How the Message API adapter runs Flower's ``Strategy.start`` loop, fresh or resumed.

Flower's loop counts the rounds it runs from 1 and keeps each round's
metrics only in the ``Result`` it returns at the end. To resume after ``done``
rounds, the loop is given a stand-in for the strategy (:class:`_StartLoop`)
that passes the schedule's round (:meth:`.base.LIPSAdapter._round`, the
one shift both APIs use) to every strategy method, so that a subclass's
methods see the schedule's rounds too, and, when checkpointing, records what
each round returned, so that a checkpoint holds the metrics of the rounds it
covers and a resumed run returns the ``Result`` of the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from .base import LIPSAdapter

HISTORY_PARTS = ("train", "evaluate", "server")  # Result's three metric series


def empty_history() -> dict[str, dict[int, dict]]:
    return {part: {} for part in HISTORY_PARTS}


def history_from_json(saved: dict | None) -> dict[str, dict[int, dict]]:
    """A checkpoint's history (JSON: string round keys) as ``part -> round -> metrics``."""
    history = empty_history()
    for part in HISTORY_PARTS:
        for key, metrics in (saved or {}).get(part, {}).items():
            history[part][int(key)] = dict(metrics)
    return history


class _StartLoop:
    """The strategy as Flower's ``start()`` loop sees it (see the module docstring)."""

    def __init__(self, strategy: Strategy, done: int, history: dict | None) -> None:
        assert isinstance(strategy, LIPSAdapter)
        self._strategy, self._done, self._history = strategy, done, history
        self._round = strategy._round

    def _record(self, part: str, server_round: int, metrics: MetricRecord | None) -> None:
        if self._history is not None and metrics is not None:
            self._history[part][server_round] = dict(metrics)

    def summary(self) -> None:
        self._strategy.summary()

    def configure_train(self, server_round: int, *args: Any) -> Iterable[Message]:
        return self._strategy.configure_train(self._round(server_round), *args)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        arrays, metrics = self._strategy.aggregate_train(self._round(server_round), replies)
        self._record("train", self._round(server_round), metrics)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, *args: Any) -> Iterable[Message]:
        return self._strategy.configure_evaluate(self._round(server_round), *args)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        metrics = self._strategy.aggregate_evaluate(self._round(server_round), replies)
        self._record("evaluate", self._round(server_round), metrics)
        return metrics

    def evaluate_fn(
        self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None
    ) -> Callable[[int, ArrayRecord], MetricRecord | None] | None:
        """``evaluate_fn`` with the schedule's round numbers, its results recorded."""
        if evaluate_fn is None:
            return None

        def shifted(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            earlier = (self._history or {}).get("server", {}).get(self._done)
            if server_round == 0 and self._done and earlier is not None:
                # The checkpoint's model was evaluated before the crash: not again.
                return MetricRecord(earlier)
            metrics = evaluate_fn(self._round(server_round), arrays)
            self._record("server", self._round(server_round), metrics)
            return metrics

        return shifted


def run_start(  # pylint: disable=too-many-arguments
    strategy: Strategy, grid: Grid, arrays: ArrayRecord, num_rounds: int, done: int, history: dict | None,
    timeout: float, train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None,
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
) -> Result:
    """Run rounds ``done+1..num_rounds`` through Flower's loop; the Result numbers rounds as the
    schedule does. ``history`` (recorded into when not ``None``) holds the metrics of rounds
    ``<= done`` when resuming: they are put in front of the new ones."""
    # Flower logs "Starting <class name> strategy" from the loop object's class: the stand-in is
    # made an instance of a subclass named after the strategy.
    loop_class: type[_StartLoop] = type(type(strategy).__name__, (_StartLoop,), {})
    loop = loop_class(strategy, done, history)
    earlier = {part: dict(rounds) for part, rounds in (history or empty_history()).items()}
    result = Strategy.start(
        loop, grid, arrays, num_rounds - done, timeout,  # type: ignore[arg-type]
        train_config, evaluate_config, loop.evaluate_fn(evaluate_fn),
    )
    for part, series in zip(HISTORY_PARTS, (result.train_metrics_clientapp,
                                            result.evaluate_metrics_clientapp,
                                            result.evaluate_metrics_serverapp)):
        shifted = {r + done: m for r, m in series.items()}
        series.clear()
        series.update({r: MetricRecord(m) for r, m in sorted(earlier[part].items()) if r not in shifted})
        series.update(shifted)
    if not len(result.arrays):  # nothing ran: the checkpoint was at the last round
        result.arrays = arrays
    return result
