"""Per-weight importance scores: the entries with the lowest score are zeroed.

All scores are non-negative and computed in at least float32 (float16 products
of small updates and weights underflow to 0 and would turn into ties).

Each score is one row of :data:`SCORE_INPUTS`: its name, its function and what
that function takes besides the weights (``"update"``: the update ``dw``;
``"rng"``: a numpy Generator). The server, the clients and the masking ask
:func:`needs_update` / :func:`needs_rng` rather than comparing names, so a new
score is a function and a row here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _as_score_dtype(array: np.ndarray) -> np.ndarray:
    """View ``array`` in float32 or float64 (float16 is widened to float32)."""
    if array.dtype in (np.float32, np.float64):
        return array
    return array.astype(np.float32)


def sensitivity_score(weights: np.ndarray, update: np.ndarray, *, reuse_update: bool = False) -> np.ndarray:
    """``|update * weights|``: first-order estimate of the loss change of zeroing ``w``.

    The update ``dw`` stands in for the gradient. With ``reuse_update`` the
    scores are written into ``update`` when it has their dtype (the caller's
    own temporary, read no more): the same numbers, one array fewer.
    """
    if update.shape != weights.shape:
        raise ValueError(
            f"update shape {update.shape} does not match weights shape {weights.shape}"
        )
    update, weights = _as_score_dtype(update), _as_score_dtype(weights)
    into = reuse_update and update.flags.writeable and update.dtype == np.result_type(update, weights)
    product = np.multiply(update, weights, out=update if into else None)
    return np.abs(product, out=product)  # in place: one temporary less


def magnitude_score(weights: np.ndarray) -> np.ndarray:
    """``|w|``: the classic magnitude-pruning score."""
    return np.abs(_as_score_dtype(weights))


def random_score(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random scores in [0, 1), reproducible through ``rng``."""
    return rng.random(weights.shape, dtype=np.float64)


# name -> (function, what it takes besides the weights: "update", "rng" or None)
SCORE_INPUTS: dict[str, tuple[Callable[..., np.ndarray], str | None]] = {
    "sensitivity": (sensitivity_score, "update"),
    "magnitude": (magnitude_score, None),
    "random": (random_score, "rng"),
}
SCORES = tuple(SCORE_INPUTS)


def validate_score(score: object) -> str:
    """Return ``score`` if it names a known score, else raise ``ValueError``."""
    if not isinstance(score, str) or score not in SCORE_INPUTS:
        raise ValueError(f"`score` must be one of {SCORES}, got {score!r}")
    return score


def needs_update(score: str) -> bool:
    """Whether ``score`` ranks by the update ``dw`` (the server needs the previous global
    model, a client its last local update)."""
    return SCORE_INPUTS[validate_score(score)][1] == "update"


def needs_rng(score: str) -> bool:
    """Whether ``score`` draws from a numpy Generator (seeded per round and layer by the masking)."""
    return SCORE_INPUTS[validate_score(score)][1] == "rng"


def compute_score(
    score: str,
    weights: np.ndarray,
    update: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
    *,
    reuse_update: bool = False,
) -> np.ndarray:
    """The scores of ``weights`` by the score named ``score`` (one of :data:`SCORES`); with
    ``reuse_update``, a score that takes the update may write its scores into it."""
    function, takes = SCORE_INPUTS[validate_score(score)]
    if takes == "update":
        if update is None:
            raise ValueError(f"the {score!r} score needs the update `dw`")
        return function(weights, update, reuse_update=reuse_update)
    if takes == "rng":
        if rng is None:
            raise ValueError(f"the {score!r} score needs a numpy Generator `rng`")
        return function(weights, rng)
    return function(weights)


__all__ = [
    "SCORES", "SCORE_INPUTS", "compute_score", "magnitude_score", "needs_rng", "needs_update",
    "random_score", "sensitivity_score", "validate_score",
]
