"""Strategies that delegate every call to the strategy they wrap (``self.strategy``), one per API.

``LIPS`` and ``LegacyLIPS`` put the LIPS hooks in front of these; any method
LIPS does not override reaches the wrapped strategy unchanged, and so does
any other attribute (a DP wrapper's ``privacy_spent()``, a FedAvg's settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

FitResults = list[tuple[ClientProxy, FitRes]]
FitFailures = list[tuple[ClientProxy, FitRes] | BaseException]
EvaluateResults = list[tuple[ClientProxy, EvaluateRes]]
EvaluateFailures = list[tuple[ClientProxy, EvaluateRes] | BaseException]


class Delegate:
    """Attribute access that falls through to the wrapped ``self.strategy``."""

    strategy: Any

    def __getattr__(self, name: str) -> Any:
        # Reach the wrapped strategy's own API (a DP wrapper's privacy_spent(), a FedAvg's settings).
        if name == "strategy" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.strategy, name)


class MessageWrapper(Delegate, Strategy):
    """A Strategy that delegates everything to ``self.strategy``."""

    strategy: Strategy

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


class LegacyWrapper(Delegate, LegacyStrategy):
    """A legacy Strategy that delegates everything to ``self.strategy``."""

    strategy: LegacyStrategy

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self, server_round: int, results: FitResults, failures: FitFailures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        return self.strategy.aggregate_fit(server_round, results, failures)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(
        self, server_round: int, results: EvaluateResults, failures: EvaluateFailures
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return self.strategy.evaluate(server_round, parameters)
