"""What one round's aggregate becomes: :meth:`.lips.LIPSCore.round`'s answer (no flwr import).

:class:`RoundOutcome` carries the model to broadcast, the positions the
round zeroed (:class:`ZeroPositions`, each computed when first read) and
the round's metrics, among them :func:`mask_change`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from .inertia import update_norms
from .trigger import TriggerDecision

Model = Mapping[str, np.ndarray]  # (LIPSCore's too: a name -> ndarray model, in its order)


class ZeroPositions(Mapping[str, np.ndarray]):
    """``model[name] == 0`` per name, computed when first read: most rounds read none (only a
    wrapped strategy's changed model cache or ``inertia_t0`` does), and on a float64 aggregate
    (Flower's FedAdam) the comparisons cost 0.5 ms of a ResNet8 mask round (bench_server.py)."""

    def __init__(self, model: Model, names: list[str]) -> None:
        self._arrays = {name: model[name] for name in names}  # (the arrays, whatever becomes of the dict)
        self._read: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._read:
            self._read[name] = self._arrays[name] == 0  # (KeyError for another name)
        return self._read[name]

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


@dataclass
class RoundOutcome:
    """What one round's aggregate becomes (see :meth:`.lips.LIPSCore.round`).

    Attributes
    ----------
    model : dict or None
        The model to broadcast when LIPS changed the aggregate (a server-mode
        mask round): every tensor in the aggregate's order, unmasked tensors
        being the aggregate's own objects. ``None``: broadcast the aggregate
        as it is.
    masks : Mapping
        Per masked tensor, a boolean array, ``True`` where this round zeroed
        the broadcast model (the adapters zero the same positions in the
        wrapped strategies' caches); each computed when first read
        (:class:`ZeroPositions`).
    metrics : dict
        The round's ``lips-*`` (and, with ``inertia_t0``, ``inertia-*``)
        metrics; empty when there was no aggregate.
    decision : TriggerDecision or None
        With ``trigger="inertia"``, on a mask round: which layers stagnate
        (in server mode the layers masked; in client mode those the clients
        were told to mask).
    problem : str or None
        Why a mask round masked nothing although it should have: no
        aggregate, or NaN/Inf in the aggregate or its update.
    """

    model: dict[str, np.ndarray] | None = None
    masks: Mapping[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, int | float] = field(default_factory=dict)
    problem: str | None = None
    decision: TriggerDecision | None = None


def mask_change(aggregate: Model, masked: Model, masks: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``lips-mask-change/<layer>``: the mask's relative change of each masked layer."""
    removed = update_norms({n: np.where(masks[n], aggregate[n], 0) for n in masks})
    sizes = update_norms({n: aggregate[n] for n in masks})
    return {f"lips-mask-change/{n}": removed[n] / sizes[n] if sizes[n] > 0 else 0.0 for n in masks}


__all__ = ["RoundOutcome", "ZeroPositions", "mask_change"]
