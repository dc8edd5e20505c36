"""Which tensors LIPS may sparsify ("middle" layers).

Candidates are floating-point tensors of rank >= 2 (conv kernels, linear
weights). Biases and batch-norm affine parameters are rank 1; batch-norm
running statistics and ``num_batches_tracked`` are excluded by name too, so a
candidate is never one of them whatever its shape.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence

import numpy as np

PRESETS = ("middle", "all", "reference")
BN_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")

LayerPredicate = Callable[[str, np.ndarray], bool]
LayerSpec = str | Sequence[str] | LayerPredicate


def is_candidate(name: str, array: np.ndarray) -> bool:
    """Whether ``array`` is a floating-point weight tensor of rank >= 2."""
    # (dtype.kind "f": numpy's floating dtypes, as np.issubdtype(dtype, np.floating), which is Python
    # code and 20x slower; a client asks this of every tensor in every call.)
    return array.ndim >= 2 and array.dtype.kind == "f" and not name.endswith(BN_BUFFER_SUFFIXES)


def candidate_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Names of all candidate tensors, in the model's order."""
    return [name for name, array in arrays.items() if is_candidate(name, array)]


def _is_reference_excluded(name: str, array: np.ndarray) -> bool:
    # The authors' code skips every nn.Linear (rank-2 weights) and recognises
    # the stem by its 7x7 kernel or the VGG name ``features.0``.
    return array.ndim == 2 or array.shape[-2:] == (7, 7) or name.startswith("features.0.")


def validate_layers(layers: object) -> LayerSpec:
    """Check the form of a layer specification; raise ``ValueError`` if unusable."""
    if isinstance(layers, str):
        if layers not in PRESETS:
            raise ValueError(
                f"`layers` must be one of {PRESETS}, a list of names or glob patterns, "
                f"or a callable (name, array) -> bool; got {layers!r}"
            )
        return layers
    if callable(layers):
        return layers
    if isinstance(layers, Sequence) and layers and all(isinstance(p, str) for p in layers):
        return tuple(layers)
    raise ValueError(
        f"`layers` must be one of {PRESETS}, a non-empty list of names or glob "
        f"patterns, or a callable (name, array) -> bool; got {layers!r}"
    )


def select_layers(arrays: Mapping[str, np.ndarray], layers: LayerSpec = "middle") -> list[str]:
    """Names of the tensors to sparsify, in the model's order.

    Parameters
    ----------
    arrays : Mapping[str, np.ndarray]
        The model, name -> array, in the order the model defines them.
    layers : str, sequence of str or callable (default: "middle")
        ``"middle"``: every candidate but the first (stem) and the last
        (classifier). ``"all"``: every candidate. ``"reference"``: the authors'
        rule (no linear layers, no 7x7 stem, no ``features.0``). A sequence:
        names or :mod:`fnmatch` patterns; each must match a candidate. A callable
        ``(name, array) -> bool`` is asked about each candidate.
    """
    layers = validate_layers(layers)
    candidates = candidate_names(arrays)
    if layers == "middle":
        return candidates[1:-1]
    if layers == "all":
        return candidates
    if layers == "reference":
        return [n for n in candidates if not _is_reference_excluded(n, arrays[n])]
    if callable(layers):
        return [n for n in candidates if layers(n, arrays[n])]
    chosen: set[str] = set()
    for pattern in layers:
        if pattern in arrays and pattern not in candidates:
            raise ValueError(
                f"layer {pattern!r} is not eligible for sparsification: only "
                "floating-point tensors of rank >= 2 are (no biases, batch norm "
                "or integer buffers)"
            )
        matched = fnmatch.filter(candidates, pattern)
        if not matched:
            raise ValueError(
                f"layer pattern {pattern!r} matches no eligible tensor; eligible: "
                f"{candidates}"
            )
        chosen.update(matched)
    return [n for n in candidates if n in chosen]


def batch_norm_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Names of batch-norm parameters and buffers, recognised by their running stats.

    A module ``m`` is batch norm when ``m.running_mean`` is present; then
    ``m.weight``, ``m.bias``, ``m.running_mean``, ``m.running_var`` and
    ``m.num_batches_tracked`` are its tensors. Models sent without buffers
    cannot be recognised this way: name the tensors explicitly instead.
    """
    prefixes = {n[: -len("running_mean")] for n in arrays if n.endswith("running_mean")}
    return [n for n in arrays if any(n.startswith(p) and "." not in n[len(p):] for p in prefixes)]


__all__ = [
    "BN_BUFFER_SUFFIXES", "LayerPredicate", "LayerSpec", "PRESETS", "batch_norm_names",
    "candidate_names", "is_candidate", "select_layers", "validate_layers",
]
