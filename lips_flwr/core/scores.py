"""Per-weight importance scores: the entries with the lowest score are zeroed.

All scores are non-negative and computed in at least float32 (float16 products
of small updates and weights underflow to 0 and would turn into ties).
"""

from __future__ import annotations

import numpy as np

SCORES = ("sensitivity", "magnitude", "random")


def _as_score_dtype(array: np.ndarray) -> np.ndarray:
    """View ``array`` in float32 or float64 (float16 is widened to float32)."""
    if array.dtype in (np.float32, np.float64):
        return array
    return array.astype(np.float32)


def sensitivity_score(weights: np.ndarray, update: np.ndarray) -> np.ndarray:
    """``|update * weights|``: first-order estimate of the loss change of zeroing ``w``.

    The update ``dw`` stands in for the gradient.
    """
    if update.shape != weights.shape:
        raise ValueError(
            f"update shape {update.shape} does not match weights shape {weights.shape}"
        )
    product = _as_score_dtype(update) * _as_score_dtype(weights)
    return np.abs(product, out=product)  # in place: one temporary less


def magnitude_score(weights: np.ndarray) -> np.ndarray:
    """``|w|``: the classic magnitude-pruning score."""
    return np.abs(_as_score_dtype(weights))


def random_score(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random scores in [0, 1), reproducible through ``rng``."""
    return rng.random(weights.shape, dtype=np.float64)


def compute_score(
    score: str,
    weights: np.ndarray,
    update: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Dispatch on the score's name (one of :data:`SCORES`)."""
    if score == "sensitivity":
        if update is None:
            raise ValueError("the 'sensitivity' score needs the update `dw`")
        return sensitivity_score(weights, update)
    if score == "magnitude":
        return magnitude_score(weights)
    if score == "random":
        if rng is None:
            raise ValueError("the 'random' score needs a numpy Generator `rng`")
        return random_score(weights, rng)
    raise ValueError(f"`score` must be one of {SCORES}, got {score!r}")


def validate_score(score: object) -> str:
    """Return ``score`` if it names a known score, else raise ``ValueError``."""
    if score not in SCORES:
        raise ValueError(f"`score` must be one of {SCORES}, got {score!r}")
    return str(score)


__all__ = [
    "SCORES", "compute_score", "magnitude_score", "random_score", "sensitivity_score",
    "validate_score",
]
