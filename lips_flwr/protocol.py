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
import numbers
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

    Raises ``ValueError`` naming the key when one is malformed. Only what a
    LIPS server sends passes: ``lips-round`` and ``lips-seed`` are ``int``
    (a ``bool`` or a float is not, even ``3.0``; within int64, what a
    ConfigRecord holds), ``lips-round`` at least 1 and ``lips-seed`` at
    least 0; ``lips-tau`` a number in ``[0, 1)``; ``lips-mode`` and
    ``lips-score`` known names; ``lips-layers`` a JSON string of a flat list
    of distinct non-negative integers (:func:`_layer_positions`).
    """
    if KEY_ROUND not in config:
        return None
    tau = config.get(KEY_TAU, 0.0)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 <= tau < 1.0:
        # What a LIPS server sends: tau0 < 1, decaying (NaN fails the range too).
        raise ValueError(f"{_MALFORMED}: {KEY_TAU} must be a number in [0, 1), got {_shown(tau)}")
    return ClientRoundConfig(
        server_round=_integer(config, KEY_ROUND, least=1),
        mode=_name(config, KEY_MODE, "server", MODES),
        tau=float(tau),
        score=_name(config, KEY_SCORE, "sensitivity", SCORES),
        seed=_integer(config, KEY_SEED, least=0, default=0),
        layers=_layer_positions(config.get(KEY_LAYERS, "[]")),
    )


_MALFORMED = "malformed lips-* keys in the train config"
_INT64_MAX = 2**63 - 1
# The longest lips-layers accepted: 100,000 positions of up to 9 digits and a separator.
_MAX_LAYERS_CHARS = 1_000_000
# A flat JSON list of non-negative integers (no sign, no leading zero, no fraction, at most
# 9 digits): checked before json.loads, so a hostile string cannot nest or smuggle in floats.
_POSITION = r"(?:0|[1-9][0-9]{0,8})"
_SPACE = r"[ \t\n\r]*"  # JSON's whitespace (``\s`` would also match what json.loads refuses)
_ITEM = rf"{_POSITION}{_SPACE}"
_FLAT_LIST = re.compile(rf"{_SPACE}\[{_SPACE}(?:{_ITEM}(?:,{_SPACE}{_ITEM})*)?\]{_SPACE}")


def _shown(value: object) -> str:
    """``repr(value)``, cut to 60 characters: a hostile value must not flood the log."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _integer(config: Mapping, key: str, least: int, default: int | None = None) -> int:
    """``config[key]`` as an int in ``[least, 2**63 - 1]``; ``ValueError`` naming ``key`` otherwise."""
    value = config.get(key, default)
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not (integral and least <= int(value) <= _INT64_MAX):
        raise ValueError(f"{_MALFORMED}: {key} must be an integer in [{least}, 2**63 - 1], "
                         f"got {_shown(value)}")
    return int(value)


def _name(config: Mapping, key: str, default: str, known: Sequence[str]) -> str:
    """``config[key]``, one of ``known``; ``ValueError`` naming ``key`` otherwise."""
    value = config.get(key, default)
    if not isinstance(value, str) or value not in known:
        raise ValueError(f"{_MALFORMED}: {key} must be one of {list(known)}, got {_shown(value)}")
    return value


def _layer_positions(value: object) -> tuple[int, ...]:
    """``lips-layers``: a JSON list of distinct tensor positions, ``"[1, 3]"`` -> ``(1, 3)``.

    ``ValueError`` naming the key for anything else: another type, a string
    over 1,000,000 characters, nesting, a float (``7.9`` is not taken as
    ``7``), a negative number, a repeated position.
    """
    if not isinstance(value, str) or len(value) > _MAX_LAYERS_CHARS or not _FLAT_LIST.fullmatch(value):
        raise ValueError(f"{_MALFORMED}: {KEY_LAYERS} must be a JSON list of non-negative integers "
                         f"(at most {_MAX_LAYERS_CHARS} characters), got {_shown(value)}")
    positions = tuple(json.loads(value))
    if len(set(positions)) != len(positions):
        raise ValueError(f"{_MALFORMED}: {KEY_LAYERS} names a position twice: {_shown(value)}")
    return positions


def config_round(config: Mapping) -> int | None:
    """The server round of a train or evaluate config from a LIPS strategy, if any."""
    value = config.get(KEY_ROUND)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = [
    "ClientRoundConfig", "KEY_CLIENT_ZEROS", "KEY_LAYERS", "KEY_MODE", "KEY_ROUND", "KEY_RUN", "KEY_SCORE",
    "KEY_SEED", "KEY_STATE_DIR", "KEY_TAU", "MODES", "SCORES", "config_round",
    "evaluate_config", "is_run_key", "new_run_key", "parse_train_config", "train_config",
]
