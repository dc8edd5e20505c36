"""InertiaTracker: similarities to the reference round and to the previous round."""

from __future__ import annotations

import numpy as np
import pytest

from lips_flwr.core.inertia import InertiaTracker


def model(scale_a: float, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"a": np.full((2, 3), scale_a, dtype=np.float32), "b": b.astype(np.float32)}


def test_series_against_reference_and_previous_round():
    tracker = InertiaTracker(t0=2)
    b1, b2, b3 = np.eye(3), np.eye(3) + 1, -np.eye(3)
    assert tracker.update(1, model(1.0, b1), ["a", "b"]) == {}
    m2 = tracker.update(2, model(2.0, b2), ["a", "b"])
    assert set(m2) == {"inertia-cos-prev/a", "inertia-cos-prev/b", "inertia-step/a", "inertia-step/b"}
    assert m2["inertia-cos-prev/a"] == pytest.approx(1.0)  # same direction, other scale
    assert m2["inertia-step/a"] == pytest.approx(np.sqrt(6))
    m3 = tracker.update(3, model(3.0, b3), ["a", "b"])
    assert m3["inertia-cos-t0/a"] == pytest.approx(1.0)
    expected = float((b3 * b2).sum() / (np.linalg.norm(b3) * np.linalg.norm(b2)))
    assert m3["inertia-cos-t0/b"] == pytest.approx(expected)
    assert m3["inertia-cos-prev/b"] == pytest.approx(expected)


def test_tracker_copies_the_model_and_checks_t0():
    tracker = InertiaTracker(t0=1)
    m = model(1.0, np.eye(3))
    tracker.update(1, m, ["a"])
    m["a"][:] = -1.0  # a caller reusing its buffers must not change the reference
    assert tracker.update(2, model(1.0, np.eye(3)), ["a"])["inertia-cos-t0/a"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="`t0` must be an integer >= 1"):
        InertiaTracker(t0=0)
