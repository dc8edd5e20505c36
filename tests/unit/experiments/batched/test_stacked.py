"""Unit tests for lips_flwr.experiments.batched.stacked: stacked = sequential, per client."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lips_flwr.experiments.task import training
from lips_flwr.experiments.batched import stacked as stacked_training
from lips_flwr.experiments.task.models import VGG6, DigitsCNN, FashionCNN, ResNet8
from lips_flwr.experiments.batched.stacked import (
    can_stack,
    evaluate_stacked,
    train_stacked,
)
from lips_flwr.experiments.task.training import add_dropout, augment, evaluate_tensors, train_tensors

TOL = 1e-5
SEEDS = [11, 22, 33]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One thread: the machine is small and shared, and the sizes here are tiny."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_clients(
    factory: Callable[[], nn.Module], shape: tuple[int, ...], classes: int, n: int = 25,
    clients: int = 3, dtype: torch.dtype = torch.float32,
) -> tuple[list[nn.Module], list[tuple[torch.Tensor, torch.Tensor]]]:
    """``clients`` differently initialised nets and random data of ``n`` samples each."""
    nets, data = [], []
    for i in range(clients):
        torch.manual_seed(100 + i)
        nets.append(factory().to(dtype))
        data.append((torch.randn(n, *shape, dtype=dtype), torch.randint(0, classes, (n,))))
    return nets, data


def assert_same_state(a: nn.Module, b: nn.Module, tol: float = TOL) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        diff = (sa[name].double() - sb[name].double()).abs().max().item()
        assert diff <= tol, f"{name}: max abs difference {diff}"


def conv_weights(net: nn.Module) -> set[str]:
    return {n for n, p in net.named_parameters() if p.dim() == 4}


# float64 where possible: in float32 the sequential loop itself is chaotic on random data (a
# 1e-7 nudge of the weights flips a ReLU or max-pool choice and, after a few steps, moves some
# weights by 1e-4 or more), so only float64 shows that stacked and sequential are the same
# computation (they agree to ~1e-12). ``augment`` needs float32 (its grid is float32).
CASES = {
    # model, sample shape, classes, dtype, clients x samples, train_tensors keyword arguments
    # (batches of 10 by default: the last batch of each epoch is short)
    "fashion-cnn": (FashionCNN, (1, 28, 28), 10, torch.float64, (3, 25), {"momentum": 0.9}),
    "digits-cnn-crop": (DigitsCNN, (1, 8, 8), 10, torch.float32, (3, 25),
                        {"momentum": 0.9, "augmentation": "flip-crop-rotate"}),
    "resnet8-decay-only": (ResNet8, (3, 32, 32), 100, torch.float64, (3, 20),
                           {"momentum": 0.9, "weight_decay": 5e-3, "decay_only": "conv"}),
    "vgg6-no-momentum-decay-all": (VGG6, (3, 32, 32), 10, torch.float64, (2, 12),
                                   {"momentum": 0.0, "weight_decay": 1e-2, "batch_size": 5}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_train_and_evaluate_match_sequential(case: str) -> None:
    factory, shape, classes, dtype, (clients, n), extra = CASES[case]
    kwargs: dict[str, Any] = {"epochs": 2, "lr": 0.05, "batch_size": 10, **extra}
    nets, data = make_clients(factory, shape, classes, n=n, clients=clients, dtype=dtype)
    if kwargs.get("decay_only") == "conv":
        kwargs["decay_only"] = conv_weights(nets[0])
    seeds = SEEDS[:clients]
    sequential = [copy.deepcopy(net) for net in nets]

    expected = [train_tensors(net, x, y, seed=seed, **kwargs)
                for net, (x, y), seed in zip(sequential, data, seeds)]
    losses = train_stacked(nets, data, seeds=seeds, **kwargs)

    tol = 1e-9 if dtype == torch.float64 else TOL
    assert losses == pytest.approx(expected, abs=tol)
    for net, ref in zip(nets, sequential):
        assert net.training
        assert_same_state(net, ref, tol)
    evaluated = evaluate_stacked(nets, data, batch_size=10)
    for (loss, acc), (net, (x, y)) in zip(evaluated, zip(sequential, data)):
        ref_loss, ref_acc = evaluate_tensors(net, x, y, batch_size=10)
        assert loss == pytest.approx(ref_loss, abs=tol)
        assert acc == ref_acc
    assert not nets[0].training


def test_batches_and_augmentations_are_those_of_train_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bitwise: every client sees the samples and augmentations that its own loop would."""
    seen: list[torch.Tensor] = []

    def recording(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
        seen.append(augment(x, kind, generator))
        return seen[-1]

    monkeypatch.setattr(training, "augment", recording)
    monkeypatch.setattr(stacked_training, "augment", recording)
    nets, data = make_clients(FashionCNN, (1, 28, 28), 10, n=12, clients=2)
    kwargs: dict[str, Any] = {"epochs": 2, "lr": 0.05, "momentum": 0.9, "batch_size": 5,
                              "augmentation": "flip-crop-rotate"}
    for net, (x, y), seed in zip(copy.deepcopy(nets), data, SEEDS):
        train_tensors(net, x, y, seed=seed, **kwargs)
    sequential, seen[:] = seen[:], []
    train_stacked(nets, data, seeds=SEEDS[:2], **kwargs)
    steps = len(sequential) // 2  # stacked: step by step, client by client
    stacked = [seen[step * 2 + client] for client in range(2) for step in range(steps)]
    assert len(seen) == len(sequential) == 2 * 2 * 3
    assert all(torch.equal(a, b) for a, b in zip(stacked, sequential))


def test_unequal_counts_are_refused() -> None:
    nets, data = make_clients(DigitsCNN, (1, 8, 8), 10, n=6, clients=2)
    data[1] = (data[1][0][:4], data[1][1][:4])
    assert not can_stack(nets, data)
    with pytest.raises(ValueError, match=r"unequal sample counts.*\[6, 4\]"):
        train_stacked(nets, data, seeds=[0, 1], epochs=1, lr=0.1, momentum=0.0, batch_size=3)
    with pytest.raises(ValueError, match="unequal sample counts"):
        evaluate_stacked(nets, data)


@pytest.mark.parametrize("other", [DigitsCNN, lambda: FashionCNN(width=8)])
def test_different_architectures_are_refused(other: Callable[[], nn.Module]) -> None:
    nets, data = make_clients(FashionCNN, (1, 28, 28), 10, n=4, clients=2)
    nets[1] = other()
    assert not can_stack(nets, data)
    with pytest.raises(ValueError, match="different architectures: net 1"):
        train_stacked(nets, data, seeds=[0, 1], epochs=1, lr=0.1, momentum=0.0, batch_size=2)


def test_bad_counts_of_nets_or_seeds_are_refused() -> None:
    nets, data = make_clients(DigitsCNN, (1, 8, 8), 10, n=4, clients=2)
    assert can_stack(nets, data)
    with pytest.raises(ValueError, match="2 nets but 1 seeds"):
        train_stacked(nets, data, seeds=[0], epochs=1, lr=0.1, momentum=0.0, batch_size=2)
    with pytest.raises(ValueError, match=r"2 nets but 1 \(x, y\) pairs"):
        evaluate_stacked(nets, data[:1])


def test_dropout_hooks_apply_and_are_reproducible() -> None:
    nets, data = make_clients(FashionCNN, (1, 28, 28), 10, n=8, clients=2)
    initial = [copy.deepcopy(net) for net in nets]
    runs = []
    for _ in range(2):
        copies = [copy.deepcopy(net) for net in initial]
        for net in copies:
            add_dropout(net, ["conv2.0.weight", "conv4.0.weight"], p=0.5)
        rng = torch.get_rng_state()
        losses = train_stacked(copies, data, seeds=[1, 2], epochs=1, lr=0.1, momentum=0.9,
                               batch_size=4)
        assert torch.equal(torch.get_rng_state(), rng)  # the caller's global RNG is left alone
        runs.append((losses, copies))
    (losses_a, nets_a), (losses_b, nets_b) = runs
    assert losses_a == losses_b
    for a, b, start in zip(nets_a, nets_b, initial):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
        assert not torch.equal(a.conv2[0].weight, start.conv2[0].weight)
    # without dropout the same training ends elsewhere: the hooks did run
    plain = [copy.deepcopy(net) for net in initial]
    assert train_stacked(plain, data, seeds=[1, 2], epochs=1, lr=0.1, momentum=0.9,
                         batch_size=4) != losses_a


def test_bfloat16_autocast_trains_close_to_float32_and_leaves_parameters_float32():
    """An option for accelerators: not the sequential loop's numbers, but the same training."""
    torch.manual_seed(0)
    base = DigitsCNN()
    data = [(torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))) for _ in range(2)]
    nets32 = [copy.deepcopy(base) for _ in data]
    nets16 = [copy.deepcopy(base) for _ in data]
    kwargs = dict(seeds=[1, 2], epochs=1, lr=0.05, momentum=0.9, batch_size=10)
    loss32 = train_stacked(nets32, data, **kwargs)
    loss16 = train_stacked(nets16, data, autocast=torch.bfloat16, **kwargs)
    assert loss16 != loss32 and loss16 == pytest.approx(loss32, rel=0.05)
    for a, b in zip(nets32, nets16):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert y.dtype == x.dtype, name
    evals = evaluate_stacked(nets16, data, autocast=torch.bfloat16)
    assert [acc for _, acc in evals] == pytest.approx([acc for _, acc in evaluate_stacked(nets16, data)], abs=0.1)
