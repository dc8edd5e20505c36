"""An inertia-triggered schedule (beyond the paper): mask a layer only while it stagnates.

The paper masks every middle layer on a fixed schedule. With
``trigger="inertia"`` LIPS keeps the schedule's mask rounds and ``tau(t)``,
but on each of them masks only the middle layers whose movement has
collapsed compared with the first and last weight layers'. The rule, with
``W = trigger_window`` (default 3), ``k = every`` and ``f = trigger_factor``
(default 0.5), both fixed before any study result:

* ``r_l(t) = ||w_t - w_{t-1}|| / ||w_{t-1}||`` is layer ``l``'s relative step
  in round ``t``: ``w_t`` the round's unmasked aggregate, ``w_{t-1}`` the
  model the round started from (the previous round's broadcast model), for
  every weight layer (the ``layers="all"`` selection: the middle ones and the
  first and last). Round 1's step, away from the initial model, is left out
  of everything below: it is the step out of the initialization, not a
  measure of the layer's pace.
* the baseline ``b_l`` is the mean of ``r_l`` over rounds ``2..1+W``; nothing
  is masked in rounds ``t <= 1 + W`` (the baseline is not complete yet, and
  the recent window would be the baseline itself).
* the recent pace ``s_l(t)`` is the mean of ``r_l`` over the last ``k`` rounds
  with data: ``t-k+1..t`` in server mode (the decision follows round ``t``'s
  aggregate), ``t-k..t-1`` in client mode (the decision goes out with round
  ``t``'s train config, before its aggregate). The step of the first
  aggregate trained from a model in which ``l`` was masked is left out: the
  regrowth of the zeroed weights inflates it (in server mode the first step
  recorded after the mask round, normally the next round's; in client mode
  the mask round's own). When that leaves no
  step (``every=1`` right after a mask), ``l`` is not masked: there is no
  fresh evidence that it still stagnates.
* ``rho_l = s_l / b_l`` (undefined when ``b_l = 0`` or a mean has no value);
  the edge reference ``rho_edge`` is the mean of the defined ``rho`` of the
  first and last weight layers.
* a selected layer other than the first and last (they are the reference)
  stagnates when ``rho_l < f * rho_edge``; only stagnating layers are masked.
  When all layers slow down together (convergence) the ratios fall together
  and nothing is masked; when no layer stagnates the round is the wrapped
  strategy's.

:class:`InertiaTrigger` holds the series (plain floats, JSON-able through
:meth:`InertiaTrigger.state`) and makes the decision; :class:`~.lips.LIPSCore`
feeds it once per round.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRIGGERS = ("schedule", "inertia")
DEFAULT_WINDOW = 3
DEFAULT_FACTOR = 0.5


def validate_trigger(trigger: object, window: object, factor: object) -> tuple[str, int, float]:
    """Check the ``trigger``, ``trigger_window`` and ``trigger_factor`` options."""
    if not isinstance(trigger, str) or trigger not in TRIGGERS:
        raise ValueError(f"`trigger` must be one of {TRIGGERS}, got {trigger!r}")
    if isinstance(window, bool) or not isinstance(window, (int, numbers.Integral)) or window < 1:
        raise ValueError(f"`trigger_window` must be an integer >= 1, got {window!r}")
    if (isinstance(factor, bool) or not isinstance(factor, numbers.Real)
            or not 0.0 < float(factor) <= 1.0):  # also rejects NaN
        raise ValueError(f"`trigger_factor` must be a number in (0, 1], got {factor!r}")
    return trigger, int(window), float(factor)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclass
class TriggerDecision:
    """What the trigger decided for one mask round.

    Attributes
    ----------
    ready : bool
        The baseline is complete (``t > 1 + trigger_window``); before, nothing is masked.
    stagnant : list of str
        The selected layers to mask, in the model's order.
    ratios : dict
        ``rho_l`` of every weight layer that has one (the first and last included).
    edge : float or None
        ``rho_edge``, the reference; ``None`` when neither edge layer has a ratio.
    """

    ready: bool = False
    stagnant: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    edge: float | None = None

    def metrics(self) -> dict[str, int | float]:
        """``lips-trigger-stagnant``, ``lips-trigger-edge-ratio`` and ``lips-trigger-ratio/<layer>``."""
        out: dict[str, int | float] = {"lips-trigger-stagnant": len(self.stagnant)}
        if self.edge is not None:
            out["lips-trigger-edge-ratio"] = self.edge
        out.update({f"lips-trigger-ratio/{n}": r for n, r in self.ratios.items()})
        return out


class InertiaTrigger:
    """The series of relative steps and the stagnation decision (see the module docstring).

    Parameters
    ----------
    window : int (default: 3)
        ``W``: the baseline is the mean step over rounds ``2..1+W``.
    factor : float (default: 0.5)
        ``f``: a layer stagnates when its ratio is below ``f`` times the edge layers'.
    every : int (default: 5)
        ``k``: the recent pace is the mean step over the last ``k`` rounds.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, factor: float = DEFAULT_FACTOR, every: int = 5) -> None:
        _, self.window, self.factor = validate_trigger("inertia", window, factor)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"`every` must be an integer >= 1, got {every!r}")
        self.every = every
        self.baseline: dict[int, dict[str, float]] = {}  # round 2..1+W -> layer -> r_l
        self.recent: dict[int, dict[str, float]] = {}  # the last `every` rounds -> layer -> r_l
        self.last_mask: tuple[int, list[str]] | None = None  # (round, layers masked in it)

    @property
    def first_round(self) -> int:
        """The first round that may mask: ``2 + W``."""
        return self.window + 2

    # ------------------------------------------------------------------ series
    def record(self, server_round: int, steps: Mapping[str, float], exclude: Iterable[str] = ()) -> None:
        """Add round ``server_round``'s relative steps, but those of the layers in ``exclude``.

        Round 1 is not recorded, nor a round with a non-finite step (a broken
        aggregate says nothing about the layers' pace). Recording a round
        again replaces it.
        """
        if server_round < 2 or not all(math.isfinite(v) for v in steps.values()):
            return
        skip = set(exclude)
        values = {n: float(v) for n, v in steps.items() if n not in skip}
        if server_round <= 1 + self.window:
            self.baseline[server_round] = values
        self.recent[server_round] = values
        self.recent = {r: v for r, v in self.recent.items() if r > server_round - self.every}

    def note_mask(self, server_round: int, layers: Iterable[str]) -> None:
        """Remember which layers ``server_round`` masked (their next step is inflated)."""
        self.last_mask = (server_round, list(layers))

    def unmeasured_mask(self) -> list[str]:
        """The layers of the last mask when no step has been recorded since (server mode).

        The next step recorded is then the first from the masked model, the
        round right after the mask, or a later one when rounds in between had
        no aggregate (the masked model stayed the global one).
        """
        if self.last_mask is None or (self.recent and max(self.recent) > self.last_mask[0]):
            return []
        return list(self.last_mask[1])

    # ---------------------------------------------------------------- decision
    def decide(
        self, server_round: int, last_round: int, names: Sequence[str], layers: Iterable[str]
    ) -> TriggerDecision:
        """Which of ``layers`` stagnate at ``server_round``, from the steps up to ``last_round``.

        ``names`` are all weight layers in the model's order (the first and
        last are the reference); ``layers`` those LIPS may mask.
        """
        if server_round <= 1 + self.window:
            return TriggerDecision()
        ratios: dict[str, float] = {}
        window = [self.recent[r] for r in sorted(self.recent) if last_round - self.every < r <= last_round]
        baseline = [self.baseline[r] for r in sorted(self.baseline)]
        for name in names:
            base = _mean([steps[name] for steps in baseline if name in steps])
            pace = _mean([steps[name] for steps in window if name in steps])
            if base is not None and base > 0.0 and pace is not None:
                ratios[name] = pace / base
        edges = list(dict.fromkeys([names[0], names[-1]])) if names else []
        edge = _mean([ratios[n] for n in edges if n in ratios])
        stagnant = [] if edge is None else [
            n for n in layers if n not in edges and n in ratios and ratios[n] < self.factor * edge]
        return TriggerDecision(ready=True, stagnant=stagnant, ratios=ratios, edge=edge)

    # ------------------------------------------------------------------- state
    def state(self) -> dict:
        """The series and the last mask, JSON-able (what a checkpoint needs to continue)."""
        return {
            "window": self.window, "every": self.every,
            "baseline": [[r, dict(v)] for r, v in sorted(self.baseline.items())],
            "recent": [[r, dict(v)] for r, v in sorted(self.recent.items())],
            "last_mask": None if self.last_mask is None else [self.last_mask[0], list(self.last_mask[1])],
        }

    def load_state(
        self, state: Mapping[str, Any], names: Sequence[str], server_round: int | None = None
    ) -> None:
        """Continue from :meth:`state`, checked against these settings and the weight layers ``names``.

        ``server_round``, when known, is the last round the state has seen.
        Raises ``ValueError`` naming what does not fit.
        """
        baseline, recent, last_mask = check_trigger_state(
            state, self.window, self.every, names, server_round)
        self.baseline, self.recent, self.last_mask = baseline, recent, last_mask


