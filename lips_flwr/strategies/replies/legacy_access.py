"""The gate's access to legacy API results: ``(ClientProxy, FitRes)`` pairs and their failures.

A result's ``Parameters.tensors`` are unnamed: they are the global model's
arrays in its order, so a result with another count is dropped before
anything else is read. A dropped result moves to the round's failures, where
the wrapped strategy counts it (``accept_failures``). An evaluate result's
``loss`` is checked as its metrics are, under the key :data:`LOSS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common import EvaluateRes, FitRes, ndarray_to_bytes
from flwr.server.client_proxy import ClientProxy

from ...protocol import KEY_CLIENT_ZEROS
from .gate import ReadReply, ReplyAccess
from .headers import ModelHeaders

Result = tuple[ClientProxy, Any]  # a FitRes or an EvaluateRes
InnerAggregate = Callable[[int, list, list], tuple[Any, Any]]
LOSS = "EvaluateRes.loss"  # the key the gate checks an evaluate result's loss under, beside its metrics


class LegacyReplies(ReplyAccess[Result]):
    """One round's legacy results for the gate; ``inner`` is the wrapped strategy's ``aggregate_fit``.

    ``failures`` (the round's, copied) receives the dropped results;
    ``views`` reads a ``Parameters`` as ``name -> ndarray`` (the adapter's names).
    """

    def __init__(self, results: list[Result], failures: list, server_round: int,
                 views: Callable[[Any], dict[str, np.ndarray]] | None = None,
                 inner: InnerAggregate | None = None) -> None:
        self.candidates, self.failures = list(results), failures
        self._round, self._views, self._inner = server_round, views, inner
        self._saved: list[tuple[FitRes, Any, list[bytes]]] = []
        self._losses: dict[int, tuple[EvaluateRes, dict[str, Any]]] = {}  # id(result) -> it, {LOSS: loss}

    def sender(self, reply: Result) -> str:
        return f"client {reply[0].cid}"

    def read(self, reply: Result, headers: ModelHeaders) -> ReadReply:
        tensors = reply[1].parameters.tensors
        read = ReadReply(reply)
        if len(tensors) != len(headers.names):
            read.reason = f"{len(tensors)} arrays, expected {len(headers.names)}"
            return read
        read.names, read.datas, read.in_order = headers.name_list, list(tensors), True
        read.weight, read.weight_key = reply[1].num_examples, "num_examples"
        return read

    def read_metrics(self, reply: tuple[ClientProxy, EvaluateRes]) -> ReadReply:
        read = ReadReply(reply)
        read.weight, read.weight_key = reply[1].num_examples, "num_examples"
        return read

    def metric_records(self, reply: Result) -> list[Any]:
        res = reply[1]
        found = [res.metrics] if isinstance(res.metrics, dict) else []
        if isinstance(res, EvaluateRes):  # Flower's weighted_loss_avg takes the loss in: check it too
            loss = {LOSS: res.loss}
            self._losses[id(res)] = (res, loss)
            found.append(loss)
        return found

    def write_losses(self) -> bool:
        """Put the losses the gate checked (:meth:`metric_records`) back into their results; ``False``
        when none is left: every loss was bad, each is set to NaN (a mean of them raises nothing),
        and the round's loss is the adapter's to leave out."""
        kept = False
        for res, loss in self._losses.values():
            kept = kept or LOSS in loss
            res.loss = loss.get(LOSS, math.nan)
        return kept

    def replace(self, read: ReadReply, index: int, array: np.ndarray) -> None:
        data = read.datas[index] = ndarray_to_bytes(array)
        read.reply[1].parameters.tensors[index] = data

    def snapshot(self, replies: list[Result]) -> None:
        # DP wrappers rebind a result's parameters (clipped): a retry needs them as they came.
        self._saved = [(res, res.parameters, list(res.parameters.tensors)) for _, res in replies]

    def restore(self) -> None:
        for res, parameters, tensors in self._saved:
            res.parameters = parameters
            parameters.tensors[:] = tensors

    def views(self, reply: Result) -> dict[str, np.ndarray]:
        assert self._views is not None
        return self._views(reply[1].parameters)

    def overflow_weight(self, reply: Result) -> object:
        return reply[1].num_examples  # legacy aggregate() multiplies by it before it divides

    def aggregate(self, replies: list[Result]) -> tuple[Any, Any]:
        assert self._inner is not None
        return self._inner(self._round, replies, self.failures)

    def dropped(self, reply: Result) -> None:
        self.failures.append(reply)

    def client_reports(self, replies: list[Result]) -> int:
        return sum(KEY_CLIENT_ZEROS in (res.metrics or {}) for _, res in replies)


__all__ = ["LOSS", "LegacyReplies"]
