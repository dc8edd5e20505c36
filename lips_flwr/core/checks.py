"""Checks on ``name -> ndarray`` models that both the core and the adapters use (no flwr import)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from .dots import dot


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


_DOT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def all_finite(array: np.ndarray) -> bool:
    """Whether a floating-point array holds no NaN and no Inf.

    For float32/float64 the dot product of the array with itself decides
    first: one pass that writes no array (``isfinite`` writes a boolean per
    entry). NaN and Inf cannot vanish from a sum of products (NaN stays NaN,
    Inf stays Inf or becomes NaN), so a finite result proves every entry
    finite; a result that is not finite (NaN/Inf, or squares that overflow)
    is settled by ``np.isfinite``.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing square is no error here
        return _finite(array)


def _finite(array: np.ndarray) -> bool:
    """:func:`all_finite` without its ``errstate`` (the caller holds one)."""
    if array.dtype in _DOT_DTYPES and array.size:
        flat = array.ravel(order="K")  # no copy for C- or Fortran-ordered arrays
        if math.isfinite(dot(flat, flat)):  # (.dots: no BLAS thread left busy-waiting)
            return True
    return bool(np.isfinite(array).all())


def nonfinite_arrays(arrays: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> list[str]:
    """Names of the floating-point arrays (among ``names``) holding NaN or Inf (:func:`all_finite`).

    One ``errstate`` for the whole model: entering it costs about what a
    small array's test does.
    """
    names = arrays if names is None else names
    with np.errstate(over="ignore", invalid="ignore"):
        return [name for name in names if arrays[name].dtype.kind == "f" and not _finite(arrays[name])]


__all__ = ["all_finite", "arrays_mismatch", "names_problem", "nonfinite_arrays"]
