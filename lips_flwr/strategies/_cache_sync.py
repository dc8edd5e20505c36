"""Write the sparsified model into the caches of wrapped strategies.

Some strategies keep their own copy of the model they returned and build the
next round on it, which would silently undo the mask: Message ``FedAvgM``
(``current_arrays``), legacy ``FedAdam``/``FedYogi``/``FedAdagrad``
(``current_weights``) and legacy ``FedAvgM`` with server momentum
(``initial_parameters``). Any cache that still holds the unmasked aggregate is
replaced, at every level of a chain of wrappers (``.strategy``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

CACHE_ATTRIBUTES = ("current_arrays", "current_weights", "initial_parameters")


def strategy_chain(strategy: Any) -> Iterator[Any]:
    """``strategy``, the strategy it wraps, the one that wraps, ..."""
    seen: set[int] = set()
    while strategy is not None and id(strategy) not in seen:
        seen.add(id(strategy))
        yield strategy
        strategy = getattr(strategy, "strategy", None)


def _same_model(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return list(a) == list(b) and all(
        np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a
    )


def sync_cached_models(
    strategy: Any,
    aggregate: Any,
    unmasked: Mapping[str, np.ndarray],
    masked: Mapping[str, np.ndarray],
    to_numpy: Callable[[Any], Mapping[str, np.ndarray] | None],
    from_numpy: Callable[[Any, Mapping[str, np.ndarray]], Any],
) -> list[str]:
    """Replace every cached copy of ``unmasked`` by ``masked``.

    Parameters
    ----------
    strategy : Any
        The wrapped strategy (the chain below it is searched too).
    aggregate : Any
        The object the strategy returned (a cache holding this very object is
        replaced without comparing contents).
    unmasked, masked : Mapping[str, np.ndarray]
        The aggregate before and after sparsification.
    to_numpy : callable
        Cached value -> ``name -> ndarray``, or ``None`` if it is not a model.
    from_numpy : callable
        ``(cached value, arrays) -> value`` of the cached value's own type.

    Returns
    -------
    list[str]
        ``"ClassName.attribute"`` of each cache that was updated.
    """
    synced = []
    for inner in strategy_chain(strategy):
        for attribute in CACHE_ATTRIBUTES:
            value = getattr(inner, attribute, None)
            if value is None:
                continue
            if value is not aggregate:
                cached = to_numpy(value)
                if cached is None or not _same_model(cached, unmasked):
                    continue
            setattr(inner, attribute, from_numpy(value, masked))
            synced.append(f"{type(inner).__name__}.{attribute}")
    return synced
