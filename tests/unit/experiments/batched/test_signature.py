"""The stacked engine stacks only clients whose models train alike; the others run as the sequential engine would."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator

import pytest
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched import BatchedGrid
from lips_flwr.experiments.batched.rendezvous import Rendezvous
from lips_flwr.experiments.batched.stacked import can_stack, train_stacked
from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.task.training import computing_with, local_compute, train_tensors

TOL = 1e-9  # float64, as the stacked tests' float64 cases
KWARGS = {"epochs": 2, "lr": 0.1, "momentum": 0.9, "batch_size": 5}
CLIENTS = 3


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def clients() -> tuple[list[nn.Module], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Three float64 DigitsCNNs from one start (as a round's clients) and their own data."""
    torch.manual_seed(0)
    start = DigitsCNN().double()
    data = [(torch.randn(10, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (10,))) for _ in range(CLIENTS)]
    return [copy.deepcopy(start) for _ in range(CLIENTS)], data


def train_both(edit: Callable[[int, nn.Module], None]) -> tuple[list[nn.Module], list[nn.Module], Rendezvous]:
    """The clients edited by ``edit(i, net)``, trained by the stacked engine and, on copies, one by one."""
    nets, data = clients()
    sequential = [copy.deepcopy(net) for net in nets]
    for i, (net, twin) in enumerate(zip(nets, sequential)):
        edit(i, net)
        edit(i, twin)
        train_tensors(twin, *data[i], seed=i, **KWARGS)
    rendezvous = Rendezvous()

    def client(i: int):
        def run() -> float:
            with computing_with(rendezvous):
                return local_compute().train(nets[i], *data[i], seed=i, **KWARGS)
        return run

    rendezvous.run([client(i) for i in range(CLIENTS)])
    return nets, sequential, rendezvous


def assert_same(nets: list[nn.Module], sequential: list[nn.Module]) -> None:
    for i, (net, ref) in enumerate(zip(nets, sequential)):
        for name, value in net.state_dict().items():
            diff = (value.double() - ref.state_dict()[name].double()).abs().max().item()
            assert diff <= TOL, f"client {i}, {name}: {diff}"


