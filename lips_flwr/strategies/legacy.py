"""LIPS for Flower's legacy API (``aggregate_fit``): a wrapper and a FedAvg subclass.

Legacy ``Parameters`` are an unnamed list of serialized arrays, so the
strategy is given the names in the order clients send them
(``list(net.state_dict().keys())``); without names it uses positions and the
default rank-based layer rule, which needs no names.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg, Strategy
from flwr.common import log

from ..checkpoint import Checkpoint
from ..layers import LayerSpec
from ..sparsifier import LIPS_OPTIONS, TransientSparsifier
from ..validation import model_shapes, names_problem, read_npy, reply_problem
from ._cache_sync import snapshot_caches
from ._common import check_model, log_no_aggregate, log_round, log_settings, sparsify_aggregate
from ._resume import CheckpointKeeper
from ._strategy_state import ndarray_state, ndarray_value

FitResults = list[tuple[ClientProxy, FitRes]]
FitFailures = list[tuple[ClientProxy, FitRes] | BaseException]


class _LegacyLIPSMixin:
    """The LIPS hooks; ``super()`` is the strategy whose aggregate is sparsified."""

    sparsifier: TransientSparsifier
    param_names: list[str] | None
    _lips_previous: Parameters | None = None
    _lips_shapes: dict[str, tuple[int, ...]] | None = None
    _lips_keeper: CheckpointKeeper
    _lips_resumed: Checkpoint | None = None
    _lips_done = 0  # rounds done before this run (from the checkpoint)

    def _init_lips(
        self, param_names: list[str] | None, lips: dict[str, Any],
        checkpoint_path: Any = None, resume_mode: Any = False,
    ) -> None:
        if lips.get("num_rounds") is None:
            raise ValueError(
                "`num_rounds` is required by the legacy LIPS strategies: pass the "
                "num_rounds of your ServerConfig (an integer >= 1)"
            )
        if isinstance(param_names, str):
            raise ValueError("`param_names` must be a list of distinct strings, not one string")
        if param_names is not None:
            param_names = list(param_names)
            if not all(isinstance(n, str) for n in param_names) or len(set(param_names)) != len(param_names):
                raise ValueError("`param_names` must be a list of distinct strings")
        self.param_names = param_names
        self.sparsifier = TransientSparsifier(**lips)
        self._lips_keeper = CheckpointKeeper(checkpoint_path, resume_mode)
        # Read now: the ServerConfig needs rounds_left, and a bad file fails before any round.
        found = self._lips_keeper.begin(self, self.sparsifier)
        if found is not None:
            self._lips_resumed, self._lips_done = found, found.round

    @property
    def rounds_left(self) -> int:
        """Rounds still to run: ``num_rounds`` minus the checkpoint's (for ``ServerConfig``)."""
        return self.sparsifier.schedule.num_rounds - self._lips_done

    def _round(self, server_round: int) -> int:
        """The schedule's round of the server loop's ``server_round`` (which counts from 1)."""
        shifted = server_round + self._lips_done
        if self._lips_done and shifted > self.sparsifier.schedule.num_rounds:
            raise ValueError(
                f"round {server_round} of this run is round {shifted} of the schedule, past "
                f"num_rounds={self.sparsifier.schedule.num_rounds}: the checkpoint has "
                f"{self._lips_done} rounds done, so run ServerConfig(num_rounds=strategy.rounds_left)"
            )
        return shifted

    def _names(self, parameters: Parameters) -> list[str]:
        count = len(parameters.tensors)
        if self.param_names is None:
            return [str(i) for i in range(count)]
        if len(self.param_names) != count:
            raise ValueError(
                f"`param_names` has {len(self.param_names)} names but the model has "
                f"{count} arrays; pass the names in the order the clients send them "
                "(e.g. list(net.state_dict().keys()))"
            )
        return self.param_names

    def _to_numpy(self, parameters: Parameters) -> dict[str, np.ndarray]:
        # Read-only views of the serialized bytes, no copy: LIPS only reads these.
        return dict(zip(self._names(parameters), map(read_npy, parameters.tensors)))

    def summary(self) -> None:
        """Log the LIPS settings in Flower's log-tree style."""
        log_settings("LIPS", self.sparsifier.describe())

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
        given = self._to_numpy(initial) if initial is not None else None
        self._lips_keeper.restore(self, checkpoint, given, self._to_state, self._from_state)
        return ndarrays_to_parameters(list(checkpoint.model.values()))

    def _save_checkpoint(self, server_round: int, parameters: Parameters) -> None:
        """Write the checkpoint after ``server_round`` (``parameters``: the global model then)."""
        if self._lips_keeper.path is not None:
            self._lips_keeper.save(self, self.sparsifier, server_round,
                                   self._to_numpy(parameters), self._to_state)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Remember the global model and add the ``lips-*`` keys to each FitIns.

        With a ``checkpoint_path``, first save the state reached after the
        previous round (its evaluation included, so that the resumed run draws
        the same random numbers).
        """
        server_round = self._round(server_round)
        self._lips_keeper.before_round()
        if parameters.tensor_type != "numpy.ndarray":
            raise ValueError(
                f"LIPS reads numpy-serialized Parameters (tensor_type 'numpy.ndarray'), "
                f"got {parameters.tensor_type!r}"
            )
        names = self._names(parameters)
        if self._lips_previous is None:  # the legacy server never calls summary()
            self.summary()
            model = self._to_numpy(parameters)
            reason = names_problem(model) if self.param_names is not None else None
            if reason is not None:
                raise ValueError(
                    f"`param_names` do not match the model's arrays: {reason}; pass the "
                    "names in the order the clients send them (e.g. "
                    "list(net.state_dict().keys()))"
                )
            check_model(self.sparsifier, model)
        self._save_checkpoint(server_round - 1, parameters)
        self._lips_previous = parameters
        self._lips_shapes = model_shapes(dict(zip(names, parameters.tensors)))
        needs_model = self.sparsifier.mode == "client" and self.sparsifier.schedule.tau(server_round) > 0
        model = self._to_numpy(parameters) if needs_model else {}
        extra = self.sparsifier.client_config(server_round, model)
        instructions = super().configure_fit(server_round, parameters, client_manager)  # type: ignore[misc]
        return [(proxy, FitIns(ins.parameters, {**ins.config, **extra})) for proxy, ins in instructions]

    def _split_mismatched(self, results: FitResults, failures: FitFailures) -> FitResults:
        """Move (and log) results that do not fit the global model or hold bad values to failures.

        The same checks as the Message API adapter (:func:`lips_flwr.validation.reply_problem`):
        count, shapes, readable real-number arrays without NaN/Inf, and a
        positive, finite ``num_examples``.
        """
        if self._lips_shapes is None:
            return results
        names = list(self._lips_shapes)
        kept = []
        for proxy, res in results:
            tensors = res.parameters.tensors
            if len(tensors) != len(names):
                reason = f"{len(tensors)} arrays, expected {len(names)}"
            else:
                reason = reply_problem(self._lips_shapes, dict(zip(names, tensors)),
                                       res.num_examples, "num_examples")
            if reason is None:
                kept.append((proxy, res))
            else:
                log(WARNING, "LIPS: ignoring reply from client %s: %s", proxy.cid, reason)
                failures.append((proxy, res))
        return kept

    def aggregate_fit(
        self, server_round: int, results: FitResults, failures: FitFailures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Aggregate with the wrapped strategy, then sparsify on mask rounds."""
        server_round = self._round(server_round)
        last = server_round == self.sparsifier.schedule.num_rounds
        failures = list(failures)
        results = self._split_mismatched(list(results), failures)
        before = snapshot_caches(self)
        parameters, metrics = super().aggregate_fit(server_round, results, failures)  # type: ignore[misc]
        if parameters is None:
            log_no_aggregate(server_round, self.sparsifier)
            if last and self._lips_previous is not None:
                self._save_checkpoint(server_round, self._lips_previous)
            return parameters, metrics
        masks = self.sparsifier.masks_aggregate(server_round)
        aggregate = self._to_numpy(parameters) if self.sparsifier.needs_aggregate(server_round) else {}
        previous = None
        if masks and self._lips_previous is not None:
            previous = self._to_numpy(self._lips_previous)
        masked, lips_metrics = sparsify_aggregate(
            self, self.sparsifier, server_round, aggregate if masks else {}, previous, before,
            self._cached_to_numpy, self._numpy_to_cached,
        )
        if masked is not None:
            parameters = ndarrays_to_parameters(list(masked.values()))
        lips_metrics.update(self.sparsifier.observe(server_round, masked or aggregate))
        reports = sum("lips-client-zeros" in (res.metrics or {}) for _, res in results)
        log_round(server_round, lips_metrics, self.sparsifier.mode, reports)
        if last:  # no configure_fit follows to save the final model
            self._save_checkpoint(server_round, parameters)
        self._lips_keeper.report(lips_metrics)
        return parameters, {**(metrics or {}), **lips_metrics}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        server_round = self._round(server_round)
        instructions = super().configure_evaluate(  # type: ignore[misc]
            server_round, parameters, client_manager)
        extra = self.sparsifier.evaluate_config(server_round)  # run key and round, when checkpointing
        if not extra:
            return instructions
        return [(proxy, EvaluateIns(ins.parameters, {**ins.config, **extra}))
                for proxy, ins in instructions]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return super().aggregate_evaluate(  # type: ignore[misc]
            self._round(server_round), results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return super().evaluate(self._round(server_round), parameters)  # type: ignore[misc]

    def _to_state(self, value: Any) -> tuple[str, dict[str, np.ndarray]] | None:
        if isinstance(value, Parameters):
            arrays = self._cached_to_numpy(value)
            return None if arrays is None else ("parameters", arrays)
        return ndarray_state(value)

    def _from_state(self, kind: str, arrays: dict[str, np.ndarray]) -> Any:
        if kind == "parameters":
            return ndarrays_to_parameters([np.array(a) for a in arrays.values()])
        return ndarray_value(kind, arrays)

    def _cached_to_numpy(self, value: Any) -> dict[str, np.ndarray] | None:
        if isinstance(value, Parameters):
            count = len(value.tensors)
            if not count or (self.param_names is not None and len(self.param_names) != count):
                return None
            return self._to_numpy(value)
        # FedOpt's 0-d entries (num_batches_tracked) come out as numpy scalars.
        if isinstance(value, list) and value and all(isinstance(v, (np.ndarray, np.generic)) for v in value):
            names = self.param_names
            if names is None or len(names) != len(value):
                names = [str(i) for i in range(len(value))]
            return {n: np.asarray(v) for n, v in zip(names, value)}
        return None

    def _numpy_to_cached(self, value: Any, arrays: dict[str, np.ndarray]) -> Any:
        if isinstance(value, Parameters):
            return ndarrays_to_parameters(list(arrays.values()))
        return list(arrays.values())


class _LegacyWrapper(Strategy):
    """A legacy Strategy that delegates everything to ``self.strategy``."""

    strategy: Strategy

    def __getattr__(self, name: str) -> Any:
        # Reach the wrapped strategy's own attributes (e.g. a FedAvg's min_fit_clients).
        if name == "strategy" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.strategy, name)

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
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        return self.strategy.evaluate(server_round, parameters)


