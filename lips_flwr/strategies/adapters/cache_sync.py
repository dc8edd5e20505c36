"""Write the sparsified model into the caches of wrapped strategies.

Some strategies keep their own copy of the model they returned and build the
next round on it, which would silently undo the mask: Message ``FedAvgM``
(``current_arrays``), legacy ``FedAdam``/``FedYogi``/``FedAdagrad``
(``current_weights``) and legacy ``FedAvgM`` with server momentum
(``initial_parameters``). Any such cache written during the round's
aggregation gets the mask's zeros, at every level of the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..chain import strategy_chain

CACHE_ATTRIBUTES = ("current_arrays", "current_weights", "initial_parameters")


def snapshot_caches(strategy: Any) -> dict[tuple[int, str], int]:
    """Identity of every cache attribute in the chain, taken before aggregation."""
    return {(id(inner), attribute): id(_own(inner, attribute))
            for inner in strategy_chain(strategy) for attribute in CACHE_ATTRIBUTES}


def _own(inner: Any, attribute: str) -> Any:
    """The strategy's own attribute, not one a class attribute or property stands for: only
    an attribute the aggregation rebound on the strategy is its cache."""
    return vars(inner).get(attribute)


def sync_cached_models(strategy: Any, before: dict[tuple[int, str], int], masks: Mapping[str, np.ndarray],
                       to_numpy: Callable[[Any], Mapping[str, np.ndarray] | None],
                       from_numpy: Callable[[Any, Mapping[str, np.ndarray]], Any]) -> list[str]:
    """Zero the ``masks``' positions (``True``: 0 in the broadcast model) in every cache of the
    chain that holds another object than at :func:`snapshot_caches` time (``before``); the
    ``"Class.attribute"`` of each. ``to_numpy``/``from_numpy`` read a cached value as
    ``name -> ndarray`` (``None``: not a model) and write one back in its type.

    The positions are zeroed rather than the cache replaced by the broadcast
    model: below a DP wrapper the cache holds the aggregate *before* noise.
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
