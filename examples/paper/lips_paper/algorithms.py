"""What each ``algorithm`` run-config value means (shared by the ServerApp and ClientApp).

Besides the paper's methods, controls that separate "LIPS helps" from "any
perturbation of the middle layers helps": FedBN with dropout or weight decay on the same middle layers,
LIPS on all layers, and the freeze ablation (middle layers stop being
aggregated after ``freeze-round``, the paper's Table 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """How one algorithm differs from plain FedAvg."""

    local_bn: bool = True          # FedBN: batch norm stays on the client
    score: str | None = None       # LIPS score; None: no mask (tau0 = 0)
    layers: str = "middle"         # which layers LIPS masks
    dropout: bool = False          # dropout on the middle layers' outputs (run config `dropout`)
    weight_decay: bool = False     # weight decay on the middle layers (run config `weight-decay`)
    freeze: bool = False           # middle layers frozen after `freeze-round`
    trigger: str = "schedule"      # LIPS: mask on the schedule, or only stagnating layers ("inertia")


ALGORITHMS = {
    "fedavg": Algorithm(local_bn=False),
    "fedbn": Algorithm(),
    "lips": Algorithm(score="sensitivity"),
    "lips-random": Algorithm(score="random"),
    "lips-magnitude": Algorithm(score="magnitude"),
    "lips-all": Algorithm(score="sensitivity", layers="all"),
    "lips-inertia": Algorithm(score="sensitivity", trigger="inertia"),
    "fedbn-dropout": Algorithm(dropout=True),
    "fedbn-wd": Algorithm(weight_decay=True),
    "freeze": Algorithm(freeze=True),
}


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; ``ValueError`` listing the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"`algorithm` must be one of {tuple(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]
