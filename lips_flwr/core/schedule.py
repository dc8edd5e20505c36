"""When to sparsify and how much: the LIPS mask schedule.

Rounds are Flower's 1-based ``server_round``; the schedule uses the 0-based
index ``t = server_round - 1`` as the paper does, so with ``every=5`` the mask
rounds are 1, 6, 11, ... and ``tau`` decays from ``tau0`` at round 1 towards 0
at ``num_rounds + 1``. With ``mask_last_round=False`` (the strategies' default,
:class:`~lips_flwr.core.lips.LIPSCore`) the final round ``num_rounds`` is never
a mask round: a model masked after the last aggregation has no round left to
regrow its zeroed weights.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

DECAYS = ("linear", "constant", "cosine")


def _require_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value}")
    return int(value)


def validate_tau0(tau0: object) -> float:
    """Return ``tau0`` as a float, or raise if it is not in [0, 1)."""
    if isinstance(tau0, bool) or not isinstance(tau0, numbers.Real):
        raise ValueError(f"`tau0` must be a number in [0, 1), got {tau0!r}")
    if not 0.0 <= float(tau0) < 1.0:  # also rejects NaN
        raise ValueError(f"`tau0` must be in [0, 1), got {tau0}")
    return float(tau0)


@dataclass(frozen=True)
class MaskSchedule:
    """Decaying sparsity schedule ``tau(t) = tau0 * decay(t / T)`` every ``every`` rounds.

    Parameters
    ----------
    num_rounds : int
        ``T``, the total number of federated rounds (>= 1).
    tau0 : float (default: 0.5)
        Scale in [0, 1): the fraction zeroed at round 1. The decay runs from
        round 1 whatever ``start_round`` is, as in the paper's ``tau0 (1 - t/T)``.
    every : int (default: 5)
        ``k``: a mask every ``every`` rounds (>= 1).
    start_round : int (default: 1)
        First (1-based) server round that is a mask round (>= 1).
    decay : str (default: "linear")
        ``"linear"`` (paper: ``1 - t/T``), ``"cosine"`` (``(1 + cos(pi t/T)) / 2``)
        or ``"constant"``.
    mask_last_round : bool (default: True)
        Whether round ``num_rounds`` may be a mask round. True is the
        paper's schedule read literally; the strategies pass False in server
        mode unless told otherwise (nothing trains after the last round's mask).
    """

    num_rounds: int
    tau0: float = 0.5
    every: int = 5
    start_round: int = 1
    decay: str = "linear"
    mask_last_round: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_rounds", _require_int("num_rounds", self.num_rounds, 1))
        object.__setattr__(self, "tau0", validate_tau0(self.tau0))
        object.__setattr__(self, "every", _require_int("every", self.every, 1))
        object.__setattr__(self, "start_round", _require_int("start_round", self.start_round, 1))
        if self.start_round > self.num_rounds:
            raise ValueError(
                f"`start_round` must be <= num_rounds ({self.num_rounds}), got {self.start_round}"
            )
        if self.decay not in DECAYS:
            raise ValueError(f"`decay` must be one of {DECAYS}, got {self.decay!r}")
        if not isinstance(self.mask_last_round, bool):
            raise ValueError(f"`mask_last_round` must be True or False, got {self.mask_last_round!r}")

    def is_mask_round(self, server_round: int) -> bool:
        """Whether the aggregate of ``server_round`` is sparsified."""
        if server_round == self.num_rounds and not self.mask_last_round:
            return False
        offset = server_round - self.start_round
        return offset >= 0 and offset % self.every == 0

    def decay_factor(self, server_round: int) -> float:
        """The multiplier of ``tau0`` at ``server_round``, clamped to [0, 1]."""
        progress = min(max((server_round - 1) / self.num_rounds, 0.0), 1.0)
        if self.decay == "linear":
            return 1.0 - progress
        if self.decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    def tau(self, server_round: int) -> float:
        """Fraction zeroed at ``server_round``: 0 on rounds that are not mask rounds."""
        if not self.is_mask_round(server_round):
            return 0.0
        return self.tau0 * self.decay_factor(server_round)

    def mask_rounds(self) -> list[int]:
        """All mask rounds in ``1..num_rounds`` (for logs and docs)."""
        return [r for r in range(1, self.num_rounds + 1) if self.is_mask_round(r)]


__all__ = ["DECAYS", "MaskSchedule", "validate_tau0"]
