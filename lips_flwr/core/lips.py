"""The LIPS server-side algorithm: validated settings and one call per round (no flwr import).

:class:`LIPSCore` holds the hyperparameters; after each aggregation the
strategy adapters make one call, :meth:`LIPSCore.round`, with the round, the
aggregate and the previous global model, and get back a
:class:`~.outcome.RoundOutcome`: the model to broadcast, what was masked and
the round's metrics. Everything the adapters do with Flower records, the
wire keys and files on disk lives outside this module
(:mod:`lips_flwr.strategies`, :mod:`lips_flwr.protocol`,
:mod:`lips_flwr.persistence`); the core's state is plain data
(:meth:`LIPSCore.state`).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping

import numpy as np

from .checks import nonfinite_arrays
from .inertia import InertiaTracker, relative_steps
from .layers import LayerSpec, candidate_names, is_candidate, select_layers, validate_layers
from .masking import mask_layers, model_update
from .outcome import Model, RoundOutcome, ZeroPositions, mask_change
from .schedule import MaskSchedule
from .scores import needs_update, validate_score
from .trigger import DEFAULT_FACTOR, DEFAULT_WINDOW, InertiaTrigger, TriggerDecision, validate_trigger

MODES = ("server", "client")
OPTIONS = (
    "num_rounds", "tau0", "every", "start_round", "decay", "score", "layers", "mode", "seed",
    "inertia_t0", "mask_last_round",
)
# The inertia trigger's options (beyond the paper; lips_flwr.core.trigger).
TRIGGER_OPTIONS = ("trigger", "trigger_window", "trigger_factor")


class LIPSCore:
    """The LIPS hyperparameters, validated, and the per-round decisions.

    The options are those of the strategies, documented once in the README's
    Options table: ``num_rounds`` (``T``; may come later through
    :meth:`set_num_rounds`), ``tau0``, ``every``, ``start_round``, ``decay``,
    ``score``, ``layers``, ``mode``, ``seed``, ``inertia_t0``,
    ``mask_last_round``, and the inertia trigger's ``trigger``,
    ``trigger_window``, ``trigger_factor`` (:mod:`.trigger`). Each invalid
    value raises ``ValueError`` naming the argument and its allowed range.

    In server mode the final round (``num_rounds``) is never a mask round
    unless ``mask_last_round=True``: the model returned after it would be
    freshly masked, with no round left to regrow. In client mode the final
    round masks as scheduled: the clients train after their mask.
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
        mask_last_round: bool = False,
        trigger: str = "schedule",
        trigger_window: int = DEFAULT_WINDOW,
        trigger_factor: float = DEFAULT_FACTOR,
    ) -> None:
        # Validate everything up front, even when num_rounds comes later.
        if num_rounds is None:  # validate the rest now; T comes with start()
            ok_start = isinstance(start_round, int) and start_round >= 1
            horizon = start_round if ok_start else 1
        else:
            horizon = num_rounds
        check = MaskSchedule(horizon, tau0, every, start_round, decay, mask_last_round)
        self.mask_last_round = mask_last_round
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
        self.trigger, self.trigger_window, self.trigger_factor = validate_trigger(
            trigger, trigger_window, trigger_factor)
        # The series of relative steps the inertia trigger decides on; None: the paper's schedule.
        self.inertia_trigger = None if self.trigger == "schedule" else InertiaTrigger(
            self.trigger_window, self.trigger_factor, self.every)
        self._schedule: MaskSchedule | None = None
        if num_rounds is not None:
            self.set_num_rounds(num_rounds)
        self._layer_cache: tuple[tuple, list[str]] | None = None

    # ----------------------------------------------------------------- schedule
    def set_num_rounds(self, num_rounds: int) -> None:
        """Fix ``T``, the schedule's horizon (in server mode its last round masks only with
        ``mask_last_round``; client mode masks it as scheduled, the clients train after their mask)."""
        self._schedule = MaskSchedule(num_rounds, self.tau0, self.every, self.start_round, self.decay,
                                      mask_last_round=self.mask_last_round or self.mode == "client")
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
        names = self.layer_names(model)
        if self.inertia_trigger is not None:
            names = self._trigger_decision(server_round, model).stagnant
            if not names:  # no layer stagnates: the clients train as without LIPS
                return {"tau": 0.0}
        position = {name: i for i, name in enumerate(model)}
        layers = [position[n] for n in names]
        return {"tau": tau, "score": self.score, "seed": self.seed, "layers": layers}

    def _trigger_decision(self, server_round: int, model: Model) -> TriggerDecision:
        """The inertia trigger's decision for a mask round (same state: same decision).

        Server mode decides after the round's aggregate, on the steps up to
        ``server_round``; client mode before it (the decision goes out with
        the train config), on the steps up to ``server_round - 1``.
        """
        assert self.inertia_trigger is not None
        last = server_round if self.mode == "server" else server_round - 1
        return self.inertia_trigger.decide(
            server_round, last, candidate_names(model), self.layer_names(model))

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
            for a score that needs it (:func:`.scores.needs_update`).
        aggregate_finite : bool (default: False)
            The caller has checked that the aggregate holds no NaN/Inf (the
            strategies do, on every round): skip that pass over the model.

        In server mode on a mask round (``tau(t) > 0``) the fraction ``tau(t)``
        of each selected layer with the lowest score is zeroed. An aggregate
        with NaN or Inf in a floating-point tensor (or whose update ``dw``
        has them in a layer to mask) is not masked: ranking garbage would hide
        it. The round then reports ``lips-mask-round`` 0, ``lips-skipped`` 1
        and the reason in :attr:`~.outcome.RoundOutcome.problem`. Inertia (with
        ``inertia_t0``) is observed on the *unmasked* aggregate; on a mask
        round ``lips-mask-change/<layer>`` then reports apart how far the mask
        moved each layer (``||masked - aggregate|| / ||aggregate||``), and
        ``inertia-rel-step/<layer>`` the aggregate's relative step from
        ``previous``. With ``trigger="inertia"`` a mask round masks (server
        mode) or reports as sent to clients (client mode) only the layers that
        stagnate (:mod:`.trigger`); the round's relative steps feed the
        trigger's series.
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
        steps = None
        if (self.inertia is not None or self.inertia_trigger is not None) and previous is not None:
            steps = relative_steps(aggregate, previous, [
                n for n in candidate_names(aggregate)
                if n in previous and np.shape(previous[n]) == np.shape(aggregate[n])])
        if self.inertia_trigger is not None:
            outcome.decision = self._trigger_round(server_round, aggregate, steps, tau)
        if on_server and needs_update(self.score) and previous is None:
            raise RuntimeError(
                "LIPS needs the previous global model to compute the update "
                "dw; configure_train was not called before aggregate_train"
            )
        # With the trigger, a mask round where no layer stagnates broadcasts the aggregate as it is.
        if on_server and (outcome.decision is None or outcome.decision.stagnant):
            layers = self.layer_names(aggregate) if outcome.decision is None else outcome.decision.stagnant
            updates = None
            problem = None if aggregate_finite else _nonfinite_reason("the aggregate", aggregate)
            if problem is None and needs_update(self.score):
                assert previous is not None
                updates = model_update(aggregate, previous, layers)
                problem = _nonfinite_reason(
                    "the update dw (aggregate - previous global model)", updates)
            if problem is None:
                masked, zeros = mask_layers(
                    aggregate, layers, tau, score=self.score, updates=updates,
                    seed=self.seed, salt=(server_round,), reuse_updates=True,  # (dw is read no more)
                )
                outcome.model = masked
                outcome.masks = ZeroPositions(masked, [n for n in masked if masked[n] is not aggregate[n]])
            else:
                metrics["lips-mask-round"] = 0
                metrics["lips-skipped"] = 1
                outcome.problem = problem
        if on_server and self.inertia_trigger is not None:
            self.inertia_trigger.note_mask(server_round, zeros)
        metrics["lips-zeros"] = int(sum(zeros.values()))
        metrics["lips-layers-masked"] = len(zeros)
        metrics.update({f"lips-zeros/{name}": int(z) for name, z in zeros.items()})
        if self.inertia is not None:
            metrics.update(self.inertia.update(server_round, aggregate, candidate_names(aggregate)))
            if steps is not None:
                metrics.update({f"inertia-rel-step/{n}": v for n, v in steps.items()})
            if outcome.model is not None:
                metrics.update(mask_change(aggregate, outcome.model, outcome.masks))
        if outcome.decision is not None:
            metrics.update(outcome.decision.metrics())
        metrics["lips-seconds"] = time.perf_counter() - start
        return outcome

    def _trigger_round(
        self, server_round: int, aggregate: Model, steps: Mapping[str, float] | None, tau: float
    ) -> TriggerDecision | None:
        """Feed the round's relative steps to the trigger; its decision on a mask round, else ``None``.

        A step measured from a model in which the layer was masked is left
        out: in server mode the first step recorded after a mask round (the
        round after it, unless that round had no aggregate), in client mode
        the step of the mask round itself (clients trained from their masked
        copy).
        """
        trigger = self.inertia_trigger
        assert trigger is not None
        if self.mode == "client":  # decided before the aggregate: what client_plan sent
            decision = self._trigger_decision(server_round, aggregate) if tau > 0.0 else None
            masked = [] if decision is None else decision.stagnant
            if steps is not None:
                trigger.record(server_round, steps, exclude=masked)
            if decision is not None:
                trigger.note_mask(server_round, masked)
            return decision
        if steps is not None:
            trigger.record(server_round, steps, exclude=trigger.unmeasured_mask())
        return self._trigger_decision(server_round, aggregate) if tau > 0.0 else None

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
            # Only when set: checkpoints of the default keep the settings they had before the option.
            **({"mask_last_round": True} if self.mask_last_round else {}),
            # Only with the trigger: a checkpoint of the paper's schedule keeps the settings
            # it had before the trigger existed (and resumes with or without this version).
            **({} if self.inertia_trigger is None else {
                "trigger": self.trigger, "trigger_window": self.trigger_window,
                "trigger_factor": self.trigger_factor}),
        }

    def state(self) -> dict:
        """What a resumed run needs to continue.

        ``{"layers": [...] | None, "inertia": {...} | None, "trigger": {...} | None}``;
        the trigger's part is JSON-able (:meth:`.trigger.InertiaTrigger.state`).
        """
        return {
            "layers": None if self._layer_cache is None else list(self._layer_cache[1]),
            "inertia": None if self.inertia is None else self.inertia.state(),
            "trigger": None if self.inertia_trigger is None else self.inertia_trigger.state(),
        }

    def load_state(self, state: Mapping, model: Model, server_round: int | None = None) -> None:
        """Continue from :meth:`state` saved with the global model ``model`` (after ``server_round``).

        Raises ``ValueError`` when the trigger's state does not fit this
        core's settings or the model's weight layers, or is missing while
        ``trigger="inertia"``.
        """
        if self.inertia_trigger is not None:
            saved = state.get("trigger")
            if saved is None:
                raise ValueError("the saved state has no inertia-trigger series, which "
                                 "trigger='inertia' needs to continue")
            self.inertia_trigger.load_state(saved, candidate_names(model), server_round)
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
            *([] if self.inertia_trigger is None else [
                ("Trigger", f"inertia (window={self.trigger_window}, factor={self.trigger_factor}): "
                            f"masks stagnating layers from round {self.inertia_trigger.first_round}")]),
        ]


def _nonfinite_reason(what: str, arrays: Model) -> str | None:
    """Why ``arrays`` must not be ranked (NaN/Inf in a float tensor), or ``None``."""
    bad = nonfinite_arrays(arrays)
    return f"{what} has NaN or Inf in {bad[:5]}" if bad else None


__all__ = ["LIPSCore", "MODES", "OPTIONS", "TRIGGER_OPTIONS"]
