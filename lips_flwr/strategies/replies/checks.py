"""What makes one client reply unusable, and why (no flwr import).

The checks read the wire format of both Flower APIs, arrays serialized with
``np.save``, as read-only views (:func:`lips_flwr._npy.read_npy`): no array
data is copied. A reply is rejected when its arrays do not match the global
model (names, count, shapes), cannot be read, are not real numbers, contain
NaN or Inf, or when its example count is not a usable weight. Other real
dtypes are accepted: Flower's FedAvg returns integer buffers as float64 and
FedAdam float64 for a float32 model, and clients send them back (:mod:`.dtypes`
casts them); a bool is a number only for a bool array (:func:`real_for`). The
one full pass, the NaN/Inf test, runs on the aggregate, and on the replies
only to find a culprit.

A new value-level rule on one reply's arrays goes into the gate
(:meth:`.gate.ReplyGate._problem`), which every train reply passes: a reply
whose headers match the global model's (the usual case) never reaches
:func:`reply_problem` or :func:`.headers.fast_reply_problem`, so a rule there
would miss it. A rule that explains a bad aggregate goes into
:func:`culprit_among`.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from ..._npy import NUMPY_SERIALIZATION, npy_shape, read_npy
from ...core.checks import arrays_mismatch, nonfinite_arrays

# Above 2**53 a float64 no longer counts examples exactly; no client has that many.
MAX_NUM_EXAMPLES = 2**53
REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats
MISSING = object()  # a reply without the example count the inner strategy weights by


def real_for(dtype: np.dtype, model: np.dtype) -> bool:
    """Whether a reply array of ``dtype`` holds real numbers for a model array of dtype ``model``."""
    return dtype.kind in REAL_KINDS and (dtype.kind != "b" or model.kind == "b")


def model_shapes(tensors: Mapping[str, bytes]) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of a serialized model (the global model), from the headers."""
    return {name: npy_shape(data) for name, data in tensors.items()}


def serialization_problem(formats: Mapping[str, str]) -> str | None:
    """Why arrays in another serialization than numpy's cannot be checked or averaged."""
    other = {n: f for n, f in formats.items() if f != NUMPY_SERIALIZATION}
    if other:
        name, fmt = next(iter(other.items()))
        return f"array {name!r} is serialized as {fmt!r}, expected {NUMPY_SERIALIZATION!r}"
    return None


def num_examples_problem(value: object, key: str = "num-examples") -> str | None:
    """Why an example count cannot weight a mean, or ``None`` if it can.

    It must be a finite real number in ``(0, 2**53]``: a non-positive weight
    is meaningless (and an all-zero round divides by zero in FedAvg), NaN and
    Inf poison the mean.
    """
    if value is MISSING:
        return f"no {key!r} in its metrics"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{key!r} is {value!r}, not a number"
    number = cast(float, value)  # typeshed's numbers.Real has no `>`
    if not math.isfinite(number) or number <= 0 or number > MAX_NUM_EXAMPLES:
        return f"{key!r} is {value!r}: it must be > 0 and <= 2**53"
    return None


def reply_problem(expected: Mapping[str, tuple], tensors: Mapping[str, bytes], *,
                  finite: bool = True) -> str | None:
    """Why a client reply's arrays must not be aggregated, or ``None`` if they may.

    ``expected``: the global model's shapes (:func:`model_shapes`); ``tensors``:
    the reply's ``.npy`` bytes by name; ``finite=False`` skips the NaN/Inf test,
    the one full pass over the data (the gate tests the aggregate instead, and
    the replies only for a culprit). The example count is the gate's to check
    (:func:`num_examples_problem`).
    """
    arrays = {}
    for name, data in tensors.items():
        try:
            arrays[name] = read_npy(data)
        except ValueError as err:
            return f"array {name!r} is unreadable ({err})"
    reason = arrays_mismatch(expected, {n: a.shape for n, a in arrays.items()})
    if reason is not None:
        return reason
    for name, array in arrays.items():
        if array.dtype.kind not in REAL_KINDS:
            return f"array {name!r} has dtype {array.dtype}, not a real number type"
    bad = nonfinite_arrays(arrays) if finite else []
    if bad:
        return f"NaN or Inf in arrays {bad[:5]}"
    return None


# A metric beyond this is left out: a weighted sum of a million replies, each weighted by up to
# MAX_NUM_EXAMPLES examples as legacy means are (``sum(n * value) / sum(n)``), stays finite.
MAX_METRIC = sys.float_info.max / (MAX_NUM_EXAMPLES * 2**20)  # ~1.9e286


def metric_ok(value: object) -> bool:
    """Whether a metric value (a number or a list of numbers) can enter a weighted mean: finite and
    within ``+-MAX_METRIC`` (NaN fails every comparison). Anything else (text) is not looked at."""
    if isinstance(value, list):
        return all(map(metric_ok, value))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return True
    # As a Python int or float (legacy metrics may hold numpy scalars, which would compare in float32).
    number = int(value) if isinstance(value, numbers.Integral) else float(value)
    return -MAX_METRIC <= number <= MAX_METRIC


