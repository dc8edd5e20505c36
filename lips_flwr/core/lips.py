"""The LIPS server-side algorithm: validated settings and one call per round (no flwr import).

:class:`LIPSCore` holds the hyperparameters; after each aggregation the
strategy adapters make one call, :meth:`LIPSCore.round`, with the round, the
aggregate and the previous global model, and get back a :class:`RoundOutcome`:
the model to broadcast, what was masked and the round's metrics. Everything
the adapters do with Flower records, the wire keys and files on disk lives
outside this module (:mod:`lips_flwr.strategies`, :mod:`lips_flwr.protocol`,
:mod:`lips_flwr.persistence`); the core's state is plain data
(:meth:`LIPSCore.state`).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .checks import nonfinite_arrays
from .inertia import InertiaTracker, update_norms
from .layers import LayerSpec, candidate_names, is_candidate, select_layers, validate_layers
from .masking import mask_layers, model_update
from .schedule import MaskSchedule
from .scores import validate_score

MODES = ("server", "client")
OPTIONS = (
    "num_rounds", "tau0", "every", "start_round", "decay", "score", "layers", "mode", "seed",
    "inertia_t0",
)

Model = Mapping[str, np.ndarray]


@dataclass
class RoundOutcome:
    """What one round's aggregate becomes (see :meth:`LIPSCore.round`).

    Attributes
    ----------
    model : dict or None
        The model to broadcast when LIPS changed the aggregate (a server-mode
        mask round): every tensor in the aggregate's order, unmasked tensors
        being the aggregate's own objects. ``None``: broadcast the aggregate
        as it is.
    masks : dict
        Per masked tensor, a boolean array, ``True`` where this round zeroed
        the broadcast model (the adapters zero the same positions in the
        wrapped strategies' caches).
    metrics : dict
        The round's ``lips-*`` (and, with ``inertia_t0``, ``inertia-*``)
        metrics; empty when there was no aggregate.
    problem : str or None
        Why a mask round masked nothing although it should have: no
        aggregate, or NaN/Inf in the aggregate or its update.
    """

    model: dict[str, np.ndarray] | None = None
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, int | float] = field(default_factory=dict)
    problem: str | None = None


class LIPSCore:
    """The LIPS hyperparameters, validated, and the per-round decisions.

    The options are those of the strategies, documented once in the README's
    Options table: ``num_rounds`` (``T``; may come later through
    :meth:`set_num_rounds`), ``tau0``, ``every``, ``start_round``, ``decay``,
    ``score``, ``layers``, ``mode``, ``seed``, ``inertia_t0``. Each invalid
    value raises ``ValueError`` naming the argument and its allowed range.
    """

    def __init__(
        self,
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
    ) -> None:
        # Validate everything up front, even when num_rounds comes later.
        if num_rounds is None:  # validate the rest now; T comes with start()
            ok_start = isinstance(start_round, int) and start_round >= 1
            horizon = start_round if ok_start else 1
        else:
            horizon = num_rounds
        check = MaskSchedule(horizon, tau0, every, start_round, decay)
        self.tau0 = check.tau0
        self.every = check.every
        self.start_round = check.start_round
        self.decay = decay
        self.score = validate_score(score)
        self.layers = validate_layers(layers)
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}")
        self.mode = mode
        # int listed too: typeshed does not register int as numbers.Integral, so mypy
        # would take everything after this check for unreachable.
        if isinstance(seed, bool) or not isinstance(seed, (int, numbers.Integral)) or seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        if inertia_t0 is not None and (
                isinstance(inertia_t0, bool) or not isinstance(inertia_t0, int) or inertia_t0 < 1):
            raise ValueError(f"`inertia_t0` must be None or an integer >= 1, got {inertia_t0!r}")
        self.inertia = None if inertia_t0 is None else InertiaTracker(inertia_t0)
        self._schedule: MaskSchedule | None = None
        if num_rounds is not None:
            self.set_num_rounds(num_rounds)
        self._layer_cache: tuple[tuple, list[str]] | None = None

    # ----------------------------------------------------------------- schedule
    def set_num_rounds(self, num_rounds: int) -> None:
        """Fix ``T``, the schedule's horizon."""
        self._schedule = MaskSchedule(num_rounds, self.tau0, self.every, self.start_round, self.decay)
        self._check_inertia_t0()

    def _check_inertia_t0(self) -> None:
        # A reference round after the last round would never be recorded: every
        # inertia-cos-t0 metric would silently be missing.
        schedule = self._schedule
        if self.inertia is not None and schedule is not None and self.inertia.t0 > schedule.num_rounds:
            raise ValueError(f"`inertia_t0` must be <= num_rounds={schedule.num_rounds}, "
                             f"got {self.inertia.t0}")

    @property
    def num_rounds(self) -> int | None:
        return None if self._schedule is None else self._schedule.num_rounds

    @property
    def schedule(self) -> MaskSchedule:
        if self._schedule is None:
            raise ValueError(
                "LIPS does not know `num_rounds`: pass num_rounds=... to the LIPS "
                "strategy, or run it through strategy.start(num_rounds=...)"
            )
        return self._schedule

    # ------------------------------------------------------------------- layers
    def layer_names(self, model: Model) -> list[str]:
        """The tensors to mask in this model.

        The choice is made on the first model seen with these names and
        shapes (the adapters show the initial global model first) and kept
        while they stay the same, whatever the dtypes become: Flower's
        Message API FedAvg returns integer buffers as float64, which must not
        make them eligible from round 2 on. A kept layer is skipped in a model
        where it is no longer eligible.
        """
        signature = tuple((n, np.shape(a)) for n, a in model.items())
        if self._layer_cache is None or self._layer_cache[0] != signature:
            self._layer_cache = (signature, select_layers(model, self.layers))
        return [n for n in self._layer_cache[1] if is_candidate(n, model[n])]

    # -------------------------------------------------------------- round calls
    def client_plan(self, server_round: int, model: Model) -> dict:
        """What clients need to mask their own copy this round (client mode), else ``{}``.

        ``{"tau": tau}``, plus on a mask round ``score``, ``seed`` and
        ``layers`` (the masked tensors' positions in ``model``'s order): the
        arguments of :func:`lips_flwr.protocol.train_config`.
        """
        if self.mode != "client":
            return {}
        tau = self.schedule.tau(server_round)
        if tau <= 0.0:
            return {"tau": tau}
        position = {name: i for i, name in enumerate(model)}
        layers = [position[n] for n in self.layer_names(model)]
        return {"tau": tau, "score": self.score, "seed": self.seed, "layers": layers}

    def round(
        self, server_round: int, aggregate: Model | None, previous: Model | None,
        *, aggregate_finite: bool = False,
    ) -> RoundOutcome:
        """Everything LIPS does with one round's aggregate, in one call.

        Parameters
        ----------
        server_round : int
            The schedule's round (1-based).
        aggregate : Mapping[str, np.ndarray] or None
            The wrapped strategy's aggregate, in the global model's order;
            ``None`` when nothing was aggregated. Not modified (read-only views
            are fine: masking copies what it changes).
        previous : Mapping[str, np.ndarray] or None
            The global model the round started from: ``dw = aggregate - previous``
            for the sensitivity score.
        aggregate_finite : bool (default: False)
            The caller has checked that the aggregate holds no NaN/Inf (the
            strategies do, on every round): skip that pass over the model.

        In server mode on a mask round (``tau(t) > 0``) the fraction ``tau(t)``
        of each selected layer with the lowest score is zeroed. An aggregate
        with NaN or Inf in a floating-point tensor (or whose update ``dw``
        has them in a layer to mask) is not masked: ranking garbage would hide
        it. The round then reports ``lips-mask-round`` 0, ``lips-skipped`` 1
        and the reason in :attr:`RoundOutcome.problem`. Inertia (with
        ``inertia_t0``) is observed on the *unmasked* aggregate; on a mask
        round ``lips-mask-change/<layer>`` then reports apart how far the mask
        moved each layer (``||masked - aggregate|| / ||aggregate||``).
        """
        start = time.perf_counter()
        tau = self.schedule.tau(server_round)
        on_server = self.mode == "server" and tau > 0.0
        if aggregate is None:
            problem = "no aggregate (no usable reply)" if on_server else None
            return RoundOutcome(problem=problem)
        metrics: dict[str, int | float] = {
            # A scheduled round whose tau is 0 (tau0=0, past T) masks nothing: not a mask round.
            "lips-mask-round": int(tau > 0.0),
            "lips-tau": tau,
        }
        outcome = RoundOutcome(metrics=metrics)
        zeros: dict[str, int] = {}
        if on_server:
            layers = self.layer_names(aggregate)
            if self.score == "sensitivity" and previous is None:
                raise RuntimeError(
                    "LIPS needs the previous global model to compute the update "
                    "dw; configure_train was not called before aggregate_train"
                )
            updates = None
            problem = None if aggregate_finite else _nonfinite_reason("the aggregate", aggregate)
            if problem is None and self.score == "sensitivity":
                assert previous is not None
                updates = model_update(aggregate, previous, layers)
                problem = _nonfinite_reason(
                    "the update dw (aggregate - previous global model)", updates)
            if problem is None:
                masked, zeros = mask_layers(
                    aggregate, layers, tau, score=self.score, updates=updates,
                    seed=self.seed, salt=(server_round,),
                )
                outcome.model = masked
                outcome.masks = {n: masked[n] == 0 for n in masked if masked[n] is not aggregate[n]}
            else:
                metrics["lips-mask-round"] = 0
                metrics["lips-skipped"] = 1
                outcome.problem = problem
        metrics["lips-zeros"] = int(sum(zeros.values()))
        metrics["lips-layers-masked"] = len(zeros)
        metrics.update({f"lips-zeros/{name}": int(z) for name, z in zeros.items()})
        if self.inertia is not None:
            metrics.update(self.inertia.update(server_round, aggregate, candidate_names(aggregate)))
            if outcome.model is not None:
                metrics.update(_mask_change(aggregate, outcome.model, outcome.masks))
        metrics["lips-seconds"] = time.perf_counter() - start
        return outcome

    # -------------------------------------------------------------------- state
    def settings(self) -> dict:
        """The hyperparameters a resumed run must share with its checkpoint (JSON-able)."""
        layers = self.layers
        if callable(layers):
            layers = f"callable {getattr(layers, '__qualname__', type(layers).__name__)}"
        return {
            "tau0": self.tau0, "every": self.every, "start_round": self.start_round,
            "decay": self.decay, "score": self.score,
            "layers": layers if isinstance(layers, str) else list(layers),
            "mode": self.mode, "seed": self.seed,
            "inertia_t0": None if self.inertia is None else self.inertia.t0,
        }

    def state(self) -> dict:
        """What a resumed run needs to continue: ``{"layers": [...] | None, "inertia": {...} | None}``."""
        return {
            "layers": None if self._layer_cache is None else list(self._layer_cache[1]),
            "inertia": None if self.inertia is None else self.inertia.state(),
        }

    def load_state(self, state: Mapping, model: Model) -> None:
        """Continue from :meth:`state` saved with the global model ``model``."""
        if state.get("layers") is not None:
            signature = tuple((n, np.shape(a)) for n, a in model.items())
            self._layer_cache = (signature, list(state["layers"]))
        if self.inertia is not None and state.get("inertia") is not None:
            self.inertia.load_state(state["inertia"])

    def describe(self) -> list[tuple[str, object]]:
        """(label, value) pairs for the adapters' ``summary()`` log tree."""
        rounds: object = self._schedule.mask_rounds() if self._schedule else "after start()"
        if isinstance(rounds, list) and len(rounds) > 8:
            rounds = f"{rounds[:4]} ... {rounds[-1]} ({len(rounds)} rounds)"
        layers = self.layers if isinstance(self.layers, (str, tuple)) else "custom predicate"
        return [
            ("Mode", self.mode),
            ("Schedule", f"tau0={self.tau0}, every={self.every}, decay={self.decay}, "
                         f"start_round={self.start_round}, num_rounds={self.num_rounds}"),
            ("Mask rounds", rounds),
            ("Score", self.score),
            ("Layers", layers),
            ("Seed", self.seed),
            ("Inertia metrics", "off" if self.inertia is None else f"t0={self.inertia.t0}"),
        ]


def _nonfinite_reason(what: str, arrays: Model) -> str | None:
    """Why ``arrays`` must not be ranked (NaN/Inf in a float tensor), or ``None``."""
    bad = nonfinite_arrays(arrays)
    return f"{what} has NaN or Inf in {bad[:5]}" if bad else None


def _mask_change(aggregate: Model, masked: Model, masks: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``lips-mask-change/<layer>``: the mask's relative change of each masked layer."""
    removed = update_norms({n: np.where(masks[n], aggregate[n], 0) for n in masks})
    sizes = update_norms({n: aggregate[n] for n in masks})
    return {f"lips-mask-change/{n}": removed[n] / sizes[n] if sizes[n] > 0 else 0.0 for n in masks}


__all__ = ["LIPSCore", "MODES", "OPTIONS", "RoundOutcome"]
