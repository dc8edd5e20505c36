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
from lips_paper import client_app  # noqa: E402
from lips_paper.client_app import cpu_views, device_of, host_arrays, load_received  # noqa: E402


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


def loaded_both_ways(state: dict[str, np.ndarray], monkeypatch,
                     views: dict | None = None) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``state`` loaded by ``load_received`` (which must not call ``load_state_dict``) and by
    ``load_state_dict``; ``views={}``: as if no tensor had a numpy view (a GPU model's), every one
    copied in by ``copy_in``."""
    ours, theirs = build_model("fashion-cnn", 10, 1), build_model("fashion-cnn", 10, 1)

    def refuse(*args, **kwargs):
        raise AssertionError("load_state_dict called")

    monkeypatch.setattr(ours, "load_state_dict", refuse)
    load_received(ours, numpy_to_record(state), views=views)
    theirs.load_state_dict({name: torch.from_numpy(np.array(array)) for name, array in state.items()})
    return ours, theirs


def test_every_parameter_and_buffer_is_the_received_one_as_load_state_dict_makes_it(monkeypatch):
    state = received(1)
    assert any(a.dtype == np.int64 for a in state.values())  # the BN batch counts come too
    ours, theirs = loaded_both_ways(state, monkeypatch)
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == theirs.state_dict()[name].dtype
        assert tensor.numpy().tobytes() == state[name].tobytes(), name  # bit for bit
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    assert all(p.requires_grad for p in ours.parameters())  # still parameters a step can train


def test_float64_and_fortran_order_arrays_are_cast_and_copied_as_load_state_dict_does(monkeypatch):
    state = {name: np.asfortranarray(array.astype(np.float64)) if array.dtype.kind == "f" else array
             for name, array in received(3).items()}
    ours, theirs = loaded_both_ways(state, monkeypatch)
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == build_model("fashion-cnn", 10, 1).state_dict()[name].dtype  # the model's
        assert torch.equal(tensor, theirs.state_dict()[name]), name


def test_a_missing_an_extra_or_a_misshapen_tensor_is_an_error_naming_it():
    net, state = build_model("fashion-cnn", 10, 1), received(2)
    name = next(n for n, a in state.items() if a.ndim == 4)
    count = next(n for n in state if n.endswith("num_batches_tracked"))
    for record, what in (({n: a for n, a in state.items() if n != name}, f"missing \\['{name}'\\]"),
                         ({n: a for n, a in state.items() if n != count}, f"missing \\['{count}'\\]"),
                         ({**state, "extra": np.zeros(3, np.float32)}, "unexpected \\['extra'\\]"),
                         ({**state, name: state[name][:1]}, f"other shapes \\[{name} \\(1, 1, 3, 3\\) for"),
                         ({**state, count: state[count].reshape(1)}, f"other shapes \\[{count} \\(1,\\) for \\(\\)\\]")):
        with pytest.raises(ValueError, match=f"does not fit this one: .*{what}"):
            load_received(net, numpy_to_record(record))


def test_a_model_loaded_again_after_its_tensors_were_replaced_gets_the_new_ones_loaded():
    # The CPU path writes through numpy views kept per model: a tensor given other memory
    # (``param.data = ...``) or replaced by another object must be loaded, not its old memory.
    net = build_model("fashion-cnn", 10, 1)
    load_received(net, numpy_to_record(received(1)))
    name, param = next(iter(net.named_parameters()))
    param.data = torch.zeros_like(param)
    buffer = next(n for n, _ in net.named_buffers() if n.endswith("running_mean"))
    module, attr = buffer.rsplit(".", 1)
    net.get_submodule(module).register_buffer(attr, torch.zeros_like(net.get_buffer(buffer)))
    state = received(2)
    load_received(net, numpy_to_record(state))
    for n, tensor in net.state_dict().items():
        assert tensor.numpy().tobytes() == state[n].tobytes(), n
    assert all(p.requires_grad for p in net.parameters())


def test_a_tensor_given_another_layout_in_the_same_memory_or_a_dtype_numpy_lacks_is_loaded_as_copy_does():
    net = build_model("fashion-cnn", 10, 1)
    load_received(net, numpy_to_record(received(1)))
    weight = net.get_parameter("conv2.0.weight")
    weight.data = weight.data.transpose(0, 1)  # the same memory, other strides (a 16 x 16 x 3 x 3 kernel)
    bn = net.get_submodule("conv1.1")
    bn.running_var = bn.running_var.to(torch.bfloat16)  # numpy has no bfloat16: copy_ loads it
    state = received(2)
    load_received(net, numpy_to_record(state))
    assert torch.equal(net.get_parameter("conv2.0.weight"), torch.from_numpy(state["conv2.0.weight"]))
    assert torch.equal(bn.running_var, torch.from_numpy(state["conv1.1.running_var"]).to(torch.bfloat16))


def test_tensors_without_a_view_get_their_arrays_joined_one_transfer_per_dtype_bit_for_bit(monkeypatch):
    # views={}: the path of a model on a GPU (numpy views only CPU tensors), taken here on the CPU.
    state = received(1)
    joined = []
    from_numpy = torch.from_numpy
    with monkeypatch.context() as counting:
        counting.setattr(torch, "from_numpy", lambda array: joined.append(array.dtype) or from_numpy(array))
        load_received(build_model("fashion-cnn", 10, 1), numpy_to_record(state), views={})
    assert sorted(map(str, joined)) == ["float32", "int64"]  # one host array per dtype, not one per tensor
    ours, theirs = loaded_both_ways(state, monkeypatch, views={})
    for name, tensor in ours.state_dict().items():
        assert tensor.numpy().tobytes() == state[name].tobytes(), name
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    cast = {name: np.asfortranarray(array.astype(np.float64)) if array.dtype.kind == "f" else array
            for name, array in received(3).items()}
    ours, theirs = loaded_both_ways(cast, monkeypatch, views={})
    for name, tensor in ours.state_dict().items():
        assert tensor.dtype == theirs.state_dict()[name].dtype
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    assert all(p.requires_grad for p in ours.parameters())


def test_host_arrays_are_the_tensors_numpy_in_order_one_transfer_per_dtype_without_views(monkeypatch):
    net = build_model("fashion-cnn", 10, 1)
    load_received(net, numpy_to_record(received(4)))
    state = net.state_dict(keep_vars=True)
    expected = {name: tensor.numpy(force=True) for name, tensor in state.items()}
    cats = []
    cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda tensors: cats.append(len(tensors)) or cat(tensors))
    for views in ({}, cpu_views(net, state)):
        arrays = host_arrays(state, views)
        assert list(arrays) == list(state)
        for name, array in arrays.items():
            assert array.shape == expected[name].shape and array.dtype == expected[name].dtype, name
            assert array.tobytes() == expected[name].tobytes(), name
    assert len(cats) == 2 and sum(cats) == len(state)  # without views: one per dtype; with them, none
    net.get_submodule("conv1.1").running_var.data = torch.ones(16, dtype=torch.bfloat16)
    with pytest.raises(TypeError):  # numpy has no bfloat16, as tensor.numpy() says
        host_arrays(net.state_dict(keep_vars=True), {})


def test_the_auto_device_is_asked_of_torch_once(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    client_app._device.cache_clear()
    try:
        assert [device_of({"device": d}) for d in ("auto", "auto", "cpu")] == [torch.device("cpu")] * 3
        assert len(asked) == 1
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        client_app._device.cache_clear()
        assert device_of({"device": "auto"}) == torch.device("cuda")
    finally:
        client_app._device.cache_clear()  # (the answer of this machine for the tests after)
