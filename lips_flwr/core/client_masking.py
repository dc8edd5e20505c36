"""Client-side LIPS logic, shared by the Message API mods and the NumPyClient wrapper.

A client tracks its local update ``w_after - w_received`` each round. In client
mode (the authors' code), on a mask round it scores the received global weights
with the update it stored last round (``|delta * w|``) and zeroes its own copy
before training. A client with no update from the previous round (first
participation, or not sampled last time) falls back to the magnitude score;
it never zeroes its whole model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

import numpy as np

from .dots import difference_norm
from .layers import candidate_names, is_candidate
from .masking import mask_layers
from .scores import needs_update


class MaskRequest(Protocol):
    """What the server asked of a client-mode mask round (the protocol's parsed
    ``lips-*`` keys, :class:`lips_flwr.protocol.ClientRoundConfig`, are one)."""

    @property
    def server_round(self) -> int: ...
    @property
    def tau(self) -> float: ...
    @property
    def score(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def layers(self) -> tuple[int, ...]: ...


def _update_operands(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.dtype]]:
    """``(name, trained, received, dtype)`` of every candidate tensor with a local update, whose
    update is ``np.subtract(trained, received, dtype=dtype)``."""
    for name in candidate_names(received):
        if name in trained and np.shape(trained[name]) == received[name].shape:
            yield name, trained[name], received[name], np.result_type(received[name], np.float32)


def iter_local_update(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, trained - received)`` for every candidate tensor, one at a time."""
    for name, after, before, dtype in _update_operands(received, trained):
        yield name, np.subtract(after, before, dtype=dtype)


def local_update_norms(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """``update_norms(local_update(received, trained))``, bit for bit, without the updates' arrays
    (:func:`.dots.difference_norm`): what a client reports when it keeps no update."""
    return {name: difference_norm(after, before, dtype)
            for name, after, before, dtype in _update_operands(received, trained)}


def local_update(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``trained - received`` for every candidate tensor (rank >= 2 floats)."""
    return dict(iter_local_update(received, trained))


def client_mask(
    arrays: Mapping[str, np.ndarray],
    round_config: MaskRequest,
    signal: Mapping[str, np.ndarray] | None,
    signal_round: int | None,
    salt: tuple[int, ...] = (),
) -> tuple[dict[str, np.ndarray], dict[str, int], str]:
    """Mask this client's copy of the global model before training (client mode).

    Returns the model to train from, the zeros placed per layer and the score
    actually used (``"magnitude"`` when the score needs an update and the stored
    one is missing or stale).
    """
    names = list(arrays)
    bad = [i for i in round_config.layers if not 0 <= i < len(names)]
    if bad:
        raise ValueError(
            f"lips-layers names positions {bad} but the model has {len(names)} arrays"
        )
    layers = [names[i] for i in round_config.layers]
    ineligible = [n for n in layers if not is_candidate(n, arrays[n])]
    if ineligible:
        raise ValueError(f"lips-layers names tensors that may not be masked: {ineligible}")
    score = round_config.score
    fresh = signal is not None and signal_round == round_config.server_round - 1
    uses_update = needs_update(score)
    if uses_update and not (fresh and signal is not None and all(n in signal for n in layers)):
        score, uses_update = "magnitude", False
    masked, zeros = mask_layers(
        arrays,
        layers,
        round_config.tau,
        score=score,
        updates=signal if uses_update else None,
        seed=round_config.seed,
        salt=(round_config.server_round, *salt),
    )
    return masked, zeros, score


__all__ = ["MaskRequest", "client_mask", "iter_local_update", "local_update", "local_update_norms"]
