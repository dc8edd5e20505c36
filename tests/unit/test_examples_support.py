"""The digits loader, model, training loop and results writer the example apps use."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lips_flwr.data import load_digits_client
from lips_flwr.layers import select_layers
from lips_flwr.models import DigitsCNN
from lips_flwr.results import write_json_atomic
from lips_flwr.training import evaluate, train


def labels(dataset) -> np.ndarray:
    return dataset.tensors[1].numpy()


def test_each_client_gets_exact_sizes_and_matching_proportions():
    for pid in range(5):
        train_set, test_set = load_digits_client(pid, samples=100, alpha=0.1, seed=3, test_size=400)
        assert len(train_set) == 100 and len(test_set) == 400
        assert train_set.tensors[0].shape[1:] == (1, 8, 8)
        p_train = np.bincount(labels(train_set), minlength=10) / 100
        p_test = np.bincount(labels(test_set), minlength=10) / 400
        # Both are multinomial draws from the same Dir(alpha) proportions.
        assert np.abs(p_train - p_test).max() < 0.2
        assert set(np.flatnonzero(p_test > 0.1)) <= set(np.flatnonzero(p_train > 0))


def test_split_is_seeded_and_reproducible():
    a, _ = load_digits_client(2, seed=7)
    b, _ = load_digits_client(2, seed=7)
    c, _ = load_digits_client(2, seed=8)
    assert torch.equal(a.tensors[0], b.tensors[0])
    assert not torch.equal(a.tensors[0], c.tensors[0])


def test_model_has_two_middle_layers_and_learns():
    net = DigitsCNN()
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    assert select_layers(state) == ["conv2.weight", "conv3.weight"]
    train_set, _ = load_digits_client(0, samples=100, alpha=100.0, seed=0)
    before, _ = evaluate(net, train_set)
    train(net, train_set, epochs=30, seed=0)
    after, accuracy = evaluate(net, train_set)
    assert after < before and accuracy > 0.5


def test_results_are_written_atomically(tmp_path):
    path = tmp_path / "sub" / "results.json"
    write_json_atomic(path, {"x": np.float32(1.5), "n": np.int64(3)})
    assert json.loads(path.read_text()) == {"n": 3, "x": 1.5}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object.__new__(type("NoItem", (), {"item": 1}))})
    assert json.loads(path.read_text()) == {"n": 3, "x": 1.5}  # old file intact
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp left
