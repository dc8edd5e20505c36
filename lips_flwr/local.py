"""Client-side LIPS logic, shared by the Message API mods and the NumPyClient wrapper.

A client tracks its local update ``w_after - w_received`` each round. In client
mode (spec section 4), on a mask round it scores the received global weights
with the update it stored last round (``|delta * w|``) and zeroes its own copy
before training. A client with no update from the previous round (first
participation, or not sampled last time) falls back to the magnitude score;
it never zeroes its whole model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .layers import candidate_names, is_candidate
from .masking import sparsify
from .scores import SCORES
from .sparsifier import KEY_LAYERS, KEY_MODE, KEY_ROUND, KEY_SCORE, KEY_SEED, KEY_TAU, MODES


@dataclass(frozen=True)
class ClientRoundConfig:
    """The ``lips-*`` keys of one train config, parsed and checked."""

    server_round: int
    mode: str
    tau: float = 0.0
    score: str = "sensitivity"
    seed: int = 0
    layers: tuple[int, ...] = ()

    @property
    def masks(self) -> bool:
        return self.mode == "client" and self.tau > 0.0


def parse_round_config(config: Mapping) -> ClientRoundConfig | None:
    """Read the ``lips-*`` keys; ``None`` when the server sent none (not a LIPS server)."""
    if KEY_ROUND not in config:
        return None
    try:
        parsed = ClientRoundConfig(
            server_round=int(config[KEY_ROUND]),
            mode=str(config.get(KEY_MODE, "server")),
            tau=float(config.get(KEY_TAU, 0.0)),
            score=str(config.get(KEY_SCORE, "sensitivity")),
            seed=int(config.get(KEY_SEED, 0)),
            layers=tuple(int(i) for i in json.loads(str(config.get(KEY_LAYERS, "[]")))),
        )
    except (TypeError, ValueError) as err:
        raise ValueError(f"malformed lips-* keys in the train config: {err}") from err
    if parsed.mode not in MODES or parsed.score not in SCORES or not 0.0 <= parsed.tau <= 1.0:
        raise ValueError(
            f"malformed lips-* keys in the train config: mode={parsed.mode!r}, "
            f"score={parsed.score!r}, tau={parsed.tau!r}"
        )
    return parsed


def iter_local_update(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, trained - received)`` for every candidate tensor, one at a time."""
    for name in candidate_names(received):
        if name in trained and np.shape(trained[name]) == received[name].shape:
            dtype = np.result_type(received[name], np.float32)
            yield name, np.subtract(trained[name], received[name], dtype=dtype)


def local_update(
    received: Mapping[str, np.ndarray], trained: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``trained - received`` for every candidate tensor (rank >= 2 floats)."""
    return dict(iter_local_update(received, trained))


def client_mask(
    arrays: Mapping[str, np.ndarray],
    round_config: ClientRoundConfig,
    signal: Mapping[str, np.ndarray] | None,
    signal_round: int | None,
    salt: tuple[int, ...] = (),
) -> tuple[dict[str, np.ndarray], dict[str, int], str]:
    """Mask this client's copy of the global model before training (client mode).

    Returns the model to train from, the zeros placed per layer and the score
    actually used (``"magnitude"`` when the stored update is missing or stale).
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
    if score == "sensitivity" and not (fresh and all(n in signal for n in layers)):
        score = "magnitude"
    masked, zeros = sparsify(
        arrays,
        layers,
        round_config.tau,
        score=score,
        updates=signal if score == "sensitivity" else None,
        seed=round_config.seed,
        salt=(round_config.server_round, *salt),
    )
    return masked, zeros, score
