"""The chain of strategies a LIPS strategy wraps: ``LIPS(DP(FedAvgM(...)))``, and its declared state.

A wrapper (Flower's DP wrappers, ``LIPS``) holds the strategy it wraps in
``.strategy``. What each strategy of the chain keeps between rounds is
declared (:func:`declared_state`); the reply gate checks it, a checkpoint
saves exactly that (:mod:`.resume.chain_state`). Which of its attributes
cache the model its next round builds on is declared too
(:func:`cached_models`): the mask's zeros go there (:mod:`.adapters.cache_sync`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from .flower_state import FLOWER_STATE, FlowerRow


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


def declared_state(strategy: Any) -> tuple[tuple[str, ...], frozenset[str]]:
    """``(state, left out)``: the attributes of ``strategy`` a checkpoint saves, and those it leaves out.

    Read along the strategy's classes from its bases down: Flower's row
    (:data:`.flower_state.FLOWER_STATE`), then the class's own ``lips_state``
    and ``lips_state_exclude``; a class further down overrides its bases.
    """
    return _class_state(type(strategy))[:2]  # type: ignore[arg-type]  # classes hash by identity


def cached_models(strategy: Any) -> tuple[str, ...]:
    """The attributes of ``strategy`` that cache the model its next round builds on: Flower's
    (:data:`.flower_state.FLOWER_STATE`'s "caches the model") and a class's own ``lips_cached_model``,
    along its classes."""
    return _class_state(type(strategy))[2]  # type: ignore[arg-type]


@functools.cache  # read every round by the reply gate's state check: once per class
def _class_state(strategy_class: type) -> tuple[tuple[str, ...], frozenset[str], tuple[str, ...]]:
    state: dict[str, None] = {}
    left_out: set[str] = set()
    caches: dict[str, None] = {}
    for cls in reversed(strategy_class.__mro__):
        row = FLOWER_STATE.get(cls, FlowerRow())
        for name in (*row.state, *_declared(cls, "lips_state")):
            state[name] = None
            left_out.discard(name)
        for name in (*row.rewritten, *_declared(cls, "lips_state_exclude")):
            state.pop(name, None)
            left_out.add(name)
        caches.update(dict.fromkeys((*row.caches, *_declared(cls, "lips_cached_model"))))
    return tuple(state), frozenset(left_out), tuple(caches)


def check_declarations(owner: Any) -> None:
    """``TypeError`` for a ``lips_state``/``lips_state_exclude``/``lips_cached_model`` of the chain that is
    not a tuple of names."""
    for inner in strategy_chain(owner):
        declared_state(inner)


def _declared(cls: type, attribute: str) -> tuple[str, ...]:
    names = vars(cls).get(attribute, ())
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{cls.__name__}.{attribute} must be a tuple of attribute names, got {names!r}")
    return tuple(names)


__all__ = ["cached_models", "check_declarations", "declared_state", "inner_name", "strategy_chain"]
