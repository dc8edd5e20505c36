"""plain-legacy: A Flower / PyTorch app."""

import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context

from plain_legacy.task import Net, get_weights, load_data, set_weights, test, train

torch.set_num_threads(1)


# Define Flower Client
class FlowerClient(NumPyClient):
    def __init__(self, net, trainloader, valloader, local_epochs, lr):
        self.net = net
        self.trainloader = trainloader
        self.valloader = valloader
        self.local_epochs = local_epochs
        self.lr = lr
        self.device = torch.device("cpu")

    def fit(self, parameters, config):
        set_weights(self.net, parameters)
        train_loss = train(self.net, self.trainloader, self.local_epochs, self.lr, self.device)
        return get_weights(self.net), len(self.trainloader.dataset), {"train_loss": train_loss}

    def evaluate(self, parameters, config):
        set_weights(self.net, parameters)
        loss, accuracy = test(self.net, self.valloader, self.device)
        return loss, len(self.valloader.dataset), {"accuracy": accuracy}


def client_fn(context: Context):
    # Load model and data
    net = Net()
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, valloader = load_data(partition_id, num_partitions)
    local_epochs = context.run_config["local-epochs"]
    lr = context.run_config["lr"]

    # Return Client instance
    return FlowerClient(net, trainloader, valloader, local_epochs, lr).to_client()


# Flower ClientApp
app = ClientApp(client_fn=client_fn)
