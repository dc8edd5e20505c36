"""The process-wide generators' states a checkpoint keeps (no flwr import).

Python's ``random`` module, from which Flower's strategies sample nodes, and
numpy's global RNG, from which Flower's DP wrappers draw their noise: taken
after each round, put back on resume, so that a resumed run samples and
draws what the uninterrupted one would. In the file, Python's state is JSON
(lists) and numpy's is its 624 MT19937 keys (an array) beside JSON scalars;
both are checked as they are read: a damaged file fails on load, not mid-run.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import cast

import numpy as np

from ._checks import checked_int


def python_random_state() -> list:
    """Python's ``random`` state as JSON-able lists."""
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def restore_python_random(state: list) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def numpy_random_state() -> tuple:
    """numpy's global RNG state (Flower's DP wrappers draw their noise from it)."""
    # A tuple for the global RNG (MT19937); the stub also allows a dict.
    return cast(tuple, np.random.get_state(legacy=True))


def restore_numpy_random(state: tuple) -> None:
    np.random.set_state(state)


def check_python_random(state: list) -> None:
    """``ValueError`` unless ``state`` is :func:`python_random_state`'s (read back from JSON)."""
    version, internal, gauss = state
    if not (isinstance(version, int) and len(internal) == 625
            and all(isinstance(i, int) for i in internal)
            and (gauss is None or isinstance(gauss, float))):
        raise ValueError("malformed Python random state")


def numpy_random_parts(state: tuple) -> tuple[dict[str, np.ndarray], list]:
    """:func:`numpy_random_state`'s ``state`` as the file keeps it: ``({"keys": keys}, [name, pos,
    has_gauss, cached])``."""
    name, keys, pos, has_gauss, cached = state
    return {"keys": np.asarray(keys, dtype=np.uint32)}, [str(name), int(pos), int(has_gauss), float(cached)]


def numpy_random_from(scalars: list, groups: Mapping[str, Mapping[str, np.ndarray]]) -> tuple:
    """The state :func:`numpy_random_parts` wrote (its ``scalars``, and the keys in the file's
    ``groups``), checked (``ValueError``): for :func:`restore_numpy_random`."""
    name, pos, has_gauss, cached = scalars
    keys = groups["numpy-random"]["keys"]
    if name != "MT19937" or keys.shape != (624,) or keys.dtype != np.uint32:
        raise ValueError("malformed numpy random state")
    return (name, keys, checked_int(pos), checked_int(has_gauss), float(cached))


__all__ = ["check_python_random", "numpy_random_from", "numpy_random_parts", "numpy_random_state",
           "python_random_state", "restore_numpy_random", "restore_python_random"]
