"""Checks on ``name -> ndarray`` models that both the core and the adapters use (no flwr import)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np


def arrays_mismatch(expected: Mapping[str, tuple], received: Mapping[str, tuple]) -> str | None:
    """Why a reply's arrays do not fit the global model, or ``None`` if they do.

    Both arguments map names to shapes. Names and shapes must match; order is
    not checked (Flower's aggregation matches by name).
    """
    missing = [n for n in expected if n not in received]
    extra = [n for n in received if n not in expected]
    if missing or extra:
        parts = [f"missing arrays {missing[:5]}"] if missing else []
        parts += [f"unexpected arrays {extra[:5]}"] if extra else []
        return "; ".join(parts)
    for name, shape in expected.items():
        if tuple(received[name]) != tuple(shape):
            return f"array {name!r} has shape {tuple(received[name])}, expected {tuple(shape)}"
    return None


def names_problem(arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why these names cannot label these arrays, or ``None`` if they may.

    Only what is certain is checked: PyTorch's batch-norm buffers
    ``running_mean``/``running_var`` have rank 1 and ``num_batches_tracked``
    rank 0, and LIPS relies on these names to leave batch norm alone. Names
    given in the wrong order (legacy ``param_names``) usually break this.
    """
    for name, array in arrays.items():
        rank = 0 if name.endswith("num_batches_tracked") else 1
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")) and array.ndim != rank:
            return f"{name!r} names an array of shape {tuple(array.shape)} (expected rank {rank})"
    return None


def nonfinite_arrays(arrays: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> list[str]:
    """Names of the floating-point arrays (among ``names``) holding NaN or Inf."""
    names = arrays if names is None else names
    return [
        name for name in names
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all()
    ]


__all__ = ["arrays_mismatch", "names_problem", "nonfinite_arrays"]
