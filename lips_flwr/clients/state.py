"""What a client keeps between rounds, in ``context.state``.

Simulated Flower clients are rebuilt every round; ``context.state`` (a
RecordDict) is what the SuperNode keeps for each of them. Both the Message API
mods and :class:`~lips_flwr.clients.LIPSNumPyClient` use these functions, so a
client's state means the same thing under both APIs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from .._records import array_view, as_npy_array, numpy_to_record, record_dict, record_of, record_views
from ..core.client_masking import client_mask, iter_local_update, local_update_norms
from ..core.inertia import update_norms
from ..protocol import KEY_CLIENT_ZEROS, ClientRoundConfig, parse_train_config

SIGNAL_KEY = "lips-signal"        # ArrayRecord: last local update (candidate layers)
SIGNAL_ROUND_KEY = "lips-signal-round"  # ConfigRecord: {"round": server round of that update}
LOCAL_KEY = "lips-local"          # ArrayRecord: tensors kept local (FedBN)


def restore_local(state: RecordDict, arrays: Mapping[str, np.ndarray], names: Sequence[str]) -> dict:
    """Replace the ``names`` tensors of the received model by this client's own (FedBN)."""
    out = dict(arrays)
    if LOCAL_KEY in state and names:
        for name, array in cast(ArrayRecord, state[LOCAL_KEY]).items():
            if name in out and tuple(array.shape) == np.shape(out[name]):
                out[name] = np.array(array_view(array))  # writable: a NumPyClient may train on it
    return out


def save_local(state: RecordDict, arrays: Mapping[str, np.ndarray], names: Sequence[str]) -> None:
    """Keep the ``names`` tensors of the trained model for the next round (FedBN)."""
    if names:
        state[LOCAL_KEY] = numpy_to_record({n: arrays[n] for n in names if n in arrays})


def restore_local_record(state: RecordDict, record: ArrayRecord, names: Sequence[str]) -> ArrayRecord:
    """:func:`restore_local` for a received ArrayRecord: ``record`` with its ``names`` Arrays replaced
    by this client's own where they have the received shape, or ``record`` itself when none is.

    The client's Arrays go in as they are: each holds the C-order ``.npy``
    of its values (:func:`save_local_record`, :func:`save_local`), the bytes
    a copy of them would be serialized to again.
    """
    arrays = record_dict(record)  # (plain dicts: a record's lookups are Python code)
    # Each of them parsed, as before and as the app will: a bad one raises here.
    received = {name: array_view(arrays[name]).shape for name in names if name in arrays}
    if LOCAL_KEY not in state or not received:
        return record
    own = record_dict(cast(ArrayRecord, state[LOCAL_KEY]))
    mine = {name: own[name] for name, shape in received.items()
            if name in own and tuple(own[name].shape) == shape}
    return record_of({name: mine.get(name, array) for name, array in arrays.items()}) if mine else record


def save_local_record(state: RecordDict, record: ArrayRecord, names: Sequence[str]) -> None:
    """:func:`save_local` for a reply's ArrayRecord: its ``names`` Arrays kept as they are where
    they hold C-order ``.npy`` bytes (an Array is a value: nothing changes one in place; on the
    batched Grid they are its ``ViewedArray``s, equal to and sent as Arrays), else serialized
    again from their values (:func:`lips_flwr._records.as_npy_array`)."""
    if names:
        state[LOCAL_KEY] = record_of({name: as_npy_array(record[name]) for name in names if name in record})


def client_salt(context: Context) -> tuple[int, ...]:
    """What makes this client's random score its own: its partition id, else its node id.

    A simulation draws new node ids in every run but keeps the partition ids,
    so a run repeated with the same seed masks alike only when salted by the latter.
    """
    partition = context.node_config.get("partition-id")
    if isinstance(partition, int) and not isinstance(partition, bool):
        return (partition,)
    return (context.node_id,)


def before_training(
    state: RecordDict, arrays: Mapping[str, np.ndarray], config: Mapping, salt: tuple[int, ...]
) -> tuple[dict[str, np.ndarray], dict[str, float], ClientRoundConfig | None]:
    """Apply the client-mode mask if this is a mask round.

    Returns the model to train from, metrics about the mask and the parsed
    ``lips-*`` config (``None`` when the server is not a LIPS strategy).
    Raises ``ValueError`` for malformed ``lips-*`` keys.
    """
    round_config = parse_train_config(config)
    if round_config is None or not round_config.masks:
        return dict(arrays), {}, round_config
    signal, signal_round = None, None
    if SIGNAL_KEY in state and SIGNAL_ROUND_KEY in state:  # one without the other: no signal
        signal = record_views(cast(ArrayRecord, state[SIGNAL_KEY]))
        signal_round = int(cast(int, state[SIGNAL_ROUND_KEY]["round"]))
    masked, zeros, used = client_mask(arrays, round_config, signal, signal_round, salt)
    metrics = {
        KEY_CLIENT_ZEROS: float(sum(zeros.values())),
        "lips-client-fallback": float(used != round_config.score),
    }
    return masked, metrics, round_config


def after_training(
    state: RecordDict,
    start: Mapping[str, np.ndarray],
    trained: Mapping[str, np.ndarray],
    round_config: ClientRoundConfig | None,
) -> dict[str, float]:
    """Track the local update; store it as next round's signal in client mode.

    Returns the update norms as metrics: ``lips-update-norm`` (all candidate
    layers) and ``lips-update-norm/<name>`` per layer.
    """
    keep = round_config is not None and round_config.mode == "client"
    if keep:
        delta = dict(iter_local_update(start, trained))
        norms = update_norms(delta)
    else:  # server mode keeps no update: their norms without their arrays
        norms = local_update_norms(start, trained)
    metrics = {"lips-update-norm": float(np.sqrt(sum(v * v for v in norms.values())))}
    metrics.update({f"lips-update-norm/{name}": value for name, value in norms.items()})
    if keep:
        assert round_config is not None  # keep implies it
        state[SIGNAL_KEY] = numpy_to_record(delta)
        state[SIGNAL_ROUND_KEY] = ConfigRecord({"round": round_config.server_round})
    return metrics


__all__ = [
    "LOCAL_KEY", "SIGNAL_KEY", "SIGNAL_ROUND_KEY", "after_training", "before_training", "client_salt",
    "restore_local", "restore_local_record", "save_local", "save_local_record",
]
