"""The paper app's client loads the received model as ``load_state_dict`` would, bit for bit."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lips_flwr._records import numpy_to_record
from lips_flwr.experiments.task.models import build_model
from test_paper_tools import PAPER

sys.path.insert(0, str(PAPER))
from lips_paper.client_app import load_received  # noqa: E402


def received(seed: int) -> dict[str, np.ndarray]:
    """Another model's whole state (parameters, BN statistics, batch counts), as a server sends it."""
    torch.manual_seed(seed)
    sent = build_model("fashion-cnn", 10, 1)
    state = {name: tensor.numpy().copy() for name, tensor in sent.state_dict().items()}
    rng = np.random.default_rng(seed)
    for name, array in state.items():
        if array.dtype.kind == "f":
            array += rng.normal(0.0, 1.0, array.shape).astype(array.dtype)
        else:
            array += 7
    return state


def test_every_parameter_and_buffer_is_the_received_one_as_load_state_dict_makes_it():
    state = received(1)
    assert any(a.dtype == np.int64 for a in state.values())  # the BN batch counts come too
    ours, theirs = build_model("fashion-cnn", 10, 1), build_model("fashion-cnn", 10, 1)
    load_received(ours, numpy_to_record(state))
    theirs.load_state_dict({name: torch.from_numpy(array.copy()) for name, array in state.items()})
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == theirs.state_dict()[name].dtype
        assert tensor.numpy().tobytes() == state[name].tobytes(), name  # bit for bit
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    assert all(p.requires_grad for p in ours.parameters())  # still parameters a step can train


def test_a_missing_an_extra_or_a_misshapen_tensor_is_load_state_dicts_error():
    net, state = build_model("fashion-cnn", 10, 1), received(2)
    name = next(n for n, a in state.items() if a.ndim == 4)
    missing = {n: a for n, a in state.items() if n != name}
    with pytest.raises(RuntimeError, match=f"Missing key.*{name}"):
        load_received(net, numpy_to_record(missing))
    with pytest.raises(RuntimeError, match="Unexpected key.*extra"):
        load_received(net, numpy_to_record({**state, "extra": np.zeros(3, np.float32)}))
    with pytest.raises(RuntimeError, match=f"size mismatch for {name}"):
        load_received(net, numpy_to_record({**state, name: state[name][:1]}))
