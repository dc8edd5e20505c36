"""What each ``algorithm`` run-config value means (shared by the ServerApp and ClientApp)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """``local_bn``: FedBN (batch norm stays on the client); ``score``: LIPS score or None."""

    local_bn: bool
    score: str | None


ALGORITHMS = {
    "fedavg": Algorithm(local_bn=False, score=None),
    "fedbn": Algorithm(local_bn=True, score=None),
    "lips": Algorithm(local_bn=True, score="sensitivity"),
    "lips-random": Algorithm(local_bn=True, score="random"),
    "lips-magnitude": Algorithm(local_bn=True, score="magnitude"),
}


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; ``ValueError`` listing the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"`algorithm` must be one of {tuple(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
