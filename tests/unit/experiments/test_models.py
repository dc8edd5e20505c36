"""Unit tests for lips_flwr.experiments.task.models: shapes, sizes and LIPS layer selection."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from lips_flwr.core.layers import select_layers
from lips_flwr.experiments.task.models import (
    MODEL_NAMES,
    DigitsCNN,
    FashionCNN,
    VGG6,
    ResNet,
    ResNet8,
    ResNet10,
    build_model,
)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def state_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def vgg6() -> VGG6:
    return VGG6()


@pytest.fixture(scope="module")
def resnet8() -> ResNet:
    return ResNet8()


@pytest.fixture(scope="module")
def resnet10() -> ResNet:
    return ResNet10()


@pytest.fixture(scope="module")
def fashion() -> FashionCNN:
    return FashionCNN()


# ---------------------------------------------------------------- output shapes


@pytest.mark.parametrize(
    ("fixture", "input_shape", "classes"),
    [
        ("vgg6", (2, 3, 32, 32), 10),
        ("resnet8", (2, 3, 32, 32), 100),
        ("resnet10", (2, 3, 64, 64), 200),
        ("fashion", (2, 1, 28, 28), 10),
    ],
)
def test_output_shape_on_intended_inputs(request, fixture, input_shape, classes):
    model = request.getfixturevalue(fixture)
    model.train()  # batch norm in training mode needs > 1 value per channel
    with torch.no_grad():
        out = model(torch.randn(*input_shape))
    assert out.shape == (input_shape[0], classes)
    assert torch.isfinite(out).all()


def test_vgg6_accepts_other_input_sizes():
    model = VGG6(num_classes=7, in_channels=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 1, 64, 64)).shape == (1, 7)


def test_vgg6_takes_28x28_grayscale_images():
    """Fashion-MNIST's 1x28x28 (the inertia pilot's VGG6 cell): five pools end at 1x1, not 0x0."""
    model = build_model("vgg6", 10, 1).train()
    out = model(torch.randn(4, 1, 28, 28))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_vgg6_on_32x32_is_the_round_down_pooling_model():
    """On the paper's 32x32 inputs rounding the pools up changes nothing (every map is even)."""
    torch.manual_seed(0)
    model = VGG6(num_classes=10, in_channels=3).eval()
    floor = copy.deepcopy(model)
    for module in floor.features:
        if isinstance(module, nn.MaxPool2d):
            module.ceil_mode = False
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), floor(x))


def test_resnet8_in_channels_and_classes():
    model = ResNet8(num_classes=5, in_channels=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 1, 28, 28)).shape == (1, 5)


def test_backward_reaches_every_parameter():
    model = FashionCNN(num_classes=3)
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# ------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(
    ("fixture", "nominal", "exact"),
    [
        ("vgg6", 3.9e6, 3_918_858),
        ("resnet8", 1.26e6, 1_258_404),
        ("resnet10", 5.0e6, 5_008_392),
        ("fashion", 36e3, 35_674),
    ],
)
def test_parameter_counts(request, fixture, nominal, exact):
    count = n_params(request.getfixturevalue(fixture))
    assert count == pytest.approx(nominal, rel=0.03)
    assert count == exact


def test_fashion_width_32_is_the_140k_variant():
    assert n_params(FashionCNN(width=32)) == pytest.approx(140e3, rel=0.03)


# -------------------------------------------------------------- LIPS selection

VGG_CONVS = [f"features.{i}.weight" for i in (0, 4, 8, 12, 16)]
RESNET8_MIDDLE = [
    "layer1.0.conv1.weight",
    "layer1.0.conv2.weight",
    "layer2.0.conv1.weight",
    "layer2.0.conv2.weight",
    "layer2.0.shortcut.0.weight",
    "layer3.0.conv1.weight",
    "layer3.0.conv2.weight",
    "layer3.0.shortcut.0.weight",
]
RESNET10_MIDDLE = RESNET8_MIDDLE + [
    "layer4.0.conv1.weight",
    "layer4.0.conv2.weight",
    "layer4.0.shortcut.0.weight",
]


def test_vgg6_middle_and_reference(vgg6):
    arrays = state_arrays(vgg6)
    middle = select_layers(arrays, "middle")
    assert middle == VGG_CONVS[1:]
    assert select_layers(arrays, "all") == VGG_CONVS + ["classifier.weight"]
    reference = select_layers(arrays, "reference")
    assert reference == VGG_CONVS[1:]
    assert not any(n.startswith("features.0.") for n in reference)
    assert "classifier.weight" not in reference


def test_vgg6_stem_is_features_0(vgg6):
    assert isinstance(vgg6.features[0], nn.Conv2d)
    assert vgg6.features[0].bias is not None
    assert isinstance(vgg6.classifier, nn.Linear)


