"""ServerApp: LIPS(FedAvg) on ResNet8, 100% participation, no evaluation; timings to JSON."""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from lips_flwr.experiments.task.models import ResNet8
from lips_flwr.experiments.results import write_json_atomic
from lips_flwr.strategies import LIPS

app = ServerApp()

MAX_KEYS = ("gpu-peak-mb", "client-seconds")  # worst client, not a weighted mean


def _train_metrics(records: list[RecordDict], weight_key: str) -> MetricRecord:
    """Weighted means, except the max over clients for MAX_KEYS; also the reply count."""
    metrics = [next(iter(r.metric_records.values())) for r in records]
    total = sum(float(m[weight_key]) for m in metrics)
    out = MetricRecord({"replies": len(metrics)})
    for key in metrics[0]:
        if key == weight_key or not isinstance(metrics[0][key], (int, float)):
            continue
        values = [float(m[key]) for m in metrics if key in m]
        if key in MAX_KEYS:
            out[key] = max(values)
        elif len(values) == len(metrics):
            out[key] = sum(float(m[key]) * float(m[weight_key]) for m in metrics) / total
    return out


class TimedFedAvg(FedAvg):
    """FedAvg that notes when each round's aggregation ends (= when the round ends).

    With a ``progress`` path it rewrites that JSON file every round, so a run
    stopped early (time budget) still tells how far it got.
    """

    def __init__(self, progress: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.progress = progress
        self.round_ends: list[float] = []
        self.metrics: dict[str, dict] = {}

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.round_ends.append(time.time())
        self.metrics[str(server_round)] = dict(metrics or {})
        if self.progress:
            write_json_atomic(self.progress, {"round_ends": self.round_ends, "train_metrics": self.metrics})
        return arrays, metrics


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    started = time.time()
    nodes = len(list(grid.get_node_ids()))
    progress = f"{cfg['results-path']}.progress" if cfg["results-path"] else ""
    inner = TimedFedAvg(progress=progress, fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=nodes,
                        min_available_nodes=nodes, train_metrics_aggr_fn=_train_metrics)
    strategy = LIPS(inner, tau0=float(cfg["tau0"]), every=int(cfg["every"]), seed=int(cfg["seed"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(ResNet8(num_classes=int(cfg["num-classes"])).state_dict()),
        num_rounds=int(cfg["num-server-rounds"]),
        train_config=ConfigRecord({"local-epochs": int(cfg["local-epochs"])}),
    )
    if cfg["results-path"]:
        write_json_atomic(str(cfg["results-path"]), {
            "run_config": dict(cfg),
            "nodes": nodes,
            "serverapp_start": started,
            "round_ends": inner.round_ends,
            "train_metrics": {str(r): dict(m) for r, m in sorted(result.train_metrics_clientapp.items())},
        })
