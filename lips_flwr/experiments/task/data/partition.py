"""The paper's low-data label-skewed split, in plain numpy.

Each client ``i`` gets class proportions ``q_i ~ Dir(alpha)`` and draws
exactly ``samples`` examples with those proportions (multinomial counts),
independently of the other clients, so clients may share examples. Its test
set is drawn the same way from the test split with the *same* ``q_i``. All
draws are seeded by ``(seed, partition_id)``: a client's partition does not
depend on how many other clients exist or in which order they are built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Salts of the random streams: one for the proportions, one per split drawn.
_PROPORTIONS, _TRAIN, _TEST = 0, 1, 2
SPLIT_SALTS = {"train": _TRAIN, "test": _TEST}


def _require(name: str, ok: bool, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"`{name}` must be {allowed}, got {value!r}")


def class_proportions(num_classes: int, partition_id: int, alpha: float, seed: int) -> np.ndarray:
    """``q ~ Dir(alpha)`` of one client (the same for its train and test sets)."""
    _require("alpha", alpha > 0, "> 0", alpha)
    rng = np.random.default_rng([seed, partition_id, _PROPORTIONS])
    q = rng.dirichlet([alpha] * num_classes)
    if not np.all(np.isfinite(q)) or q.sum() <= 0:  # tiny alpha can underflow to all zeros
        q = np.zeros(num_classes)
        q[rng.integers(num_classes)] = 1.0
    return q / q.sum()


def low_data_indices(
    labels: np.ndarray,
    partition_id: int,
    samples: int,
    alpha: float,
    seed: int = 0,
    split: str = "train",
    num_classes: int | None = None,
    pools: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Indices into ``labels`` of one client's ``samples`` examples.

    Parameters
    ----------
    labels : np.ndarray
        Integer class labels of the whole split.
    partition_id : int
        The client, >= 0.
    samples : int
        Exactly this many indices are returned (100 in the paper's main setup).
    alpha : float
        Dirichlet concentration (0.1 main; 0.01, 0.5 in sweeps).
    seed : int
        Seed of the whole partitioning.
    split : str
        ``"train"`` or ``"test"``: independent draws with the same proportions.
    num_classes : int, optional
        Defaults to ``labels.max() + 1``.
    pools : sequence of np.ndarray, optional
        :func:`class_indices` of ``labels`` and ``num_classes``, where the
        caller keeps them for all its clients (found here otherwise: a pass
        over ``labels`` per class drawn).

    A class with fewer examples than the client needs is drawn with replacement.
    """
    labels = np.asarray(labels)
    _require("partition_id", partition_id >= 0, ">= 0", partition_id)
    _require("samples", isinstance(samples, (int, np.integer)) and samples >= 1, "an integer >= 1", samples)
    _require("split", split in SPLIT_SALTS, f"one of {tuple(SPLIT_SALTS)}", split)
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    q = class_proportions(num_classes, partition_id, alpha, seed)
    present = (np.bincount(labels, minlength=num_classes) if pools is None
               else np.array([pool.size for pool in pools])) > 0
    if not present.all():  # a class missing from this split cannot be drawn
        q = np.where(present, q, 0.0)
        q = q / q.sum() if q.sum() > 0 else present / present.sum()
    rng = np.random.default_rng([seed, partition_id, SPLIT_SALTS[split]])
    counts = rng.multinomial(samples, q)
    chosen = []
    for c in np.flatnonzero(counts):
        pool = np.flatnonzero(labels == c) if pools is None else pools[int(c)]
        chosen.append(rng.choice(pool, size=counts[c], replace=counts[c] > pool.size))
    return rng.permutation(np.concatenate(chosen))


def class_indices(labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, ...]:
    """``np.flatnonzero(labels == c)`` for each class ``c`` in ``0 .. num_classes - 1``: the pools
    :func:`low_data_indices` draws from. Raises ``ValueError`` for a label outside them."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must be in 0 .. {num_classes - 1}, got {labels.min()} .. {labels.max()}")
    pools = tuple(np.flatnonzero(labels == c) for c in range(num_classes))
    for pool in pools:
        pool.flags.writeable = False  # (kept for every client a process builds)
    return pools


__all__ = ["SPLIT_SALTS", "class_indices", "class_proportions", "low_data_indices"]