def halve(module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    return output * 0.5


def scaling(factor: float):
    return lambda module, inputs, output: output * factor


def keep_bn_in_eval(net: nn.Module) -> None:
    """``net.train()`` leaves this net's first BatchNorm in eval mode (its statistics frozen)."""
    bn = next(m for m in net.modules() if isinstance(m, nn.BatchNorm2d))
    bn.train = lambda mode=True: nn.Module.train(bn, False)  # type: ignore[method-assign]


DIFFERING = {
    # what one client (or two) does differently; each case moved the others' or its own weights
    "frozen-in-client-1": lambda i, net: i == 1 and net.conv1.weight.requires_grad_(False),
    "frozen-in-client-0": lambda i, net: i == 0 and net.conv1.weight.requires_grad_(False),
    "hook-in-client-0": lambda i, net: i == 0 and net.fc.register_forward_hook(halve),
    "hook-in-client-2": lambda i, net: i == 2 and net.fc.register_forward_hook(halve),
    "pre-hook-in-client-1": lambda i, net: i == 1 and net.fc.register_forward_pre_hook(
        lambda module, args: (args[0] * 2,)),
    "other-closure": lambda i, net: net.fc.register_forward_hook(scaling(0.5 if i else 0.25)),
    "bn-kept-in-eval": lambda i, net: i == 1 and keep_bn_in_eval(net),
    "bn-momentum": lambda i, net: i == 2 and setattr(net.bn1, "momentum", 0.5),
}


def conv1_weight(net: nn.Module) -> torch.Tensor:
    return net.conv1.weight


@pytest.mark.parametrize("case", list(DIFFERING))
def test_a_client_whose_model_trains_differently_is_not_stacked_with_the_others(case):
    nets, sequential, rendezvous = train_both(DIFFERING[case])
    assert_same(nets, sequential)
    assert rendezvous.one_by_one >= 1


ALIKE = {
    "frozen-in-every-client": lambda i, net: net.conv1.weight.requires_grad_(False),
    "same-hook-in-every-client": lambda i, net: net.fc.register_forward_hook(halve),
    "same-closure-in-every-client": lambda i, net: net.fc.register_forward_hook(scaling(0.5)),
}


@pytest.mark.parametrize("case", list(ALIKE))
def test_clients_alike_are_stacked_and_train_as_the_sequential_engine(case):
    start = clients()[0][0]
    nets, sequential, rendezvous = train_both(ALIKE[case])
    assert_same(nets, sequential)
    assert (rendezvous.stacked, rendezvous.one_by_one) == (CLIENTS, 0)
    if case == "frozen-in-every-client":
        assert all(torch.equal(conv1_weight(net), conv1_weight(start)) for net in nets)


UNSTACKABLE = {
    # hooks the stacked computation would not call: such clients always run on their own
    "tensor-hook": lambda i, net: conv1_weight(net).register_hook(lambda grad: grad * 0.5),
    "backward-hook": lambda i, net: net.conv2.register_full_backward_hook(
        lambda module, grad_in, grad_out: tuple(g * 0.5 if g is not None else None for g in grad_in)),
}


@pytest.mark.parametrize("case", list(UNSTACKABLE))
def test_hooks_the_stacked_computation_cannot_apply_run_their_clients_on_their_own(case):
    nets, sequential, rendezvous = train_both(UNSTACKABLE[case])
    assert_same(nets, sequential)
    assert (rendezvous.stacked, rendezvous.one_by_one) == (0, CLIENTS)


def test_train_stacked_refuses_nets_that_train_differently():
    nets, data = clients()
    conv1_weight(nets[1]).requires_grad_(False)
    assert not can_stack(nets, data)
    with pytest.raises(ValueError, match="requires_grad"):
        train_stacked(nets, data, seeds=[0, 1, 2], **KWARGS)
    nets, data = clients()
    nets[0].fc.register_forward_hook(halve)
    with pytest.raises(ValueError, match="forward hooks"):
        train_stacked(nets, data, seeds=[0, 1, 2], **KWARGS)


@pytest.mark.usefixtures("task_identity")
def test_the_grid_warns_once_per_run_naming_what_differs(caplog):
    nets, data = clients()
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        net = copy.deepcopy(nets[pid])
        if pid == 2:
            conv1_weight(net).requires_grad_(False)
        loss = local_compute().train(net, *data[pid], seed=pid, **KWARGS)
        return Message(RecordDict({"metrics": MetricRecord({"loss": loss})}), reply_to=msg)

    grid = BatchedGrid(app, num_nodes=CLIENTS, run_config={}, engine="stacked")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            replies = list(grid.send_and_receive([Message(RecordDict(), n, "train") for n in (1000, 1001, 1002)]))
            assert len(replies) == CLIENTS and not any(r.has_error() for r in replies)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "node 1002" in warnings[0] and "parameter 'conv1.weight'" in warnings[0]
    assert "requires_grad" in warnings[0] and "False vs True" in warnings[0]
    assert (grid.stacked_calls, grid.one_by_one_calls) == (4, 2)


def test_a_signatures_parameters_and_buffers_are_named_and_ordered_as_torch_names_them():
    # One walk of the module tree gives what net.named_parameters() / named_buffers() give: shared
    # tensors and a module met twice named once, where first met; a None bias left out.
    from lips_flwr.experiments.batched.signature import model_signature

    net = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 4))
    shared = nn.Linear(4, 4)
    net.append(shared)
    net.append(nn.Sequential(shared, nn.ReLU()))  # the same module twice
    net.append(nn.Linear(4, 4))
    net[-1].weight = net[3].weight  # a tied weight
    net[1].register_buffer("twin", net[1].running_mean)  # a buffer under two names in one module
    for model in (net, DigitsCNN(), nn.Linear(2, 2)):
        signature = model_signature(model)
        params = [what[len("parameter "):] for what, which, _ in signature if which == "requires_grad"]
        assert params == [repr(name) for name, _ in model.named_parameters()]
        buffers = [what[len("buffer "):] for what, which, _ in signature
                   if what.startswith("buffer ") and which == "device"]
        assert buffers == [repr(name) for name, _ in model.named_buffers()]
        shapes = [value for what, which, value in signature if which == "shape"]
        assert shapes == [tuple(t.shape) for _, t in [*model.named_parameters(), *model.named_buffers()]]
        modules = [what[len("module "):] for what, which, _ in signature if which == "class"]
        assert modules == [repr(name) for name, _ in model.named_modules()]
