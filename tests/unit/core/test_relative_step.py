"""inertia-rel-step/<layer>: the relative step of the unmasked aggregate from the broadcast model."""

from __future__ import annotations

import numpy as np
import pytest

from lips_flwr.core.inertia import InertiaTracker, relative_step, relative_steps
from lips_flwr.core.lips import LIPSCore

# Four weight layers (first, two middle, last) and a bias: the first and last are
# not masked (layers="middle") but their steps are reported too, for heatmaps.
PREVIOUS = {
    "first.weight": np.array([[3.0, 0.0], [0.0, 4.0]], dtype=np.float32),  # norm 5
    "first.bias": np.array([1.0, 2.0], dtype=np.float32),
    "mid1.weight": np.array([[1.0, 1.0], [1.0, 1.0]], dtype=np.float32),  # norm 2
    "mid2.weight": np.zeros((2, 2), dtype=np.float32),  # norm 0: relative step 0
    "last.weight": np.array([[0.0, 8.0]], dtype=np.float32),  # norm 8
}
AGGREGATE = {
    "first.weight": np.array([[3.75, 0.0], [0.0, 5.0]], dtype=np.float32),  # step (0.75, 1): 1.25
    "first.bias": np.array([5.0, 5.0], dtype=np.float32),
    "mid1.weight": np.array([[1.5, 1.5], [1.5, 1.5]], dtype=np.float32),  # step norm 1
    "mid2.weight": np.ones((2, 2), dtype=np.float32),
    "last.weight": np.array([[6.0, 0.0]], dtype=np.float32),  # step (6, -8): 10
}
EXPECTED = {"first.weight": 0.25, "mid1.weight": 0.5, "mid2.weight": 0.0, "last.weight": 1.25}


def test_relative_steps_exact_values():
    names = ["first.weight", "mid1.weight", "mid2.weight", "last.weight"]
    steps = relative_steps(AGGREGATE, PREVIOUS, names)
    assert steps == EXPECTED
    assert all(type(v) is float for v in steps.values())


def test_one_formula_and_the_zero_norm_layer_named_at_each_use():
    """relative_step is the formula; a zero-norm layer is None there, 0.0 in the core's metrics
    (a number, and the trigger's series take every layer), None in the runner's observer (reports
    leave it out). Before, the two computed it apart and disagreed without saying so."""
    names = ["first.weight", "mid1.weight", "mid2.weight", "last.weight"]
    single = {n: relative_step(AGGREGATE[n], PREVIOUS[n]) for n in names}
    assert single == {**EXPECTED, "mid2.weight": None}
    assert relative_steps(AGGREGATE, PREVIOUS, names) == {**single, "mid2.weight": 0.0}


def test_relative_steps_accumulate_in_float64():
    # float32 would lose the step entirely: 1e8 + 1 == 1e8 in float32, not in float64.
    start = {"w": np.array([[1e8, 0.0]], dtype=np.float64)}
    current = {"w": np.array([[1e8 + 1.0, 0.0]], dtype=np.float64)}
    assert relative_steps(current, start, ["w"]) == {"w": 1e-8}


def test_the_core_reports_every_weight_layer_first_and_last_included():
    core = LIPSCore(num_rounds=10, every=5, inertia_t0=1)
    metrics = core.round(2, AGGREGATE, PREVIOUS).metrics  # not a mask round
    got = {k[len("inertia-rel-step/"):]: v for k, v in metrics.items() if k.startswith("inertia-rel-step/")}
    assert got == EXPECTED  # exact; no bias, first and last layers included
    # The layers masked are still the middle ones only.
    assert core.layer_names(AGGREGATE) == ["mid1.weight", "mid2.weight"]


def test_the_step_is_taken_from_the_broadcast_model_not_the_previous_aggregate():
    """After a server-mode mask the next step starts from the masked (broadcast) model."""
    core = LIPSCore(num_rounds=10, every=5, tau0=0.5, score="magnitude", inertia_t0=1)
    first = core.round(1, AGGREGATE, PREVIOUS)  # a mask round: mid1 loses half its weights
    assert first.model is not None
    broadcast = first.model
    assert first.metrics["inertia-rel-step/mid1.weight"] == 0.5  # from PREVIOUS
    second_aggregate = {n: a + np.float32(1.0) if a.ndim == 2 else a for n, a in AGGREGATE.items()}
    metrics = core.round(2, second_aggregate, broadcast).metrics
    for name in EXPECTED:
        before = broadcast[name].astype(np.float64).ravel()
        after = second_aggregate[name].astype(np.float64).ravel()
        norm = np.linalg.norm(before)
        expected = float(np.linalg.norm(after - before)) / float(norm) if norm > 0 else 0.0
        assert metrics[f"inertia-rel-step/{name}"] == expected
    # mid1 (all 1.5) after the mask: two entries zeroed; all then move to 2.5, so the
    # step is (2.5, 2.5, 1, 1) from a model (0, 0, 1.5, 1.5), in some order.
    zeroed = int((broadcast["mid1.weight"] == 0).sum())
    assert zeroed == 2
    expected_mid1 = np.sqrt(2 * 2.5**2 + 2 * 1.0**2) / np.sqrt(2 * 1.5**2)
    assert metrics["inertia-rel-step/mid1.weight"] == pytest.approx(expected_mid1, rel=1e-15)


def test_no_relative_step_without_inertia_t0_or_previous_model():
    metrics = LIPSCore(num_rounds=10, every=5).round(2, AGGREGATE, PREVIOUS).metrics
    assert not any(k.startswith("inertia-") for k in metrics)
    metrics = LIPSCore(num_rounds=10, every=5, inertia_t0=1).round(2, AGGREGATE, None).metrics
    assert not any(k.startswith("inertia-rel-step/") for k in metrics)


def test_the_tracker_itself_is_unchanged():
    """The tracker keeps its three series; the relative step needs the broadcast model it lacks."""
    tracker = InertiaTracker(t0=1)
    tracker.update(1, PREVIOUS, ["first.weight"])
    assert set(tracker.update(2, AGGREGATE, ["first.weight"])) == {
        "inertia-cos-t0/first.weight", "inertia-cos-prev/first.weight", "inertia-step/first.weight"}


def test_a_large_layers_step_is_the_float64_formula_bit_for_bit():
    # relative_step takes the difference a block at a time (dots.difference_norm): the same bits as
    # the whole float64 arrays, for float32 and float64 layers, any layout, and None for a NaN norm.
    from lips_flwr.core.dots import norm

    rng = np.random.default_rng(12)
    start = rng.normal(size=(256, 256, 3, 3)).astype(np.float32)
    for dtype in (np.float32, np.float64):
        before = start.astype(dtype)
        after = (before + rng.normal(size=before.shape) * 1e-3).astype(dtype)
        for now, then in ((after, before), (np.asfortranarray(after), before), (after[::2], before[::2])):
            b64, a64 = np.asarray(then, np.float64).reshape(-1), np.asarray(now, np.float64).reshape(-1)
            assert relative_step(now, then) == norm(a64 - b64) / norm(b64)
    nan = start.copy()
    nan[0, 0, 0, 0] = np.nan
    assert relative_step(start, nan) is None and relative_step(start, np.zeros_like(start)) is None
