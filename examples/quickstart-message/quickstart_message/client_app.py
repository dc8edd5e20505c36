"""ClientApp (Message API): plain PyTorch training plus the LIPS mods.

``fedbn_mod`` keeps batch-norm layers local; ``lips_mod`` masks the local copy
when the server runs LIPS in ``mode="client"`` (a no-op in server mode);
``persistent_state_mod`` keeps that client state on disk for a resumed server
run when the node config names a ``lips-state-dir`` (a no-op otherwise).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
import torch
from flwr.clientapp import ClientApp

from lips_flwr.clients import fedbn_mod, lips_mod, persistent_state_mod
from lips_flwr.experiments.task.data import load_digits_client
from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.task.training import evaluate, train

torch.set_num_threads(1)  # many clients share the CPU cores

app = ClientApp(mods=[persistent_state_mod, fedbn_mod, lips_mod])


def _setup(msg: Message, context: Context):
    cfg = context.run_config
    pid = int(context.node_config["partition-id"])
    net = DigitsCNN()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainset, testset = load_digits_client(
        pid,
        samples=int(cfg["samples-per-client"]),
        alpha=float(cfg["alpha"]),
        seed=int(cfg["seed"]),
    )
    return net, trainset, testset


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    net, trainset, _ = _setup(msg, context)
    rnd = int(msg.content["config"].get("server-round", 0))
    seed = int(context.run_config["seed"]) * 1000 + rnd
    loss = train(net, trainset, int(context.run_config["local-epochs"]), seed=seed)
    content = RecordDict(
        {
            "arrays": ArrayRecord(net.state_dict()),
            "metrics": MetricRecord(
                {"train-loss": loss, "num-examples": len(trainset)}
            ),
        }
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    net, _, testset = _setup(msg, context)
    loss, acc = evaluate(net, testset)
    metrics = MetricRecord(
        {"eval-loss": loss, "eval-acc": acc, "num-examples": len(testset)}
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
