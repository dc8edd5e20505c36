"""ClientApp (legacy API): a plain NumPyClient wrapped by LIPSNumPyClient."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from flwr.app import Context
from flwr.client import ClientApp, NumPyClient

from lips_flwr.clients import LIPSNumPyClient
from lips_flwr.experiments.task.data import load_digits_client
from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.task.training import evaluate as evaluate_model
from lips_flwr.experiments.task.training import train

torch.set_num_threads(1)  # many clients share the CPU cores


class DigitsClient(NumPyClient):
    """An ordinary user-written NumPyClient: knows nothing about LIPS."""

    def __init__(self, trainset, testset, local_epochs: int, seed: int) -> None:
        self.net = DigitsCNN()
        self.trainset, self.testset = trainset, testset
        self.local_epochs, self.seed = local_epochs, seed

    def get_parameters(self, config):
        return [v.cpu().numpy() for v in self.net.state_dict().values()]

    def set_parameters(self, parameters) -> None:
        keys = self.net.state_dict().keys()
        state = OrderedDict(
            (k, torch.from_numpy(np.copy(v))) for k, v in zip(keys, parameters)
        )
        self.net.load_state_dict(state, strict=True)

    def fit(self, parameters, config):
        self.set_parameters(parameters)
        seed = self.seed * 1000 + int(config.get("server-round", 0))
        epochs = int(config.get("local-epochs", self.local_epochs))
        loss = train(self.net, self.trainset, epochs, seed=seed)
        return self.get_parameters({}), len(self.trainset), {"train-loss": loss}

    def evaluate(self, parameters, config):
        self.set_parameters(parameters)
        loss, acc = evaluate_model(self.net, self.testset)
        return loss, len(self.testset), {"eval-acc": acc}


def client_fn(context: Context):
    cfg = context.run_config
    trainset, testset = load_digits_client(
        int(context.node_config["partition-id"]),
        samples=int(cfg["samples-per-client"]),
        alpha=float(cfg["alpha"]),
        seed=int(cfg["seed"]),
    )
    client = DigitsClient(trainset, testset, int(cfg["local-epochs"]), int(cfg["seed"]))
    # FedBN like the Message API app: batch-norm tensors stay on the client.
    names = list(client.net.state_dict().keys())
    return LIPSNumPyClient(
        client, context, param_names=names, keep_local="batchnorm"
    ).to_client()


app = ClientApp(client_fn=client_fn)
