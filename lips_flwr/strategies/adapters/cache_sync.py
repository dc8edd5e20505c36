"""Write the sparsified model into the caches of wrapped strategies.

Some strategies keep their own copy of the model they returned and build the
next round on it, which would silently undo the mask: Message ``FedAvgM``
(``current_arrays``), legacy ``FedAdam``/``FedYogi``/``FedAdagrad``
(``current_weights``) and legacy ``FedAvgM`` with server momentum
(``initial_parameters``): the "caches the model" column of
:data:`..flower_state.FLOWER_STATE`, and a class's own ``lips_cached_model``
(:func:`..chain.cached_models`). Any such cache written during the round's
aggregation gets the mask's zeros, at every level of the chain.

A cache that is the very aggregate LIPS masked (Message ``FedAvgM`` keeps the
record it returns) becomes the masked model itself, as the cache of an
unwrapped ``FedAvgM`` is the model it broadcasts: the same zeros, serialized
once. (Only where the two list their arrays in one order: FedAvgM pairs its
cache with the next aggregate by position. A ``-0.0`` the mask did not pick
stays ``-0.0`` there, as in the broadcast model; zeroing writes ``+0.0``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.masking import zero_where
from ..chain import cached_models, strategy_chain
from ..codecs import ModelCodec


def snapshot_caches(strategy: Any) -> dict[tuple[int, str], int]:
    """Identity of every cache attribute in the chain, taken before aggregation."""
    return {(id(inner), attribute): id(_own(inner, attribute))
            for inner in strategy_chain(strategy) for attribute in cached_models(inner)}


def _own(inner: Any, attribute: str) -> Any:
    """The strategy's own attribute, not one a class attribute or property stands for: only
    an attribute the aggregation rebound on the strategy is its cache."""
    return vars(inner).get(attribute)


def sync_cached_models(strategy: Any, before: dict[tuple[int, str], int], masks: Mapping[str, np.ndarray],
                       codec: ModelCodec, aggregate: Any = None, masked: Any = None) -> list[str]:
    """Zero the ``masks``' positions (``True``: 0 in the broadcast model) in every cache of the
    chain that holds another object than at :func:`snapshot_caches` time (``before``); the
    ``"Class.attribute"`` of each. ``codec`` reads a cached value as arrays and writes the
    zeroed ones back in its type, the others left as the cache holds them (not serialized again).
    A cache that *is* ``aggregate`` (the object the chain returned) is set to ``masked``, the
    model LIPS made of it.

    The positions are zeroed rather than the cache replaced by the broadcast
    model: below a DP wrapper the cache holds the aggregate *before* noise.
    """
    synced = []
    for inner in strategy_chain(strategy):
        for attribute in cached_models(inner):
            value = _own(inner, attribute)
            if value is None or before.get((id(inner), attribute)) == id(value):
                continue
            if aggregate is not None and value is aggregate and list(masked) == list(aggregate):
                setattr(inner, attribute, masked)
                synced.append(f"{type(inner).__name__}.{attribute}")
                continue
            found = codec.to_arrays(value)
            if found is None or any(
                name not in found[1] or np.shape(found[1][name]) != mask.shape
                for name, mask in masks.items()
            ):
                continue
            kind, cached = found
            zeroed = {name: zero_where(cached[name], mask) for name, mask in masks.items()}
            edited = codec.from_arrays(kind, {**cached, **zeroed}, like=value, changed=zeroed)
            setattr(inner, attribute, edited)
            synced.append(f"{type(inner).__name__}.{attribute}")
    return synced
