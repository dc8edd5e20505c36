"""ClientApp: ResNet8 on 100 random CIFAR-shaped samples, FedBN + LIPS mods.

Random data (seeded by partition) stand in for CIFAR-100: the benchmark is
about throughput, not accuracy. Each call builds the model on the device,
trains the paper's local epochs and frees the CUDA cache before returning,
so idle Ray actors do not hold GPU memory (Flower issues #1376, #5855).
"""

from __future__ import annotations

import time

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from lips_flwr.clients import fedbn_mod, lips_mod
from lips_flwr.experiments.task.models import ResNet8
from lips_flwr.experiments.task.training import SEQUENTIAL, local_compute

app = ClientApp(mods=[fedbn_mod, lips_mod])


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


@app.train()
def train(msg: Message, context: Context) -> Message:
    start = time.perf_counter()
    cfg = context.run_config
    device = _device(str(cfg["device"]))
    if device.type == "cpu":
        torch.set_num_threads(1)  # several clients share the cores
    pid = int(context.node_config["partition-id"])
    gen = torch.Generator().manual_seed(int(cfg["seed"]) * 100_003 + pid)
    n, classes = int(cfg["samples-per-client"]), int(cfg["num-classes"])
    x = torch.rand(n, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, classes, (n,), generator=gen).to(device)
    if device.type == "cuda":  # CUDA is initialised by now
        torch.cuda.reset_peak_memory_stats(device)

    net = ResNet8(num_classes=classes).to(device)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"].get("server-round", 0))
    compute = local_compute()  # train_tensors; on the batched Grid, with the other clients at once
    loss = compute.train(net, x, y, epochs=int(cfg["local-epochs"]),
                         batch_size=int(cfg["batch-size"]), lr=0.1, momentum=0.9,
                         seed=int(cfg["seed"]) * 1000 + rnd)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in net.state_dict().items()})
    gpu_mb = 0.0
    if device.type == "cuda":
        gpu_mb = torch.cuda.max_memory_allocated(device) / 2**20
        del net, x, y
        if compute is SEQUENTIAL:  # an idle Ray actor's cache; the batched Grid's is shared
            torch.cuda.empty_cache()
    metrics = MetricRecord({
        "num-examples": n,
        "train-loss": loss,
        "client-seconds": time.perf_counter() - start,
        "gpu-peak-mb": gpu_mb,
        "on-gpu": float(device.type == "cuda"),
    })
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
