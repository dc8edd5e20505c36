"""Small real models and Flower replies for strategy tests (no Ray, no network).

Replies are ``Mock(spec=Message)`` objects carrying real records, as in Flower's
own strategy tests; legacy results are real ``FitRes`` with mocked proxies.
"""

from __future__ import annotations

from unittest.mock import Mock

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.serverapp import Grid
try:  # Flower >= 1.2x: Messages need the identity of a running task
    from flwr.supercore.task_identity import TaskIdentity
except ImportError:  # older Flower builds Messages without it
    TaskIdentity = None


class TinyNet(torch.nn.Module):
    """conv -> BN -> conv -> BN -> conv -> linear: two middle layers (conv2, conv3)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 8, 3)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.conv3 = torch.nn.Conv2d(8, 8, 3, bias=False)
        self.fc = torch.nn.Linear(8, 10)


MIDDLE = ["conv2.weight", "conv3.weight"]


def tiny_model(seed: int = 0) -> dict[str, np.ndarray]:
    """The TinyNet state_dict as numpy, with non-trivial BN statistics."""
    torch.manual_seed(seed)
    state = {k: v.numpy().copy() for k, v in TinyNet().state_dict().items()}
    rng = np.random.default_rng(seed)
    for name in ("bn1.running_mean", "bn2.running_mean"):
        state[name] = rng.normal(size=state[name].shape).astype(np.float32)
    return state


def client_models(global_model: dict, num_clients: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Each client's trained model: the global one plus a random update (floats only)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_clients):
        out.append({
            k: (v + rng.normal(scale=0.05, size=v.shape).astype(v.dtype))
            if np.issubdtype(v.dtype, np.floating) else v.copy()
            for k, v in global_model.items()
        })
    return out


def to_record(model: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in model.items()})


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in record.items()}


def reply(model: dict[str, np.ndarray], num_examples: int, node_id: int = 1) -> Message:
    msg = Mock(spec=Message)
    msg.content = RecordDict(
        {"arrays": to_record(model), "metrics": MetricRecord({"num-examples": num_examples, "train-loss": 0.5})}
    )
    msg.has_error.return_value = False
    msg.metadata.src_node_id = node_id
    return msg


def message_reply(model: dict[str, np.ndarray], node_id: int, num_examples: int = 100, **metrics) -> Message:
    """A train reply whose MetricRecord holds ``num-examples`` and ``metrics`` (a DP wrapper's norm bit)."""
    msg = Mock(spec=Message)
    msg.content = RecordDict({"arrays": to_record(model),
                              "metrics": MetricRecord({"num-examples": num_examples, **metrics})})
    msg.has_error.return_value = False
    msg.metadata.src_node_id = node_id
    return msg


def grid(num_nodes: int = 3) -> Grid:
    g = Mock(spec=Grid)
    g.get_node_ids.return_value = list(range(1, num_nodes + 1))
    return g


@pytest.fixture
def task_identity():
    """Real Messages need the identity of a running task."""
    if TaskIdentity is None:
        yield
        return
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity.run_id = TaskIdentity.task_id = TaskIdentity.node_id = None


# ----- legacy API -----

def fit_result(model: dict[str, np.ndarray], num_examples: int, cid: str = "1"):
    proxy = Mock(spec=ClientProxy)
    proxy.cid = cid
    res = FitRes(
        status=Status(code=Code.OK, message=""),
        parameters=ndarrays_to_parameters(list(model.values())),
        num_examples=num_examples,
        metrics={},
    )
    return proxy, res


def legacy_result(model: dict[str, np.ndarray], cid: str, num_examples: int = 100, **metrics):
    """A legacy ``(proxy, FitRes)`` whose metrics are ``metrics``."""
    proxy = Mock(spec=ClientProxy)
    proxy.cid = cid
    return proxy, FitRes(status=Status(code=Code.OK, message=""),
                         parameters=ndarrays_to_parameters(list(model.values())),
                         num_examples=num_examples, metrics=dict(metrics))


def client_manager(num_clients: int = 3) -> ClientManager:
    proxies = []
    for i in range(num_clients):
        p = Mock(spec=ClientProxy)
        p.cid = str(i + 1)
        proxies.append(p)
    manager = Mock(spec=ClientManager)
    manager.num_available.return_value = num_clients
    manager.sample.return_value = proxies
    return manager


def params_to_model(parameters, names) -> dict[str, np.ndarray]:
    return dict(zip(names, parameters_to_ndarrays(parameters)))


def zeros_placed(before: np.ndarray, after: np.ndarray) -> int:
    return int(np.count_nonzero((after == 0) & (before != 0)))


class Ledger:
    """Stands for the DP privacy accountant: JSON state through state_dict()/load_state_dict()."""

    def __init__(self) -> None:
        self.events: list[int] = []

    def state_dict(self) -> dict:
        return {"events": list(self.events)}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"events"}:
            raise ValueError("not a ledger state")
        self.events = list(state["events"])


__all__ = [
    "ConfigRecord", "Ledger", "MIDDLE", "TinyNet", "client_manager", "client_models", "fit_result",
    "grid", "params_to_model", "reply", "task_identity", "tiny_model", "to_numpy",
    "to_record", "zeros_placed",
]

