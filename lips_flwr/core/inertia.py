"""Layer-wise inertia diagnostics: similarities and update norms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from .dots import difference_norm, dot, norm


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, accumulated in float64; 0 if either is all zero."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    denom = norm(x) * norm(y)
    return dot(x, y) / denom if denom > 0 else 0.0


def layer_similarities(
    current: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], names: Iterable[str]
) -> dict[str, float]:
    """Per-layer cosine similarity of ``current`` to ``reference``."""
    return {name: cosine_similarity(current[name], reference[name]) for name in names}


def update_norms(updates: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per-layer L2 norm of an update, in float64 (:func:`.dots.norm`: ``np.linalg.norm``'s
    formula, without a BLAS thread)."""
    return {name: norm(update) for name, update in updates.items()}


def relative_step(current: np.ndarray, start: np.ndarray) -> float | None:
    """One layer's relative step ``||current - start|| / ||start||``, in float64; ``None`` when
    ``||start|| = 0`` (a step from nothing has no relative size).

    The one formula of the package: the core's :func:`relative_steps` (metrics
    and the inertia trigger) and the runner's observer
    (:mod:`lips_flwr.experiments.runner.observe`) both call it, and each says
    what it makes of ``None``.
    """
    size = norm(start)
    if not size > 0:  # (zero, or NaN)
        return None
    # (the difference in float64, a block at a time for a large layer: no float64 copies of the two)
    return difference_norm(np.ravel(current), np.ravel(start), np.dtype(np.float64)) / size


def relative_steps(
    current: Mapping[str, np.ndarray], start: Mapping[str, np.ndarray], names: Iterable[str]
) -> dict[str, float]:
    """Per-layer :func:`relative_step`; 0 when ``||start|| = 0``.

    ``current`` is a round's (unmasked) aggregate, ``start`` the model the
    round started from (the previous round's broadcast model). A zero-norm
    layer counts as not moving (0.0, not ``None``): a Flower metric must be a
    number, and the inertia trigger's series take every layer each round.
    The runner's observer keeps ``None`` there instead, so that its reports
    leave the layer's round out rather than count it as stagnant.
    """
    steps = {}
    for name in names:
        step = relative_step(current[name], start[name])
        steps[name] = 0.0 if step is None else step
    return steps


class InertiaTracker:
    """Per-round, per-layer inertia metrics of the global model.

    Each call to :meth:`update` with the model broadcast after a round gives,
    for each tracked layer, the cosine similarity to the model of the
    reference round ``t0`` (the paper's Figure 1: middle layers staying above
    ~0.95 is the inertia signature), the cosine similarity to the previous
    round's model, and the norm of the round's change. Holds two models (the
    reference and the previous one); O(model size) per round. The relative
    step against the model the round started from (``inertia-rel-step``)
    needs that model, which the tracker does not hold: :func:`relative_steps`.

    Parameters
    ----------
    t0 : int (default: 2)
        The reference round; similarities to it start after that round.
    """

    def __init__(self, t0: int = 2) -> None:
        if isinstance(t0, bool) or not isinstance(t0, int) or t0 < 1:
            raise ValueError(f"`t0` must be an integer >= 1, got {t0!r}")
        self.t0 = t0
        self.reference: dict[str, np.ndarray] | None = None
        self.previous: dict[str, np.ndarray] | None = None

    def update(
        self, server_round: int, model: Mapping[str, np.ndarray], names: Iterable[str]
    ) -> dict[str, float]:
        """Metrics ``inertia-cos-t0/<layer>``, ``inertia-cos-prev/<layer>``, ``inertia-step/<layer>``."""
        names = list(names)
        current = {n: np.array(model[n], copy=True) for n in names}
        metrics: dict[str, float] = {}
        if self.reference is not None:
            for name, value in layer_similarities(current, self.reference, names).items():
                metrics[f"inertia-cos-t0/{name}"] = value
        if self.previous is not None:
            for name, value in layer_similarities(current, self.previous, names).items():
                metrics[f"inertia-cos-prev/{name}"] = value
            steps = update_norms({n: current[n] - self.previous[n] for n in names})
            metrics.update({f"inertia-step/{n}": v for n, v in steps.items()})
        if server_round == self.t0:
            self.reference = current
        self.previous = current
        return metrics

    def state(self) -> dict:
        """What a checkpoint needs to continue the same series."""
        return {"t0": self.t0, "reference": self.reference, "previous": self.previous}

    def load_state(self, state: dict) -> None:
        """Continue the series saved by :meth:`state`."""
        if state["t0"] != self.t0:
            raise ValueError(f"the saved inertia series uses t0={state['t0']}, this tracker {self.t0}")
        self.reference = None if state["reference"] is None else dict(state["reference"])
        self.previous = None if state["previous"] is None else dict(state["previous"])


__all__ = ["InertiaTracker", "cosine_similarity", "layer_similarities", "relative_step", "relative_steps",
           "update_norms"]
