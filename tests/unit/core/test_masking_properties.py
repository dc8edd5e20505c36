"""Property tests (hypothesis) for exact-count masking and ``mask_layers``."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lips_flwr.core.layers import candidate_names, select_layers
from lips_flwr.core.masking import mask_layers, mask_lowest, num_zeros

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # reproducible in CI
    suppress_health_check=[HealthCheck.too_slow],
)

DTYPES = st.sampled_from([np.float16, np.float32, np.float64])
TAUS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=12).filter(
    lambda s: math.prod(s) <= 2000
)
WEIGHT_SHAPES = hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=12).filter(
    lambda s: math.prod(s) <= 2000
)


def expected_count(n: int, tau: float) -> int:
    """ceil(n * tau) for tau as written (its shortest decimal form), clamped to n."""
    if tau <= 0:
        return 0
    return min(n, math.ceil(Decimal(repr(tau)) * n))


@st.composite
def weights_and_scores(draw, allow_nan_scores=True):
    dtype = draw(DTYPES)
    shape = draw(WEIGHT_SHAPES)
    # small integer-valued elements give many ties and many already-zero weights
    elements = st.one_of(
        st.integers(-3, 3).map(float),
        st.floats(-100, 100, allow_nan=False, width=16),
    )
    weights = draw(hnp.arrays(dtype, shape, elements=elements))
    score_elements = st.one_of(
        st.integers(0, 4).map(float),
        st.floats(0, 1e6, allow_nan=False),
        st.just(float("nan")) if allow_nan_scores else st.just(0.5),
    )
    scores = draw(hnp.arrays(np.float64, shape, elements=score_elements))
    return weights, scores


def reference_zero_set(weights: np.ndarray, scores: np.ndarray, k: int) -> set[int]:
    """Already-zero weights first, then a stable argsort of the scores (NaN last)."""
    flat_w = weights.reshape(-1)
    ranked = np.where(flat_w == 0, -np.inf, scores.reshape(-1))
    chosen = set(np.argsort(ranked, kind="stable")[:k].tolist())
    return chosen | set(np.flatnonzero(flat_w == 0).tolist())


@SETTINGS
@given(n=st.integers(0, 10**7), tau=TAUS)
def test_num_zeros_is_ceil_of_n_tau(n, tau):
    assert num_zeros(n, tau) == expected_count(n, tau)


@SETTINGS
@given(data=weights_and_scores(), tau=TAUS)
def test_mask_lowest_exact_count_and_positions(data, tau):
    weights, scores = data
    w_before, s_before = weights.copy(), scores.copy()
    masked, k = mask_lowest(weights, scores, tau)
    n = weights.size
    assert k == expected_count(n, tau)
    already = int((weights == 0).sum())
    zeros_after = int((masked == 0).sum())
    # exactly k lowest-ranked entries are zero; already-zero weights rank first
    assert zeros_after == max(k, already)
    got = set(np.flatnonzero(masked.reshape(-1) == 0).tolist())
    assert got == reference_zero_set(weights, scores, k)
    # survivors keep their exact values (NaN-safe), dtype and shape preserved
    keep = masked != 0
    np.testing.assert_array_equal(masked[keep], weights[keep])
    assert masked.dtype == weights.dtype and masked.shape == weights.shape
    # inputs not mutated
    np.testing.assert_array_equal(weights, w_before)
    np.testing.assert_array_equal(scores, s_before)
    if k == 0:
        assert masked is weights


@st.composite
def models(draw):
    """A name -> array model with candidates and ineligible tensors mixed."""
    dtype = draw(DTYPES)
    count = draw(st.integers(1, 6))
    model = {}
    for i in range(count):
        kind = draw(st.sampled_from(["weight", "bias", "bn", "int", "running"]))
        if kind == "weight":
            shape = draw(WEIGHT_SHAPES)
            model[f"l{i}.weight"] = draw(
                hnp.arrays(dtype, shape, elements=st.floats(-10, 10, allow_nan=False, width=16))
            )
        elif kind == "bias":
            model[f"l{i}.bias"] = draw(hnp.arrays(dtype, draw(st.integers(1, 20)), elements=st.floats(-1, 1, width=16)))
        elif kind == "bn":
            model[f"bn{i}.weight"] = np.ones(4, dtype)
            model[f"bn{i}.running_mean"] = np.zeros(4, dtype)
            model[f"bn{i}.num_batches_tracked"] = np.array(i, np.int64)
        elif kind == "int":
            model[f"l{i}.index"] = draw(hnp.arrays(np.int64, (3, 3), elements=st.integers(-5, 5)))
        else:  # a rank-2 float that is still a BN buffer by name
            model[f"l{i}.running_var"] = np.ones((3, 3), dtype)
    return model


@SETTINGS
@given(
    model=models(),
    tau=TAUS,
    score=st.sampled_from(["sensitivity", "magnitude", "random"]),
    seed=st.integers(0, 2**32 - 1),
    salt=st.lists(st.integers(0, 10**6), max_size=2).map(tuple),
    spec=st.sampled_from(["middle", "all", "reference"]),
)
def test_sparsify_properties(model, tau, score, seed, salt, spec):
    copies = {k: v.copy() for k, v in model.items()}
    layers = select_layers(model, spec)
    rng = np.random.default_rng(seed)
    updates = {n: rng.normal(size=model[n].shape).astype(np.float32) for n in layers}
    kwargs = dict(score=score, updates=updates, seed=seed, salt=salt)
    out, zeros = mask_layers(model, layers, tau, **kwargs)

    # key order kept; ineligible and unselected tensors are the very same objects
    assert list(out) == list(model)
    for name in model:
        if name not in layers:
            assert out[name] is model[name]
    assert set(candidate_names(model)) >= set(layers)

    # exact counts per selected layer
    for name in layers:
        k = expected_count(model[name].size, tau)
        if k == 0:
            assert name not in zeros
            assert out[name] is model[name]
            continue
        assert zeros[name] == k
        already = int((model[name] == 0).sum())
        assert int((out[name] == 0).sum()) == max(k, already)
        assert out[name].dtype == model[name].dtype and out[name].shape == model[name].shape

    # input not mutated
    for name in model:
        np.testing.assert_array_equal(model[name], copies[name])

    # deterministic under the same seed and salt
    again, zeros_again = mask_layers(model, layers, tau, **kwargs)
    assert zeros_again == zeros
    for name in model:
        np.testing.assert_array_equal(again[name], out[name])


@SETTINGS
@given(
    model=models(),
    tau=TAUS,
    score=st.sampled_from(["sensitivity", "magnitude"]),
    seed=st.integers(0, 1000),
)
def test_sparsify_zeroes_the_lowest_scores(model, tau, score, seed):
    layers = select_layers(model, "all")
    rng = np.random.default_rng(seed)
    updates = {n: rng.normal(size=model[n].shape).astype(np.float32) for n in layers}
    out, zeros = mask_layers(model, layers, tau, score=score, updates=updates)
    for name in layers:
        w = model[name]
        k = expected_count(w.size, tau)
        # scores are ranked in float32 (float64 for float64 weights); a float64
        # product of float32 values is exact, so rounding it once matches.
        score_dtype = np.result_type(w.dtype, np.float32)
        if score == "sensitivity":
            ref = np.abs(updates[name].astype(np.float64) * w.astype(np.float64)).astype(score_dtype)
        else:
            ref = np.abs(w.astype(np.float64)).astype(score_dtype)
        got = set(np.flatnonzero(out[name].reshape(-1) == 0).tolist())
        assert got == reference_zero_set(w, ref, k)
        assert zeros.get(name, 0) == k


# --------------------------------------------------------------------------- edge-case models
ODD_FLOATS = st.sampled_from([np.float16, np.float32, np.float64, np.dtype(">f4")])
ODD_INTS = st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.bool_])


@st.composite
def odd_models(draw):
    """Models with what real ones rarely have: empty and 0-d tensors, small integer and
    bool tensors of rank >= 2, big-endian floats."""
    model = {}
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["weight", "empty", "scalar", "int"]))
        if kind == "weight":
            shape = draw(WEIGHT_SHAPES)
            model[f"l{i}.weight"] = draw(hnp.arrays(
                draw(ODD_FLOATS), shape, elements=st.floats(-10, 10, allow_nan=False, width=16)))
        elif kind == "empty":
            model[f"l{i}.weight"] = np.zeros((0, draw(st.integers(1, 4))), draw(ODD_FLOATS))
        elif kind == "scalar":
            model[f"l{i}.scale"] = np.array(draw(st.floats(-1, 1, width=16)), draw(ODD_FLOATS))
        else:
            model[f"l{i}.table"] = draw(hnp.arrays(draw(ODD_INTS), (3, 4)))
    return model


@SETTINGS
@given(
    model=odd_models(),
    tau=TAUS,
    score=st.sampled_from(["sensitivity", "magnitude", "random"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sparsify_properties_on_edge_case_models(model, tau, score, seed):
    copies = {k: v.copy() for k, v in model.items()}
    layers = select_layers(model, "all")
    assert all(model[n].dtype.kind == "f" and model[n].ndim >= 2 for n in layers)
    rng = np.random.default_rng(seed)
    updates = {n: rng.normal(size=model[n].shape).astype(np.float32) for n in layers}
    out, zeros = mask_layers(model, layers, tau, score=score, updates=updates, seed=seed)
    for name in model:
        k = expected_count(model[name].size, tau)
        if not zeros.get(name):  # integer, bool, 0-d, empty (counted 0), or tau = 0
            assert k == 0 or name not in layers
            assert out[name] is model[name]
            continue
        assert zeros[name] == k
        assert int((out[name] == 0).sum()) == max(k, int((model[name] == 0).sum()))
        assert out[name].dtype == model[name].dtype and out[name].shape == model[name].shape
    assert all(name in layers for name in zeros)
    for name in model:
        np.testing.assert_array_equal(model[name], copies[name])  # inputs not mutated
    # determinism: the global numpy RNG and the order of `updates` play no part
    np.random.seed(seed % 1000)
    np.random.random(7)
    again, zeros_again = mask_layers(model, layers, tau, score=score, seed=seed,
                                  updates=dict(reversed(list(updates.items()))))
    assert zeros_again == zeros
    for name in model:
        np.testing.assert_array_equal(again[name], out[name])


@SETTINGS
@given(model=models(), tau=st.floats(0.01, 1.0), seed=st.integers(0, 2**32 - 1))
def test_sparsify_refuses_ineligible_tensors_whoever_picks_them(model, tau, seed):
    """Naming an integer, rank-1 or batch-norm tensor raises before anything is masked."""
    ineligible = [n for n in model if n not in candidate_names(model)]
    if not ineligible:
        return
    layers = candidate_names(model) + ineligible[:1]
    copies = {k: v.copy() for k, v in model.items()}
    try:
        mask_layers(model, layers, tau, score="random", seed=seed)
    except ValueError as err:
        assert "not eligible" in str(err)
    else:
        raise AssertionError(f"{ineligible[0]!r} was accepted")
    for name in model:
        np.testing.assert_array_equal(model[name], copies[name])
