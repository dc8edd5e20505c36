"""gru-fedavgm: the ClientApp."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from gru_fedavgm.task import Net, load_data
from gru_fedavgm.task import test as test_fn
from gru_fedavgm.task import train as train_fn

app = ClientApp()


def _data(context: Context):
    return load_data(str(context.run_config["data-path"]), int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]))


@app.train()
def train(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _data(context)
    loss = train_fn(model, trainloader, int(context.run_config["local-epochs"]), msg.content["config"]["lr"])
    metrics = {"train_loss": loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, testloader = _data(context)
    loss, acc = test_fn(model, testloader)
    metrics = {"eval_loss": loss, "eval_acc": acc, "num-examples": len(testloader.dataset)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
