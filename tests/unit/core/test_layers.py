"""Unit tests for lips_flwr.core.layers."""

from __future__ import annotations

import numpy as np
import pytest

from core_models import resnet_like, small_net, vgg_net  # noqa: F401 (fixtures)

from lips_flwr.core.layers import (
    PRESETS,
    batch_norm_names,
    candidate_names,
    is_candidate,
    select_layers,
    validate_layers,
)

SMALL_CANDIDATES = ["conv1.weight", "conv2.weight", "shortcut.weight", "fc.weight"]
SMALL_BN = [
    "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked",
    "bn2.weight", "bn2.bias", "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked",
]


def hand_made() -> dict[str, np.ndarray]:
    return {
        "stem.weight": np.ones((4, 3, 3, 3), np.float32),
        "stem.bias": np.ones(4, np.float32),
        "norm.weight": np.ones(4, np.float32),
        "norm.bias": np.zeros(4, np.float32),
        "norm.running_mean": np.zeros(4, np.float32),
        "norm.running_var": np.ones(4, np.float32),
        "norm.num_batches_tracked": np.array(3, np.int64),
        "x.running_mean": np.zeros((4, 4), np.float32),  # 2-D, still a BN buffer
        "x.running_var": np.ones((4, 4), np.float64),
        "x.num_batches_tracked": np.zeros((2, 2), np.float32),
        "ints": np.ones((4, 4), np.int64),
        "bools": np.ones((4, 4), bool),
        "mid.weight": np.ones((8, 4, 3, 3), np.float16),
        "emb": np.ones((5, 6), np.float64),
        "head.weight": np.ones((10, 8), np.float32),
        "head.bias": np.ones(10, np.float32),
    }


# --------------------------------------------------------------------------- candidates
def test_candidates_of_torch_model(small_net):
    assert candidate_names(small_net) == SMALL_CANDIDATES
    assert small_net["bn1.num_batches_tracked"].dtype == np.int64


def test_candidates_of_hand_made_dict():
    assert candidate_names(hand_made()) == ["stem.weight", "mid.weight", "emb", "head.weight"]


@pytest.mark.parametrize(
    "name,array,expected",
    [
        ("w", np.ones((2, 2), np.float16), True),
        ("w", np.ones((2, 2), np.float32), True),
        ("w", np.ones((2, 2, 1, 1), np.float64), True),
        ("w", np.ones(4, np.float32), False),  # rank 1 (bias / BN affine)
        ("w", np.array(1.0), False),  # rank 0
        ("w", np.ones((2, 2), np.int64), False),
        ("w", np.ones((2, 2), np.int32), False),
        ("w", np.ones((2, 2), bool), False),
        ("w", np.ones((2, 2), np.complex64), False),
        ("bn.running_mean", np.ones((2, 2), np.float32), False),
        ("bn.running_var", np.ones((2, 2), np.float32), False),
        ("bn.num_batches_tracked", np.ones((2, 2), np.float32), False),
        ("num_batches_tracked", np.array(0, np.int64), False),
    ],
)
def test_is_candidate(name, array, expected):
    assert is_candidate(name, array) is expected


DTYPES = sorted({np.dtype(t).str for t in np.sctypeDict.values()} | {"V4", "<f4,<i4", "O"})


@pytest.mark.parametrize("dtype", DTYPES)
def test_is_candidate_takes_the_floating_dtypes_np_issubdtype_calls_floating(dtype):
    array = np.zeros((2, 2), dtype=np.dtype(dtype))  # every numpy scalar type, void, structured, object
    assert is_candidate("w", array) is bool(np.issubdtype(array.dtype, np.floating))


def test_candidates_never_include_bn_bias_or_int(small_net, resnet_like, vgg_net):
    for model in (small_net, resnet_like, vgg_net):
        bn = set(batch_norm_names(model))
        for preset in PRESETS:
            for name in select_layers(model, preset):
                assert name not in bn
                assert not name.endswith(".bias")
                assert model[name].ndim >= 2
                assert np.issubdtype(model[name].dtype, np.floating)