def stand_in(bad: object, found: Sequence[tuple[object, float]]) -> object:
    """What a bad metric value ``bad`` becomes: the weighted mean of the ``(value, weight)`` pairs
    of good values of its form, or ``None`` without any; given to a bad value, it leaves the
    weighted mean of all replies the weighted mean of the others.

    Its form: a number for a number, a list of numbers of its length for a
    list (averaged element-wise). Other values under its key are not averaged:
    legacy metrics may hold text, bools or lists of another length there.
    """
    if isinstance(bad, list):
        size = len(bad)
        lists = [(value, weight) for value, weight in found
                 if isinstance(value, list) and len(value) == size and all(map(_number, value))]
        if not lists:
            return None
        total = math.fsum(weight for _, weight in lists)
        return [math.fsum(float(v[i]) * w for v, w in lists) / total for i in range(size)]
    scalars = [(float(cast(float, value)), weight) for value, weight in found if _number(value)]
    if not scalars:
        return None
    total = math.fsum(weight for _, weight in scalars)
    return math.fsum(v * w for v, w in scalars) / total


def _number(value: object) -> bool:
    """Whether ``value`` is a real number that is not a bool (what a mean takes in)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def culprit_among(
    models: Sequence[Mapping[str, np.ndarray]], weights: Sequence[object] | None = None
) -> tuple[int, str] | None:
    """The first model with NaN/Inf, else one whose values are large enough to overflow a sum or a square.

    A sum of ``n`` finite terms overflows only when one is above ``max(dtype)
    / n`` or so; a term is a value times its weight where the strategy
    multiplies before it divides (legacy ``aggregate``: ``layer *
    num_examples``). The model with the largest such term is the culprit.
    Else the model with the largest value whose square overflows float32
    (float64 for float64 arrays): what an adaptive optimizer's second moment
    (FedAdam's ``v_t``) squares. Below both, no model explains a non-finite
    aggregate or state: ``None``.
    """
    for i, model in enumerate(models):
        bad = nonfinite_arrays(model)
        if bad:
            return i, f"NaN or Inf in arrays {bad[:5]}"
    found = [_extremes(model, _scale(weights, i)) for i, model in enumerate(models)]
    if not found:
        return None
    largest = max(range(len(found)), key=lambda i: found[i][0])
    if found[largest][0] >= 1 / (2 * len(models)):
        return largest, f"its values (up to {found[largest][1]:.3g}) overflow the aggregate"
    largest = max(range(len(found)), key=lambda i: found[i][2])
    if found[largest][2] >= 1:
        return largest, f"its values (up to {found[largest][3]:.3g}) overflow when squared"
    return None


def ranked_by_reach(models: Sequence[Mapping[str, np.ndarray]], weights: Sequence[object]) -> list[int]:
    """Indices of ``models``, the one whose (weighted) values come closest to overflowing first."""
    found = [_extremes(model, _scale(weights, i)) for i, model in enumerate(models)]
    return sorted(range(len(models)), key=lambda i: -found[i][0])


def _scale(weights: Sequence[object] | None, index: int) -> float:
    weight = weights[index] if weights is not None else 1.0
    return max(1.0, float(weight)) if isinstance(weight, (int, float)) else 1.0


def _extremes(model: Mapping[str, np.ndarray], scale: float) -> tuple[float, float, float, float]:
    """``(term, its value, square, its value)``: the largest ``|value| * scale / max(dtype)`` of a
    model's floating-point arrays, and the largest ``|value| / sqrt(max)`` (float32's max for
    narrower floats), each with the ``|value|`` it comes from (all 0.0 without floats)."""
    term = term_of = square = square_of = 0.0
    for data in model.values():
        if data.dtype.kind == "f" and data.size:
            peak = float(np.max(np.abs(data)))
            ratio = peak * scale / float(np.finfo(data.dtype).max)
            if ratio > term:
                term, term_of = ratio, peak
            ratio = peak / _SQUARE_BOUND[data.dtype.itemsize > 4]
            if ratio > square:
                square, square_of = ratio, peak
    return term, term_of, square, square_of


# Values above these overflow when squared: in float32 (float16 arrays are squared in float32 or
# wider by Flower's optimizers, or overflow their own state), and in float64.
_SQUARE_BOUND = (math.sqrt(float(np.finfo(np.float32).max)), math.sqrt(float(np.finfo(np.float64).max)))


__all__ = [
    "MAX_METRIC", "MAX_NUM_EXAMPLES", "MISSING", "REAL_KINDS", "culprit_among", "metric_ok", "model_shapes",
    "num_examples_problem", "ranked_by_reach", "real_for", "reply_problem", "serialization_problem",
    "stand_in",
]
