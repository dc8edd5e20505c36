"""The lines a round leaves in Flower's log, the same in both APIs (tests and users grep them)."""

from __future__ import annotations

from logging import ERROR, INFO, WARNING
from typing import Any

from flwr.common import log

from ...core.lips import LIPSCore
from ...core.outcome import RoundOutcome
from ..replies.gate import ReplyAccess


def log_round(server_round: int, outcome: RoundOutcome, core: LIPSCore, inner: str,
              replies: ReplyAccess[Any], kept: list[Any]) -> None:
    """A round without an aggregate or not masked, and one line per mask round.

    ``inner``: the wrapped strategy's class name; ``replies``/``kept``: the
    round's replies and those admitted (client mode counts the clients that
    reported a mask among them).
    """
    if outcome.problem is not None and not outcome.metrics:
        log(WARNING, "LIPS: round %d has no aggregate (no usable reply): nothing masked; "
            "the global model stays as it was", server_round)
    elif outcome.problem is not None:
        log(ERROR, "LIPS: round %d not masked: %s; the aggregate of %s is returned "
            "unchanged", server_round, outcome.problem, inner)
    metrics = outcome.metrics
    if not metrics.get("lips-mask-round"):
        return
    decision = outcome.decision
    if decision is not None:  # trigger="inertia": which layers stagnate, if any
        if decision.stagnant:
            found = f"{len(decision.stagnant)} stagnating layers {decision.stagnant}"
        elif decision.ready:
            found = "no layer stagnates, nothing masked"
        else:
            found = f"no baseline before round {core.trigger_window + 2}, nothing masked"
        log(INFO, "LIPS: round %d: inertia trigger: %s", server_round, found)
        if not decision.stagnant:
            return
    if core.mode == "client":
        log(INFO, "LIPS: round %d asks clients to mask (tau=%.4f)", server_round, metrics["lips-tau"])
        if replies.client_reports(kept) == 0:
            log(WARNING, "LIPS: no client reported a mask in round %d: client mode needs "
                "lips_mod (Message API) or LIPSNumPyClient (legacy) on the clients", server_round)
    else:
        log(INFO, "LIPS: round %d masked %d weights in %d layers (tau=%.4f, %.3fs)",
            server_round, metrics["lips-zeros"], metrics["lips-layers-masked"],
            metrics["lips-tau"], metrics["lips-seconds"])


__all__ = ["log_round"]
