"""What the Message API and legacy adapters do alike, after their own conversions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log

from ..sparsifier import TransientSparsifier
from ._cache_sync import sync_cached_models


def log_settings(title: str, items: list[tuple[str, object]]) -> None:
    """A ``summary()`` log tree in Flower's style."""
    log(INFO, "\t├──> %s settings:", title)
    for i, (label, value) in enumerate(items):
        log(INFO, "\t│\t%s── %s: %s", "└" if i == len(items) - 1 else "├", label, value)


def check_model(sparsifier: TransientSparsifier, model: Mapping[str, np.ndarray]) -> None:
    """Resolve the layers on the first global model: bad names fail before any training."""
    layers = sparsifier.layer_names(model)  # raises ValueError for unmatched names
    if not layers:
        log(WARNING, "LIPS: layers=%r selects no tensor of this model (%d arrays); "
            "nothing will be masked", sparsifier.layers, len(model))


def sparsify_aggregate(
    owner: Any,
    sparsifier: TransientSparsifier,
    server_round: int,
    aggregate: dict[str, np.ndarray],
    previous: dict[str, np.ndarray] | None,
    before: dict,
    to_numpy: Callable[[Any], Mapping[str, np.ndarray] | None],
    from_numpy: Callable[[Any, Mapping[str, np.ndarray]], Any],
) -> tuple[dict[str, np.ndarray] | None, dict[str, int | float]]:
    """Sparsify a mask round's aggregate and put its zeros into the chain's caches.

    An aggregate with NaN or Inf is returned unmasked, with an ERROR log: the
    wrapped strategy produced it, and LIPS neither hides it under a mask nor
    stops a run that the wrapped strategy alone would continue.
    """

    def on_skip(reason: str) -> None:
        log(ERROR, "LIPS: round %d not masked: %s; the aggregate of %s is returned "
            "unchanged", server_round, reason, type(_inner(owner)).__name__)

    masked, metrics = sparsifier.after_aggregation(
        server_round, aggregate, previous, on_skip=on_skip)
    if masked is not None:
        masks = {n: masked[n] == 0 for n in masked if masked[n] is not aggregate[n]}
        sync_cached_models(owner, before, masks, to_numpy, from_numpy)
    return masked, metrics


def _inner(owner: Any) -> Any:
    """The strategy LIPS wraps (``owner`` itself for the FedAvg subclasses)."""
    return getattr(owner, "strategy", owner)


def log_no_aggregate(server_round: int, sparsifier: TransientSparsifier) -> None:
    """A mask round without aggregate (no reply, all failed or rejected) masks nothing."""
    if sparsifier.masks_aggregate(server_round):
        log(WARNING, "LIPS: round %d has no aggregate (no usable reply): nothing masked; "
            "the global model stays as it was", server_round)


def log_round(server_round: int, metrics: dict, mode: str, client_reports: int) -> None:
    """One line per mask round, the same in both APIs (tests and users grep it).

    ``client_reports`` counts the replies carrying ``lips-client-zeros``: in
    client mode none means the clients run no LIPS client side.
    """
    if not metrics.get("lips-mask-round"):
        return
    if mode == "client":
        log(INFO, "LIPS: round %d asks clients to mask (tau=%.4f)", server_round, metrics["lips-tau"])
        if client_reports == 0:
            log(WARNING, "LIPS: no client reported a mask in round %d: client mode needs "
                "lips_mod (Message API) or LIPSNumPyClient (legacy) on the clients", server_round)
    else:
        log(INFO, "LIPS: round %d masked %d weights in %d layers (tau=%.4f, %.3fs)",
            server_round, metrics["lips-zeros"], metrics["lips-layers-masked"],
            metrics["lips-tau"], metrics["lips-seconds"])