class LegacyLIPS(_LegacyLIPSMixin, _LegacyWrapper):
    """LIPS around any legacy strategy: masks the aggregate after ``aggregate_fit``.

    Parameters
    ----------
    strategy : flwr.server.strategy.Strategy
        The legacy strategy whose aggregate is sparsified (FedAvg, FedProx,
        FedAdam, FedAvgM, the DP wrappers, ...).
    param_names : list[str], optional
        Names of the arrays in the order clients send them, e.g.
        ``list(net.state_dict().keys())``. Checked against the model's array
        count. Needed for name-based ``layers``; the default rule uses shapes.
    num_rounds : int
        ``T`` of the schedule: the ``num_rounds`` of the ``ServerConfig``.
    tau0, every, start_round, decay, score, layers, mode, seed, inertia_t0
        As in :class:`lips_flwr.strategies.LIPS`.
    checkpoint_path, resume
        As in :class:`lips_flwr.strategies.LIPS`. The checkpoint is read in
        the constructor. Flower's legacy server loop counts the rounds it
        runs from 1: give it ``ServerConfig(num_rounds=strategy.rounds_left)``;
        LIPS passes the schedule's round (``rounds done + i``) on to the
        wrapped strategy. The legacy ``History`` counts from 1.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        param_names: list[str] | None = None,
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
                "`strategy` must be a legacy flwr.server.strategy.Strategy; got "
                f"{type(strategy).__name__}. For Message API strategies use LIPS."
            )
        self.strategy = strategy
        self._init_lips(param_names, dict(
            num_rounds=num_rounds, tau0=tau0, every=every, start_round=start_round,
            decay=decay, score=score, layers=layers, mode=mode, seed=seed, inertia_t0=inertia_t0,
        ), checkpoint_path, resume)

    def __repr__(self) -> str:
        return f"LegacyLIPS({self.strategy!r})"


class LegacyLIPSFedAvg(_LegacyLIPSMixin, FedAvg):
    """Legacy FedAvg that applies the decaying sensitivity mask after ``aggregate_fit``.

    Takes ``param_names`` and the LIPS keyword arguments of :class:`LegacyLIPS`;
    all other keyword arguments go to Flower's legacy ``FedAvg``.
    """

    def __init__(
        self, *, param_names: list[str] | None = None, checkpoint_path: str | None = None,
        resume: bool | str = False, **kwargs: Any,
    ) -> None:
        lips = {k: kwargs.pop(k) for k in LIPS_OPTIONS if k in kwargs}
        super().__init__(**kwargs)
        self._init_lips(param_names, lips, checkpoint_path, resume)

    def __repr__(self) -> str:
        return f"LegacyLIPSFedAvg(accept_failures={self.accept_failures})"