@pytest.mark.parametrize(
    ("fixture", "expected"), [("resnet8", RESNET8_MIDDLE), ("resnet10", RESNET10_MIDDLE)]
)
def test_resnet_middle_and_reference(request, fixture, expected):
    arrays = state_arrays(request.getfixturevalue(fixture))
    assert arrays["conv1.weight"].shape[-2:] == (7, 7)
    assert select_layers(arrays, "all") == ["conv1.weight"] + expected + ["fc.weight"]
    middle = select_layers(arrays, "middle")
    assert middle == expected  # shortcut 1x1 convs included
    shortcuts = [n for n in middle if arrays[n].shape[-2:] == (1, 1)]
    assert shortcuts == [n for n in expected if ".shortcut.0." in n]
    assert len(shortcuts) == (2 if fixture == "resnet8" else 3)
    reference = select_layers(arrays, "reference")
    assert reference == expected
    assert "conv1.weight" not in reference and "fc.weight" not in reference


def test_resnet_block_shortcuts(resnet8):
    assert isinstance(resnet8.layer1[0].shortcut, nn.Identity)
    assert isinstance(resnet8.layer2[0].shortcut, nn.Sequential)
    assert resnet8.layer2[0].shortcut[0].kernel_size == (1, 1)
    assert resnet8.layer2[0].shortcut[0].stride == (2, 2)


def test_fashion_middle_and_reference(fashion):
    arrays = state_arrays(fashion)
    convs = [f"conv{i}.0.weight" for i in range(1, 6)]
    assert select_layers(arrays, "middle") == convs[1:]
    # the reference rule recognises only a 7x7 or ``features.0`` stem
    assert select_layers(arrays, "reference") == convs


def test_batch_norm_never_selected(vgg6, resnet8, fashion):
    for model in (vgg6, resnet8, fashion):
        arrays = state_arrays(model)
        for preset in ("middle", "reference", "all"):
            for name in select_layers(arrays, preset):
                assert arrays[name].ndim >= 2 and name.endswith(".weight")


# ------------------------------------------------------------------ build_model


@pytest.mark.parametrize(
    ("name", "cls", "classes", "channels"),
    [
        ("digits-cnn", DigitsCNN, 10, 1),
        ("fashion-cnn", FashionCNN, 10, 1),
        ("vgg6", VGG6, 10, 3),
        # one class since issue 36 (were the twin subclasses ResNet8 and ResNet10): its stages tell
        ("resnet8", ResNet, 100, 3),
        ("resnet10", ResNet, 200, 3),
    ],
)
def test_build_model(name, cls, classes, channels):
    model = build_model(name, classes, channels)
    assert type(model) is cls
    if cls is ResNet:
        assert model.stages == {"resnet8": ResNet8, "resnet10": ResNet10}[name]().stages
        assert len(model.stages) == {"resnet8": 3, "resnet10": 4}[name]
    assert name in MODEL_NAMES
    head = list(model.state_dict().items())
    weights = [v for k, v in head if k.endswith("weight") and v.ndim == 2]
    assert weights[-1].shape[0] == classes


def test_build_model_passes_channels_and_classes():
    model = build_model("vgg6", 4, 1)
    assert model.features[0].in_channels == 1 and model.classifier.out_features == 4


def test_build_model_unknown_name():
    with pytest.raises(ValueError, match="resnet8") as info:
        build_model("resnet18", 10, 3)
    for name in MODEL_NAMES:
        assert name in str(info.value)


def test_build_model_digits_cnn_is_fixed():
    with pytest.raises(ValueError, match="digits-cnn"):
        build_model("digits-cnn", 5, 1)


# Recorded from the two classes ResNet8 and ResNet10 (subclasses of ResNet) before they became one
# class (issue 36): seed 0, 1 thread; state_dict (name, shape, dtype) digest exact, values and a
# seeded batch's logits to float32 rounding.
RESNET_GOLDEN = {
    "resnet8": ((2, 3, 32, 32), 56, "d2ee9b7cf7ab5f85", 2728.7125999879063,
                [0.049968, 0.137464, -0.476931, -0.116441], -10.97639668919146),
    "resnet10": ((2, 3, 64, 64), 74, "834f331118c51c85", 5794.348183189865,
                 [0.14096, 0.162779, 0.007592, 0.469164], 8.253701379522681),
}


@pytest.mark.parametrize("name", sorted(RESNET_GOLDEN))
def test_resnets_are_the_models_they_were_for_a_seed(name):
    import hashlib

    shape, count, digest, total, first_logits, logits_sum = RESNET_GOLDEN[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build_model(name, 100 if name == "resnet8" else 200, 3).eval()
        state = model.state_dict()
        names = repr([(k, tuple(v.shape), str(v.dtype)) for k, v in state.items()])
        assert (len(state), hashlib.sha256(names.encode()).hexdigest()[:16]) == (count, digest)
        assert sum(float(v.double().sum()) for v in state.values()) == pytest.approx(total, rel=1e-9)
        torch.manual_seed(1)
        with torch.no_grad():
            out = model(torch.randn(*shape))
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(out[0, :4].numpy(), first_logits, atol=2e-6)
    assert float(out.double().sum()) == pytest.approx(logits_sum, abs=1e-4)
