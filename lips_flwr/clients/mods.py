"""Client mods for the Message API: ``app = ClientApp(mods=[fedbn_mod, lips_mod])``.

For ClientApps built on the Message API (``@app.train()``); a legacy
``ClientApp(client_fn=...)`` uses :class:`~lips_flwr.clients.LIPSNumPyClient`.

Mods run in list order on the way in and in reverse on the way out, so with
the order above the mask is applied to the model after FedBN restored the
client's own batch-norm tensors, and the local update is measured on exactly
the model training started from.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from logging import ERROR, WARNING
from typing import TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType
from flwr.common import log
from flwr.common.constant import ErrorCode

from .._records import numpy_to_record, record_views
from ..core.layers import batch_norm_names
from ..protocol import config_round
from .persist import load_state, save_state, state_path
from .state import after_training, before_training, client_salt, restore_local_record, save_local_record

ClientAppCallable = Callable[[Message, Context], Message]
_R = TypeVar("_R")
# Older Flower releases have no MOD_FAILED_PRECONDITION.
_MOD_ERROR = getattr(ErrorCode, "MOD_FAILED_PRECONDITION", ErrorCode.UNKNOWN)


def _kind(msg: Message) -> str:
    """``"train"`` for ``"train"`` and ``"train.<action>"`` (``@app.train("name")``)."""
    return msg.metadata.message_type.split(".", 1)[0]


def _error_reply(msg: Message, reason: str) -> Message:
    log(ERROR, reason)
    return Message(Error(code=_MOD_ERROR, reason=reason), reply_to=msg)


def _single(msg: Message, kind: type[_R]) -> tuple[str, _R] | None:
    records = [(k, v) for k, v in msg.content.items() if isinstance(v, kind)]
    return records[0] if len(records) == 1 else None


def lips_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Track the local update; apply the client-mode LIPS mask on mask rounds.

    Works with :class:`lips_flwr.strategies.LIPS` on the server: in client mode
    the server sends ``lips-tau`` and the layers, and this mod zeroes the
    lowest ``|delta * w|`` entries of the received model, ``delta`` being this
    client's local update from the previous round (magnitude when it has
    none). In both modes it adds ``lips-update-norm`` metrics to the reply.
    Only TRAIN messages are touched.
    """
    if _kind(msg) != MessageType.TRAIN:
        return call_next(msg, context)
    found = _single(msg, ArrayRecord)
    if found is None:
        return _error_reply(msg, "lips_mod expects exactly one ArrayRecord in the train message")
    key, record = found
    config_found = _single(msg, ConfigRecord)
    config = config_found[1] if config_found else {}
    received = record_views(record)  # read-only, no copy: LIPS reads; masking copies
    try:
        start, mask_metrics, round_config = before_training(
            context.state, received, config, client_salt(context)
        )
    except ValueError as err:
        return _error_reply(msg, f"lips_mod: {err}")
    changed = [n for n in start if start[n] is not received[n]]
    if changed:
        msg.content[key] = numpy_to_record(start, record, changed)

    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    out = _single(reply, ArrayRecord)
    if out is None or set(out[1].keys()) != set(record.keys()):
        log(WARNING, "lips_mod: the reply's arrays do not match the received ones; "
                     "local update not tracked this round")
        return reply
    metrics = after_training(context.state, start, record_views(out[1]), round_config)
    metrics.update(mask_metrics)
    for metric_record in reply.content.metric_records.values():
        metric_record.update(metrics)
        break
    return reply


def make_fedbn_mod(local: Sequence[str] | None = None):
    """Build a mod that keeps some tensors local to each client (FedBN by default).

    Parameters
    ----------
    local : sequence of str, optional
        Names or glob patterns of the tensors that never take the server's
        value. Default: the batch-norm tensors, recognised by their running
        statistics (see :func:`lips_flwr.core.layers.batch_norm_names`).

    On a model where nothing is to be kept (no batch-norm layers, or no name
    that matches ``local``) the mod passes every message through, as FedAvg
    would, and logs that once (a WARNING, the first time, per mod).
    """
    told_nothing_to_keep = False
    # The local names of a model's names (every message of a run has the same ones), found once.
    known: dict[tuple[str, ...], tuple[str, ...]] = {}

    def local_names(arrays) -> tuple[str, ...]:
        key = tuple(arrays)
        names = known.get(key)
        if names is None:
            if len(known) >= 64:  # (a stream of ever other models: start over)
                known.clear()
            names = known[key] = tuple(names_in(arrays))
        return names

    def names_in(arrays) -> list[str]:
        nonlocal told_nothing_to_keep
        if local is None:
            names = batch_norm_names(arrays)
            what = "the model has no batch-norm layers (no running statistics)"
        else:
            names = [n for n in arrays if any(fnmatch.fnmatch(n, p) for p in local)]
            what = f"no tensor of the model matches local={list(local)}"
        if not names and not told_nothing_to_keep:
            told_nothing_to_keep = True  # once: every round's messages would say it again
            log(WARNING, "fedbn_mod: %s, so it has nothing to keep local: every tensor takes the "
                         "server's value, as under FedAvg", what)
        return names

    def fedbn_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Restore this client's local tensors on the way in; store them on the way out."""
        found = _single(msg, ArrayRecord)
        if found is None or _kind(msg) not in (MessageType.TRAIN, MessageType.EVALUATE):
            return call_next(msg, context)
        key, record = found
        names = local_names(record)
        restored = restore_local_record(context.state, record, names)
        if restored is not record:
            msg.content[key] = restored
        reply = call_next(msg, context)
        out = _single(reply, ArrayRecord) if not reply.has_error() else None
        if out is not None and _kind(msg) == MessageType.TRAIN:
            save_local_record(context.state, out[1], names)
        return reply

    return fedbn_mod


def persistent_state_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Keep this client's LIPS and FedBN state on disk, so that a resumed server run continues with it.

    Put it first: ``ClientApp(mods=[persistent_state_mod, fedbn_mod, lips_mod])``.
    Does nothing unless the node config (or run config) names a
    ``lips-state-dir`` and the server is a LIPS strategy with a
    ``checkpoint_path``; see :mod:`lips_flwr.clients.persist`.
    """
    found = _single(msg, ConfigRecord)
    config = found[1] if found else {}
    path, server_round = state_path(context, config), config_round(config)
    train = _kind(msg) == MessageType.TRAIN
    if server_round is not None:  # a train message needs the state from before its round
        arrays = _single(msg, ArrayRecord)  # a file of another model is not restored
        shapes = None if arrays is None else {n: tuple(a.shape) for n, a in arrays[1].items()}
        load_state(context.state, path, server_round if train else server_round + 1, shapes)
    reply = call_next(msg, context)
    if train and server_round is not None and not reply.has_error():
        save_state(context.state, path, server_round)
    return reply


fedbn_mod = make_fedbn_mod()
fedbn_mod.__doc__ = """FedBN: batch-norm tensors stay local to each client (``make_fedbn_mod()``)."""


__all__ = ["fedbn_mod", "lips_mod", "make_fedbn_mod", "persistent_state_mod"]
