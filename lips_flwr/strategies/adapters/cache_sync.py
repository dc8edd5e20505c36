"""Write the sparsified model into the caches of wrapped strategies.

Some strategies keep their own copy of the model they returned and build the
next round on it, which would silently undo the mask: Message ``FedAvgM``
(``current_arrays``), legacy ``FedAdam``/``FedYogi``/``FedAdagrad``
(``current_weights``) and legacy ``FedAvgM`` with server momentum
(``initial_parameters``). Any such cache written during the round's
aggregation gets the mask's zeros, at every level of a chain of wrappers (``.strategy``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..chain import strategy_chain

CACHE_ATTRIBUTES = ("current_arrays", "current_weights", "initial_parameters")


def snapshot_caches(strategy: Any) -> dict[tuple[int, str], int]:
    """Identity of every cache attribute in the chain, taken before aggregation."""
    return {
        (id(inner), attribute): id(_own(inner, attribute))
        for inner in strategy_chain(strategy)
        for attribute in CACHE_ATTRIBUTES
    }


def _own(inner: Any, attribute: str) -> Any:
    """The strategy's own attribute, not one a class attribute or property stands for: only
    an attribute the aggregation rebound on the strategy is its cache."""
    return vars(inner).get(attribute)


def sync_cached_models(
    strategy: Any,
    before: dict[tuple[int, str], int],
    masks: Mapping[str, np.ndarray],
    to_numpy: Callable[[Any], Mapping[str, np.ndarray] | None],
    from_numpy: Callable[[Any, Mapping[str, np.ndarray]], Any],
) -> list[str]:
    """Zero the masked positions in every cache the strategy chain wrote this round.

    A cache counts as written when its attribute now holds another object than
    at :func:`snapshot_caches` time. The same positions are zeroed there, rather
    than the cache being replaced by the broadcast model: below a DP wrapper
    the cache holds the aggregate *before* noise, and must keep it.

    Parameters
    ----------
    strategy : Any
        The outermost strategy (the chain below it is searched too).
    before : dict
        The result of :func:`snapshot_caches` before the aggregation.
    masks : Mapping[str, np.ndarray]
        Per masked layer, a boolean array: ``True`` where the broadcast model is 0.
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
            value = _own(inner, attribute)
            if value is None or before.get((id(inner), attribute)) == id(value):
                continue
            cached = to_numpy(value)
            if cached is None or any(
                name not in cached or np.shape(cached[name]) != mask.shape
                for name, mask in masks.items()
            ):
                continue
            edited = dict(cached)
            for name, mask in masks.items():
                edited[name] = np.where(mask, np.zeros_like(cached[name]), cached[name])
            setattr(inner, attribute, from_numpy(value, edited))
            synced.append(f"{type(inner).__name__}.{attribute}")
    return synced
