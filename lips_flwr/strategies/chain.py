"""The chain of strategies a LIPS strategy wraps: ``LIPS(DP(FedAvgM(...)))``.

A wrapper (Flower's DP wrappers, ``LIPS``) holds the strategy it wraps in
``.strategy``; the reply gate, the cache sync and the checkpoint walk the
chain from the LIPS strategy down.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def strategy_chain(strategy: Any) -> Iterator[Any]:
    """``strategy``, the strategy it wraps, the one that wraps, ..."""
    seen: set[int] = set()
    while strategy is not None and id(strategy) not in seen:
        seen.add(id(strategy))
        yield strategy
        strategy = getattr(strategy, "strategy", None)


def inner_name(chain: list[Any]) -> str:
    """The class name of the strategy LIPS wraps (the LIPS strategy's own for the FedAvg subclasses)."""
    return type(chain[1] if len(chain) > 1 else chain[0]).__name__


__all__ = ["inner_name", "strategy_chain"]
