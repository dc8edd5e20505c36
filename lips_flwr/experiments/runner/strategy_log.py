"""What the ServerApp says in Flower's log that the Grid cannot see: the strategy's own metrics and reasons.

The runner sees a run through the Grid's messages (:mod:`.observe`), but a
strategy's aggregated metrics (LIPS's ``lips-*`` keys), the ServerApp's own
evaluation (``evaluate_fn``) and a strategy's warnings (``LIPS: round 3 has no
aggregate``) reach only Flower's log, which dies with the run's staging
folder. :class:`StrategyLog` is a handler on the ``flwr`` logger that turns
the lines flwr 1.42 writes into :class:`Heard` events, by their format string
and arguments (never by parsing text):

==============================================================  ==========================================
the line (flwr 1.42, or LIPS's ``round_log``)                   the event
==============================================================  ==========================================
``\\t└──> Aggregated MetricRecord: %s`` (Message API)            ``"aggregated"``: the strategy's metrics
``\\t└──> MetricRecord: %s``, ``Initial global evaluation ...``  ``"server_evaluate"`` (Message API)
``fit progress: (%s, %s, %s, %s)``, ``initial parameters ...``  ``"server_evaluate"`` (legacy API)
``LIPS: round %d has no aggregate ...``                         ``"no_aggregate"``
``LIPS: round %d masked %d weights ...`` / ``asks clients ...``  ``"mask"``: tau (and the zeros)
``LIPS: round %d not masked: %s ...``                           ``"not_masked"``: the reason
any other ``WARNING`` or ``ERROR``                              ``"warning"``: kept as text
==============================================================  ==========================================

The handler holds its listener weakly; a new one takes those whose listener
is gone off the logger.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

AGGREGATED = "\t└──> Aggregated MetricRecord: %s"
SERVER_EVALUATE = ("\t└──> MetricRecord: %s", "Initial global evaluation results: %s")
LEGACY_PROGRESS = "fit progress: (%s, %s, %s, %s)"
LEGACY_INITIAL = "initial parameters (loss, other metrics): %s, %s"
NO_AGGREGATE = "LIPS: round %d has no aggregate"
MASKED = "LIPS: round %d masked %d weights in %d layers"
ASKS = "LIPS: round %d asks clients to mask"
NOT_MASKED = "LIPS: round %d not masked: %s"


@dataclass(frozen=True)
class Heard:
    """One thing the log told: ``kind`` (see the module docstring), its round when the line names one."""

    kind: str
    round: int | None = None
    values: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def numbers(record: Any) -> dict[str, float]:
    """The numeric entries of a MetricRecord or dict (bools and text left out)."""
    if not isinstance(record, Mapping) and not callable(getattr(record, "items", None)):
        return {}  # (flwr's records are not Mappings, but have items())
    return {str(k): float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def heard(record: logging.LogRecord) -> Heard | None:
    """The event of one log record, or ``None`` for a line that tells nothing the runner keeps."""
    msg = str(record.msg)
    # (logging keeps a lone Mapping argument as ``args`` itself, not in a tuple)
    args: tuple[Any, ...] = record.args if isinstance(record.args, tuple) else (record.args,)
    if msg == AGGREGATED and args:
        return Heard("aggregated", values=numbers(args[0]))
    if msg in SERVER_EVALUATE and args:
        return Heard("server_evaluate", 0 if msg.startswith("Initial") else None, numbers(args[0]))
    if msg == LEGACY_PROGRESS and len(args) == 4:
        return Heard("server_evaluate", int(args[0]), {**numbers(args[2]), **numbers({"loss": args[1]})})
    if msg == LEGACY_INITIAL and len(args) == 2:
        return Heard("server_evaluate", 0, {**numbers(args[1]), **numbers({"loss": args[0]})})
    if msg.startswith(NO_AGGREGATE) and args:
        return Heard("no_aggregate", int(args[0]), text=record.getMessage())
    if msg.startswith(MASKED) and len(args) >= 4:
        return Heard("mask", int(args[0]), {"tau": float(args[3]), "zeros": int(args[1]),
                                            "layers": int(args[2])})
    if msg.startswith(ASKS) and len(args) >= 2:
        return Heard("mask", int(args[0]), {"tau": float(args[1]), "mode": "client"})
    if msg.startswith(NOT_MASKED) and len(args) >= 2:
        return Heard("not_masked", int(args[0]), text=record.getMessage())
    if record.levelno >= logging.WARNING:
        return Heard("warning", text=record.getMessage())
    return None


class StrategyLog(logging.Handler):
    """A handler on the ``flwr`` logger that gives each :func:`heard` event to ``listener`` (held weakly)."""

    def __init__(self, listener: Callable[[Heard], None]) -> None:
        super().__init__(level=logging.INFO)
        self._listener = weakref.WeakMethod(listener) if hasattr(listener, "__self__") else lambda: listener
        flwr_logger = logging.getLogger("flwr")
        for gone in [h for h in flwr_logger.handlers if isinstance(h, StrategyLog) and h._listener() is None]:
            gone.close()  # (here, not in emit(): the logger iterates its handlers' list as it emits)
        flwr_logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        listener = self._listener()
        if listener is None:
            return
        try:
            event = heard(record)
        except (TypeError, ValueError):  # (a line of that format with other arguments: not ours)
            return
        if event is not None:
            listener(event)

    def close(self) -> None:
        logging.getLogger("flwr").removeHandler(self)
        super().close()


__all__ = ["Heard", "StrategyLog", "heard", "numbers"]
