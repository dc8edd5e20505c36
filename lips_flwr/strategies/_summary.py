"""Log lines shared by the Message API and legacy adapters."""

from __future__ import annotations

from logging import INFO

from flwr.supercore import log


def log_settings(title: str, items: list[tuple[str, object]]) -> None:
    """A ``summary()`` log tree in Flower's style."""
    log(INFO, "\t├──> %s settings:", title)
    for i, (label, value) in enumerate(items):
        log(INFO, "\t│\t%s── %s: %s", "└" if i == len(items) - 1 else "├", label, value)


def log_round(server_round: int, metrics: dict, mode: str) -> None:
    """One line per mask round, the same in both APIs (tests and users grep it)."""
    if not metrics.get("lips-mask-round"):
        return
    if mode == "client":
        log(INFO, "LIPS: round %d asks clients to mask (tau=%.4f)", server_round, metrics["lips-tau"])
    else:
        log(INFO, "LIPS: round %d masked %d weights in %d layers (tau=%.4f, %.3fs)",
            server_round, metrics["lips-zeros"], metrics["lips-layers-masked"],
            metrics["lips-tau"], metrics["lips-seconds"])
