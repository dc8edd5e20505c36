"""Layer-wise inertia diagnostics (spec section 7): similarities and update norms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, accumulated in float64; 0 if either is all zero."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    denom = np.linalg.norm(x) * np.linalg.norm(y)
    return float(x @ y / denom) if denom > 0 else 0.0


def layer_similarities(
    current: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], names: Iterable[str]
) -> dict[str, float]:
    """Per-layer cosine similarity of ``current`` to ``reference``."""
    return {name: cosine_similarity(current[name], reference[name]) for name in names}


def update_norms(updates: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per-layer L2 norm of an update, in float64."""
    return {
        name: float(np.linalg.norm(np.asarray(u, dtype=np.float64).reshape(-1)))
        for name, u in updates.items()
    }
