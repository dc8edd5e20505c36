"""LIPS for Flower's legacy API (``aggregate_fit``): a wrapper and a FedAvg subclass.

Legacy ``Parameters`` are an unnamed list of serialized arrays, so the
strategy is given the names in the order clients send them
(``list(net.state_dict().keys())``); without names it uses positions and the
default rank-based layer rule, which needs no names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from flwr.common import EvaluateIns, FitIns, Parameters, Scalar, ndarrays_to_parameters
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg, Strategy

from ...core.checks import names_problem
from ...persistence.checkpoint import Checkpoint
from ..codecs import NAMES_HINT, LegacyCodec
from ..options import LIPSOptions, split_options
from ..replies.legacy_access import LegacyReplies
from .base import LIPSAdapter
from .delegation import EvaluateFailures, EvaluateResults, FitFailures, FitResults, LegacyWrapper

if TYPE_CHECKING:  # no runtime dependency: the annotations are strings
    from typing_extensions import Unpack

_M = TypeVar("_M", bound=Callable[..., Any])


def _ends_the_run_on_error(method: _M) -> _M:
    """An exception out of a Flower call ends a legacy run, which has no end hook: its checkpoint lock
    goes then (a thread pool keeps the failed run's traceback), as after its last round's save."""
    @functools.wraps(method)
    def call(self: _LegacyLIPSMixin, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._lips_keeper.release()
            raise
    return call  # type: ignore[return-value]


class _LegacyLIPSMixin(LIPSAdapter):
    """The legacy API's LIPS hooks; ``super()`` is the strategy whose aggregate is masked."""

    SAVE_AFTER_LAST_ROUND = True  # Flower's legacy Server calls no configure_fit after the last round
    param_names: list[str] | None
    _lips_resumed: Checkpoint | None = None

    def _init_legacy(self, param_names: Any, lips: dict[str, Any]) -> None:
        if lips.get("num_rounds") is None:
            raise ValueError("`num_rounds` is required by the legacy LIPS strategies: pass the "
                             "num_rounds of your ServerConfig (an integer >= 1)")
        if isinstance(param_names, str):
            raise ValueError("`param_names` must be a list of distinct strings, not one string")
        if param_names is not None:
            param_names = list(param_names)
            if not all(isinstance(n, str) for n in param_names) or len(set(param_names)) != len(param_names):
                raise ValueError("`param_names` must be a list of distinct strings")
        self.param_names = param_names
        self._init_lips(lips, LegacyCodec(param_names))
        # Read now: the ServerConfig needs rounds_left, and a bad file fails before any round.
        found = self._lips_keeper.begin(self, self.core)
        if found is not None:
            self._lips_resumed, self._lips_done = found, found.round

    @property
    def rounds_left(self) -> int:
        """Rounds still to run: ``num_rounds`` minus the checkpoint's (for ``ServerConfig``)."""
        return self.core.schedule.num_rounds - self._lips_done

    @_ends_the_run_on_error
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The wrapped strategy's initial model, or the checkpoint's when resuming."""
        initial = super().initialize_parameters(client_manager)  # type: ignore[misc]
        if self._lips_resumed is None:
            return initial
        checkpoint = self._lips_resumed
        if self.param_names is not None and list(checkpoint.model) != self.param_names:
            raise ValueError(
                f"the checkpoint {self._lips_keeper.path!r} holds arrays named "
                f"{list(checkpoint.model)[:3]}..., not `param_names`: another model")
        codec = self._lips_codec
        given = codec.views(initial) if initial is not None else None
        self._lips_keeper.restore(self, checkpoint, given, codec.to_arrays, codec.from_arrays)
        return ndarrays_to_parameters(list(checkpoint.model.values()))

    @_ends_the_run_on_error
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Remember the global model and add the ``lips-*`` keys to each FitIns."""
        server_round = self._round(server_round)
        if parameters.tensor_type != "numpy.ndarray":
            raise ValueError(f"LIPS reads numpy-serialized Parameters (tensor_type 'numpy.ndarray'), "
                             f"got {parameters.tensor_type!r}")
        extra = self._begin_round(server_round, parameters)
        instructions = super().configure_fit(server_round, parameters, client_manager)  # type: ignore[misc]
        return [(proxy, FitIns(ins.parameters, {**ins.config, **extra})) for proxy, ins in instructions]

    def _check_first_model(self, model: dict[str, np.ndarray]) -> None:
        self.summary()  # the legacy server never calls summary()
        reason = names_problem(model) if self.param_names is not None else None
        if reason is not None:
            raise ValueError(f"`param_names` do not match the model's arrays: {reason}; {NAMES_HINT}")
        super()._check_first_model(model)

    @_ends_the_run_on_error
    def aggregate_fit(
        self, server_round: int, results: FitResults, failures: FitFailures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Aggregate the usable results with the wrapped strategy, in the order they came, then let
        LIPS mask on mask rounds; results the reply gate drops move to ``failures``."""
        server_round = self._round(server_round)
        access = LegacyReplies(results, list(failures), server_round, self._lips_codec.views,
                               super().aggregate_fit)  # type: ignore[misc]
        parameters, metrics, lips_metrics = self._aggregate_round(server_round, access)
        if parameters is None:
            return parameters, metrics if metrics is not None else {}
        return parameters, {**(metrics or {}), **lips_metrics}

    @_ends_the_run_on_error
    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        server_round = self._round(server_round)
        instructions = super().configure_evaluate(  # type: ignore[misc]
            server_round, parameters, client_manager)
        extra = self._evaluate_keys(server_round)
        if not extra:
            return instructions
        return [(proxy, EvaluateIns(ins.parameters, {**ins.config, **extra}))
                for proxy, ins in instructions]

    @_ends_the_run_on_error
    def aggregate_evaluate(
        self, server_round: int, results: EvaluateResults, failures: EvaluateFailures
    ) -> tuple[float | None, dict[str, Scalar]]:
        """The wrapped strategy's evaluate aggregate; results with a bad ``num_examples`` move to failures,
        a bad loss or metric is left out as in the Message API (no good loss: the round's is ``None``,
        which Flower's server does not record)."""
        access = LegacyReplies(results, list(failures), server_round)
        results = self._lips_gate.admit_evaluate(access)
        any_loss = access.write_losses()
        loss, metrics = super().aggregate_evaluate(  # type: ignore[misc]
            self._round(server_round), results, access.failures)
        return (loss if any_loss else None), metrics

    @_ends_the_run_on_error
    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return super().evaluate(self._round(server_round), parameters)  # type: ignore[misc]


class LegacyLIPS(_LegacyLIPSMixin, LegacyWrapper):
    """LIPS around any legacy strategy: masks the aggregate after ``aggregate_fit``.

    Parameters
    ----------
    strategy : flwr.server.strategy.Strategy
        The legacy strategy whose aggregate is masked (FedAvg, FedProx,
        FedAdam, FedAvgM, the DP wrappers, ...).
    param_names : list[str], optional
        Names of the arrays in the order clients send them, e.g.
        ``list(net.state_dict().keys())``. Checked against the model's array
        count. Needed for name-based ``layers``; the default rule uses shapes.
    **options
        The keyword-only options of :class:`~lips_flwr.strategies.LIPS` (the
        README's Options table); ``num_rounds`` is required: the
        ``ServerConfig``'s. The checkpoint is read in the constructor; after a
        resume run ``ServerConfig(num_rounds=strategy.rounds_left)`` (Flower's
        loop counts from 1; LIPS passes the schedule's round on). A checkpoint
        holds the wrapped strategies' declared state, as with ``LIPS``.
    """

    def __init__(
        self, strategy: Strategy, *, param_names: list[str] | None = None, **options: Unpack[LIPSOptions]
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError("`strategy` must be a legacy flwr.server.strategy.Strategy; got "
                             f"{type(strategy).__name__}. For Message API strategies use LIPS.")
        self.strategy = strategy
        self._init_legacy(param_names, dict(options))

    def __repr__(self) -> str:
        return f"LegacyLIPS({self.strategy!r})"


class LegacyLIPSFedAvg(_LegacyLIPSMixin, FedAvg):
    """Legacy FedAvg that applies the decaying sensitivity mask after ``aggregate_fit``.

    Takes ``param_names`` and the LIPS keyword arguments of :class:`LegacyLIPS`;
    all other keyword arguments go to Flower's legacy ``FedAvg``.
    """

    def __init__(self, *, param_names: list[str] | None = None, **kwargs: Any) -> None:
        lips = split_options(kwargs)
        super().__init__(**kwargs)
        self._init_legacy(param_names, lips)

    def __repr__(self) -> str:
        return f"LegacyLIPSFedAvg(accept_failures={self.accept_failures})"


__all__ = ["LegacyLIPS", "LegacyLIPSFedAvg"]