def test_candidates_keep_model_order():
    arrays = {"z": np.ones((2, 2)), "a": np.ones((2, 2)), "m": np.ones((2, 2))}
    assert candidate_names(arrays) == ["z", "a", "m"]
    assert select_layers(arrays, "all") == ["z", "a", "m"]
    assert select_layers(arrays, ["m", "z"]) == ["z", "m"]


# --------------------------------------------------------------------------- presets
def test_middle_excludes_first_and_last_candidate(small_net):
    assert select_layers(small_net) == ["conv2.weight", "shortcut.weight"]
    assert select_layers(small_net, "middle") == ["conv2.weight", "shortcut.weight"]


def test_middle_keeps_shortcut_and_inner_linear(resnet_like):
    assert select_layers(resnet_like, "middle") == [
        "layer1.0.conv1.weight",
        "layer1.0.shortcut.0.weight",
        "fc1.weight",
    ]


def test_middle_of_hand_made():
    assert select_layers(hand_made(), "middle") == ["mid.weight", "emb"]


def test_middle_with_few_candidates():
    two = {"a": np.ones((2, 2)), "b.bias": np.ones(2), "c": np.ones((3, 3))}
    assert select_layers(two, "middle") == []
    assert select_layers({"a": np.ones((2, 2))}, "middle") == []
    assert select_layers({}, "middle") == []
    assert select_layers({"b": np.ones(3)}, "all") == []


def test_all_preset(small_net):
    assert select_layers(small_net, "all") == SMALL_CANDIDATES


def test_reference_preset_resnet(resnet_like):
    # no 7x7 stem, no linear layers at all (fc1 included), keeps the shortcut
    assert select_layers(resnet_like, "reference") == [
        "layer1.0.conv1.weight",
        "layer1.0.shortcut.0.weight",
    ]


def test_reference_preset_vgg(vgg_net):
    # features.0 is the stem even with a 3x3 kernel; features.10 is not
    assert select_layers(vgg_net, "reference") == [
        "features.3.weight",
        "features.6.weight",
        "features.10.weight",
    ]
    assert select_layers(vgg_net, "middle") == [
        "features.3.weight",
        "features.6.weight",
        "features.10.weight",
    ]


def test_reference_preset_hand_made():
    arrays = {
        "stem7.weight": np.ones((4, 3, 7, 7), np.float32),
        "features.0.weight": np.ones((4, 3, 3, 3), np.float32),
        "features.01.weight": np.ones((4, 4, 3, 3), np.float32),
        "conv.weight": np.ones((4, 4, 3, 3), np.float32),
        "tall7.weight": np.ones((4, 4, 7, 3), np.float32),
        "lin.weight": np.ones((4, 4), np.float32),
        "head.weight": np.ones((4, 4), np.float32),
    }
    assert select_layers(arrays, "reference") == [
        "features.01.weight",
        "conv.weight",
        "tall7.weight",
    ]


# --------------------------------------------------------------------------- explicit
def test_explicit_names(small_net):
    assert select_layers(small_net, ["fc.weight", "conv1.weight"]) == ["conv1.weight", "fc.weight"]
    assert select_layers(small_net, ("shortcut.weight",)) == ["shortcut.weight"]


def test_duplicates_collapse(small_net):
    assert select_layers(small_net, ["conv2.weight", "conv2.weight", "conv*"]) == [
        "conv1.weight",
        "conv2.weight",
    ]


def test_glob_patterns(resnet_like, small_net):
    assert select_layers(resnet_like, ["layer1.*"]) == [
        "layer1.0.conv1.weight",
        "layer1.0.shortcut.0.weight",
    ]
    assert select_layers(resnet_like, ["fc?.weight"]) == ["fc1.weight", "fc2.weight"]
    # a pattern only picks candidates, never BN or biases it also matches
    assert select_layers(small_net, ["*"]) == SMALL_CANDIDATES
    assert select_layers(small_net, ["conv*"]) == ["conv1.weight", "conv2.weight"]


