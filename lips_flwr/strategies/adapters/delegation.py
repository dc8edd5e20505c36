"""Strategies that pass every Flower call on to the strategy they wrap (``self.strategy``), one per API.

``LIPS`` and ``LegacyLIPS`` put the LIPS hooks in front of these. Delegation
is explicit, method by method, as in Flower's own DP wrappers
(``flwr.serverapp.strategy.dp_fixed_clipping``): what a wrapped strategy
offers beyond Flower's ``Strategy`` is reached through ``.strategy``
(``LIPS(FedAvg(...)).strategy.fraction_train``), except for
:meth:`MessageWrapper.privacy_spent`, which LIPS answers for a DP wrapper
inside it. Asking the wrapper for an attribute only the wrapped strategy has
is an ``AttributeError`` that says where it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

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


class Wrapper:
    """What both wrappers share: an attribute they lack is not looked up in the wrapped strategy."""

    strategy: Any

    def __getattr__(self, name: str) -> NoReturn:
        # Only reached when normal lookup fails: say where the attribute is, never return it.
        wrapped = vars(self).get("strategy")
        if name.startswith("__") or wrapped is None or not hasattr(wrapped, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}; the wrapped "
                             f"{type(wrapped).__name__} has it: .strategy.{name}")


class MessageWrapper(Wrapper, Strategy):
    """A Message API Strategy that delegates every call to ``self.strategy``."""

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

    def privacy_spent(self) -> Any:
        """The privacy spent so far by the DP wrapper LIPS wraps (Flower's ``privacy_spent()``, with
        an accountant); ``None`` when the wrapped strategy keeps no account."""
        spent = getattr(self.strategy, "privacy_spent", None)
        return spent() if callable(spent) else None


class LegacyWrapper(Wrapper, LegacyStrategy):
    """A legacy Strategy that delegates every call to ``self.strategy``."""

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


__all__ = ["EvaluateFailures", "EvaluateResults", "FitFailures", "FitResults", "LegacyWrapper",
           "MessageWrapper"]
