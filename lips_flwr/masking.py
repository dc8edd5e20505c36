"""Exact-count masking of the lowest-scoring weights.

``sparsify`` is the one function both strategy adapters and the client side
call: it takes an ordered ``name -> ndarray`` model and returns a new one in
which each selected tensor has exactly ``ceil(n * tau)`` zeros, chosen by the
lowest score. Selection is O(n) (``np.partition`` finds the threshold) and ties
are broken by position, so the same inputs always give the same mask.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .layers import is_candidate
from .scores import compute_score


def num_zeros(size: int, tau: float) -> int:
    """``ceil(size * tau)``, clamped to ``[0, size]``.

    A product within float noise (relative 1e-12) of a positive integer counts
    as that integer, so ``100 * 0.07 = 7.000000000000001`` (or
    ``1e8 * 0.07 = 7000000.000000001``) does not add a zero; any ``tau > 0``
    zeroes at least one entry.
    """
    if tau <= 0.0 or size == 0:
        return 0
    product = size * tau
    nearest = round(product)
    if nearest < 1 or abs(product - nearest) > 1e-12 * product:
        nearest = math.ceil(product)
    return min(size, nearest)


def lowest_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` lowest entries of ``scores``, in ascending index order.

    Ties at the threshold go to the lowest positions; NaN scores rank highest.
    """
    flat = scores.reshape(-1)
    n = flat.size
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    if k >= n:
        return np.arange(n, dtype=np.intp)
    threshold = np.partition(flat, k - 1)[k - 1]
    if np.isnan(threshold):  # fewer than k finite scores: all of them, then NaNs
        below = np.flatnonzero(~np.isnan(flat))
        ties = np.flatnonzero(np.isnan(flat))
    else:
        below = np.flatnonzero(flat < threshold)
        ties = np.flatnonzero(flat == threshold)
    chosen = np.concatenate([below, ties[: k - below.size]])
    chosen.sort()
    return chosen


def mask_lowest(weights: np.ndarray, scores: np.ndarray, tau: float) -> tuple[np.ndarray, int]:
    """``weights`` with its ``ceil(n * tau)`` lowest-score entries zeroed, and that count.

    Entries that are already zero rank below every other entry. ``weights`` is
    not modified: the result is a copy with the same dtype and shape, or
    ``weights`` itself when ``tau`` asks for no zeros.
    """
    k = num_zeros(weights.size, tau)
    if k == 0:
        return weights, 0
    scores = np.where(weights == 0, -np.inf, scores)
    masked = np.array(weights, copy=True, order="C")
    masked.reshape(-1)[lowest_indices(scores, k)] = 0
    return masked, k


def model_update(
    new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray], names: Sequence[str]
) -> dict[str, np.ndarray]:
    """``new - old`` for the tensors in ``names`` (the update ``dw``)."""
    return {
        name: np.subtract(new[name], old[name], dtype=np.result_type(new[name], np.float32))
        for name in names
    }


def sparsify(
    arrays: Mapping[str, np.ndarray],
    layers: Sequence[str],
    tau: float,
    *,
    score: str = "sensitivity",
    updates: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    salt: Sequence[int] = (),
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Zero the lowest-scoring ``tau`` fraction of each tensor in ``layers``.

    Parameters
    ----------
    arrays : Mapping[str, np.ndarray]
        The model; not modified.
    layers : Sequence[str]
        Names of the tensors to sparsify (see :func:`lips_flwr.layers.select_layers`);
        ``ValueError`` if one is not a candidate (integer, rank < 2, BN buffer).
    tau : float
        Fraction zeroed per tensor, in [0, 1].
    score : str (default: "sensitivity")
        ``"sensitivity"`` (needs ``updates``), ``"magnitude"`` or ``"random"``.
    updates : Mapping[str, np.ndarray], optional
        The update ``dw`` per layer, for the sensitivity score.
    seed, salt : int, sequence of int
        Seed the random score: layer ``i`` uses ``default_rng([seed, *salt, i])``,
        so a round (salt) always gets the same mask, whatever else ran before.

    Returns
    -------
    tuple[dict[str, np.ndarray], dict[str, int]]
        The model with every tensor in its original order (unmasked tensors are
        the input objects) and the number of zeros placed per masked layer.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"`tau` must be in [0, 1], got {tau}")
    out = dict(arrays)
    zeros: dict[str, int] = {}
    if tau == 0.0:
        return out, zeros
    for index, name in enumerate(layers):
        weights = arrays[name]
        if not is_candidate(name, weights):  # the guarantee holds whoever picked the layers
            raise ValueError(
                f"{name!r} ({weights.dtype}, shape {weights.shape}) is not eligible for "
                "sparsification: only floating-point tensors of rank >= 2 are"
            )
        update = None if updates is None else updates.get(name)
        rng = np.random.default_rng([seed, *salt, index]) if score == "random" else None
        scores = compute_score(score, weights, update, rng)
        out[name], zeros[name] = mask_lowest(weights, scores, tau)
    return out, zeros
