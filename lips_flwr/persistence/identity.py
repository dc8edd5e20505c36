"""The identity of a run: a fingerprint of its initial global model, kept in its checkpoint.

A checkpoint records the run that wrote it (``Checkpoint.identity``): the
fingerprint of that run's *initial* model (:func:`model_fingerprint`: names,
shapes, dtypes, SHA-256 of the bytes), its settings and its number of rounds,
taken at the first save and kept for the whole run. A resume given another
initial model is refused (:func:`fingerprint_mismatch` says how they differ):
the file was written by another run, and continuing it would mix two runs.
:func:`check_identity` checks the record's shape when a checkpoint is loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._checks import check_settings, checked_int


def check_identity(identity: Any, model: Mapping[str, np.ndarray]) -> None:
    """The run's identity: well formed, and its initial model has the names and shapes of ``model``."""
    initial = identity["initial_model"]
    names, shapes, dtypes, digest = (initial[k] for k in ("names", "shapes", "dtypes", "sha256"))
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and isinstance(shapes, list) and len(shapes) == len(names)
            and all(isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in s) for s in shapes)
            and isinstance(dtypes, list) and len(dtypes) == len(names)
            and all(isinstance(d, str) and np.dtype(d).kind in "biufc" for d in dtypes)
            and isinstance(digest, str) and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest)):
        raise ValueError("malformed run identity")
    check_settings(identity["settings"], "run identity")
    checked_int(identity["num_rounds"])
    if names != list(model) or any(list(np.shape(model[n])) != s for n, s in zip(names, shapes)):
        raise ValueError("its model does not have the names and shapes of the initial model "
                         "of the run that wrote it")


def model_fingerprint(model: Mapping[str, np.ndarray]) -> dict:
    """Names, shapes, dtypes and SHA-256 of the bytes of ``model``: a run's initial model's identity."""
    digest = hashlib.sha256()
    names, shapes, dtypes = [], [], []
    for name, value in model.items():
        array = np.asarray(value)
        names.append(name)
        shapes.append([int(d) for d in array.shape])
        dtypes.append(array.dtype.str)
        digest.update(json.dumps([name, shapes[-1], dtypes[-1]]).encode("utf-8"))
        # (ascontiguousarray makes a 0-d array 1-d: only the bytes are taken from it)
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return {"names": names, "shapes": shapes, "dtypes": dtypes, "sha256": digest.hexdigest()}


def fingerprint_mismatch(saved: Mapping[str, Any], model: Mapping[str, np.ndarray]) -> str | None:
    """How ``model`` differs from the model of fingerprint ``saved``, or ``None`` when it is that model."""
    now = model_fingerprint(model)
    if now == dict(saved):
        return None
    if now["names"] != saved["names"]:
        return "other arrays"
    for what in ("shapes", "dtypes"):
        differ = [n for n, a, b in zip(now["names"], saved[what], now[what]) if a != b]
        if differ:
            return f"{what} differ in {differ[:5]}"
    return "the same names, shapes and dtypes, other values"


__all__ = ["check_identity", "fingerprint_mismatch", "model_fingerprint"]