def test_predicate(small_net):
    seen = []

    def pred(name, array):
        seen.append(name)
        return array.ndim == 4 and array.shape[-1] == 3

    assert select_layers(small_net, pred) == ["conv1.weight", "conv2.weight"]
    # the predicate is only asked about candidates
    assert seen == SMALL_CANDIDATES


def test_predicate_cannot_select_ineligible(small_net):
    assert select_layers(small_net, lambda name, array: True) == SMALL_CANDIDATES


@pytest.mark.parametrize(
    "name", ["conv1.bias", "bn1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "fc.bias"]
)
def test_explicit_ineligible_name_raises(small_net, name):
    with pytest.raises(ValueError, match="not eligible"):
        select_layers(small_net, [name])
    with pytest.raises(ValueError, match="not eligible"):
        select_layers(small_net, ["conv2.weight", name])


def test_explicit_two_d_running_mean_raises():
    with pytest.raises(ValueError, match="not eligible"):
        select_layers(hand_made(), ["x.running_mean"])


@pytest.mark.parametrize("pattern", ["nope.weight", "layer9.*", "*.bias", "bn*"])
def test_pattern_matching_nothing_raises(small_net, pattern):
    with pytest.raises(ValueError, match="matches no eligible"):
        select_layers(small_net, [pattern])


@pytest.mark.parametrize(
    "spec", ["", "middel", "conv1.weight", "layer1.*", 3, 1.5, None, [], (), [1, 2], ["a", 2], {"a"}, b"all"]
)
def test_invalid_specs_raise(small_net, spec):
    with pytest.raises(ValueError, match="layers"):
        validate_layers(spec)
    with pytest.raises(ValueError, match="layers"):
        select_layers(small_net, spec)


def test_validate_layers_normalises():
    assert validate_layers("middle") == "middle"
    assert validate_layers(["a", "b"]) == ("a", "b")
    pred = lambda n, a: True  # noqa: E731
    assert validate_layers(pred) is pred


def test_select_layers_does_not_mutate(small_net):
    before = {k: v.copy() for k, v in small_net.items()}
    keys = list(small_net)
    for spec in ("middle", "all", "reference", ["conv*"]):
        select_layers(small_net, spec)
    assert list(small_net) == keys
    for k in keys:
        np.testing.assert_array_equal(small_net[k], before[k])


# --------------------------------------------------------------------------- batch norm
def test_batch_norm_names_torch(small_net, resnet_like, vgg_net):
    assert batch_norm_names(small_net) == SMALL_BN
    assert batch_norm_names(resnet_like) == [
        n for n in resnet_like if n.startswith(("bn1.", "layer1.0.bn1.", "layer1.0.shortcut.1."))
    ]
    expected = [n for n in vgg_net if n.split(".")[1] in {"1", "4", "7", "11"}]
    assert batch_norm_names(vgg_net) == expected
    assert "features.1.weight" in expected and "features.10.weight" not in expected


def test_batch_norm_names_excludes_similar_prefixes():
    arrays = {
        "bn.weight": np.ones(3),
        "bn.bias": np.ones(3),
        "bn.running_mean": np.ones(3),
        "bn.running_var": np.ones(3),
        "bn.num_batches_tracked": np.array(1),
        "bn2.weight": np.ones((3, 3)),  # a conv that only looks like "bn"
        "bn.sub.weight": np.ones((3, 3)),  # a child module of bn, not bn itself
        "conv.weight": np.ones((3, 3)),
    }
    assert batch_norm_names(arrays) == [
        "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
    ]


def test_batch_norm_names_without_buffers():
    arrays = {"bn.weight": np.ones(3), "bn.bias": np.ones(3), "c.weight": np.ones((2, 2))}
    assert batch_norm_names(arrays) == []
    assert batch_norm_names({}) == []
