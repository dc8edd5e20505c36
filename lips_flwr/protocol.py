"""What a LIPS server and its clients agree on: the ``lips-*`` config keys (no flwr import).

The strategies write these keys into each round's train and evaluate config;
the client side (:mod:`lips_flwr.clients`) reads them. Both import them from
here, so the wire format is written once, as in Flower's own
``flwr.supercore.differential_privacy``.

=================  ==========  ====================================================
key                sent        meaning
=================  ==========  ====================================================
``lips-round``     always      the server round (the schedule's, after a resume)
``lips-mode``      train       ``"server"`` or ``"client"``
``lips-run-key``   checkpoint  names the run across restarts (:func:`new_run_key`)
``lips-tau``       client      the fraction to mask this round (client mode)
``lips-score``     client      the score to rank by, on a mask round
``lips-seed``      client      the random score's seed, on a mask round
``lips-layers``    client      JSON list of the masked tensors' positions
=================  ==========  ====================================================

A client that masked its copy reports it back in its train reply's metrics:
``lips-client-zeros`` (:data:`KEY_CLIENT_ZEROS`), the zeros it placed; the
server counts the replies that carry it (client mode needs the client side).

``lips-state-dir`` is read from a SuperNode's node config (or the run config):
the folder where a client keeps its state on disk.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .core.lips import MODES
from .core.scores import SCORES

KEY_ROUND = "lips-round"
KEY_MODE = "lips-mode"
KEY_TAU = "lips-tau"
KEY_SCORE = "lips-score"
KEY_SEED = "lips-seed"
KEY_LAYERS = "lips-layers"
KEY_RUN = "lips-run-key"
KEY_STATE_DIR = "lips-state-dir"
KEY_CLIENT_ZEROS = "lips-client-zeros"  # a train reply's metric: the zeros a client placed

# A run key is 32 lower-case hex digits: clients put it into file names, so the
# pattern also keeps their state files inside their folder.
_RUN_KEY = re.compile(r"[0-9a-f]{32}")


def new_run_key() -> str:
    """A fresh run key (a run that checkpoints gets one; a resumed run keeps its own)."""
    return uuid.uuid4().hex


def is_run_key(value: object) -> bool:
    """Whether ``value`` is a well-formed run key."""
    return isinstance(value, str) and _RUN_KEY.fullmatch(value) is not None


def train_config(
    server_round: int,
    mode: str,
    run_key: str | None = None,
    tau: float | None = None,
    score: str | None = None,
    seed: int | None = None,
    layers: Sequence[int] | None = None,
) -> dict:
    """The ``lips-*`` keys of a train config.

    ``tau`` is sent in client mode; ``score``, ``seed`` and ``layers`` (the
    masked tensors' positions in the model's order) on a client-mode mask round.
    """
    config: dict = {KEY_ROUND: server_round, KEY_MODE: mode}
    if run_key is not None:
        config[KEY_RUN] = run_key
    if tau is not None:
        config[KEY_TAU] = tau
    if layers is not None:
        config[KEY_SCORE] = score
        config[KEY_SEED] = seed
        config[KEY_LAYERS] = json.dumps(list(layers))
    return config


def evaluate_config(server_round: int, run_key: str | None) -> dict:
    """The ``lips-*`` keys of an evaluate config: the run key and round, when checkpointing."""
    return {} if run_key is None else {KEY_RUN: run_key, KEY_ROUND: server_round}


@dataclass(frozen=True)
class ClientRoundConfig:
    """The ``lips-*`` keys of one train config, parsed and checked (client side)."""

    server_round: int
    mode: str
    tau: float = 0.0
    score: str = "sensitivity"
    seed: int = 0
    layers: tuple[int, ...] = ()

    @property
    def masks(self) -> bool:
        """Whether the client masks its copy before training this round."""
        return self.mode == "client" and self.tau > 0.0


def parse_train_config(config: Mapping) -> ClientRoundConfig | None:
    """Read the ``lips-*`` keys; ``None`` when the server sent none (not a LIPS server).

    Raises ``ValueError`` naming the keys when they are malformed.
    """
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
    if parsed.mode not in MODES or parsed.score not in SCORES:
        raise ValueError(
            f"malformed lips-* keys in the train config: mode={parsed.mode!r}, "
            f"score={parsed.score!r}, tau={parsed.tau!r}"
        )
    if not 0.0 <= parsed.tau < 1.0:  # what a LIPS server sends: tau0 < 1, decaying (NaN fails too)
        raise ValueError(
            f"malformed lips-* keys in the train config: {KEY_TAU} must be in [0, 1), "
            f"got {parsed.tau!r}"
        )
    return parsed


def config_round(config: Mapping) -> int | None:
    """The server round of a train or evaluate config from a LIPS strategy, if any."""
    value = config.get(KEY_ROUND)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = [
    "ClientRoundConfig", "KEY_CLIENT_ZEROS", "KEY_LAYERS", "KEY_MODE", "KEY_ROUND", "KEY_RUN", "KEY_SCORE",
    "KEY_SEED", "KEY_STATE_DIR", "KEY_TAU", "MODES", "SCORES", "config_round",
    "evaluate_config", "is_run_key", "new_run_key", "parse_train_config", "train_config",
]