def check_trigger_state(
    state: Any, window: int, every: int, names: Sequence[str], server_round: int | None = None,
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]], tuple[int, list[str]] | None]:
    """The parts of a saved trigger state, or ``ValueError`` naming what does not fit."""
    what = "the saved inertia-trigger state"
    if not isinstance(state, Mapping):
        raise ValueError(f"{what} is not a record: {type(state).__name__}")
    for key, live in (("window", window), ("every", every)):
        if state.get(key) != live:
            raise ValueError(f"{what} uses {'trigger_window' if key == 'window' else key}="
                             f"{state.get(key)!r}, this strategy {live}")
    known = set(names)
    parts = {}
    for part, rounds_ok, label in (
            ("baseline", lambda r: 2 <= r <= 1 + window, f"2..{1 + window}"),
            ("recent", lambda r: r >= 2, ">= 2")):
        series = state.get(part)
        if not isinstance(series, list):
            raise ValueError(f"{what}: {part} is not a list")
        out: dict[int, dict[str, float]] = {}
        for entry in series:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2
                    and isinstance(entry[0], int) and not isinstance(entry[0], bool)
                    and isinstance(entry[1], Mapping)):
                raise ValueError(f"{what}: malformed {part} entry {entry!r}")
            rnd, steps = entry
            if not rounds_ok(rnd) or rnd in out:
                raise ValueError(f"{what}: {part} round {rnd} is not one of the rounds {label} "
                                 "or appears twice")
            unknown = [n for n in steps if n not in known]
            if unknown:
                raise ValueError(f"{what}: {part} round {rnd} names {unknown[:5]}, which are not "
                                 f"weight layers of the model ({list(names)[:5]}...)")
            bad = [n for n, v in steps.items() if isinstance(v, bool) or not isinstance(v, (int, float))
                   or not math.isfinite(v) or v < 0]
            if bad:
                raise ValueError(f"{what}: {part} round {rnd} has steps that are not finite "
                                 f"numbers >= 0 for {bad[:5]}")
            out[rnd] = {n: float(v) for n, v in steps.items()}
        parts[part] = out
    recent = parts["recent"]
    if recent and max(recent) - min(recent) >= every:
        raise ValueError(f"{what}: its recent steps span rounds {min(recent)}..{max(recent)}, more "
                         f"than every={every} rounds")
    latest = [*recent, *parts["baseline"]]
    if server_round is not None and latest and max(latest) > server_round:
        raise ValueError(f"{what} has steps of round {max(latest)}, after the checkpoint's round "
                         f"{server_round}")
    last_mask = state.get("last_mask")
    mask: tuple[int, list[str]] | None = None
    if last_mask is not None:
        if not (isinstance(last_mask, (list, tuple)) and len(last_mask) == 2
                and isinstance(last_mask[0], int) and not isinstance(last_mask[0], bool)
                and isinstance(last_mask[1], list) and all(isinstance(n, str) for n in last_mask[1])):
            raise ValueError(f"{what}: malformed last mask {last_mask!r}")
        unknown = [n for n in last_mask[1] if n not in known]
        if unknown:
            raise ValueError(f"{what}: its last mask names {unknown[:5]}, which are not weight "
                             "layers of the model")
        if server_round is not None and last_mask[0] > server_round:
            raise ValueError(f"{what}: its last mask is of round {last_mask[0]}, after the "
                             f"checkpoint's round {server_round}")
        mask = (last_mask[0], list(last_mask[1]))
    return parts["baseline"], recent, mask


__all__ = [
    "DEFAULT_FACTOR", "DEFAULT_WINDOW", "InertiaTrigger", "TRIGGERS", "TriggerDecision",
    "check_trigger_state", "validate_trigger",
]
