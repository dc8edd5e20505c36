"""ServerApp (legacy API): FedAvg wrapped by LegacyLIPS."""

from __future__ import annotations

import torch
from flwr.app import Context
from flwr.common import Metrics, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.results import write_json_atomic
from lips_flwr.strategies import LegacyLIPS


def weighted_average(metrics: list[tuple[int, Metrics]]) -> Metrics:
    """Average client metrics weighted by their number of examples."""
    total = sum(n for n, _ in metrics)
    keys = {k for _, m in metrics for k in m}
    return {k: sum(n * float(m.get(k, 0.0)) for n, m in metrics) / total for k in keys}


class RecordingLIPS(LegacyLIPS):
    """LegacyLIPS that records per-round metrics and writes them to a JSON file."""

    def __init__(self, strategy, *, results_path: str, run_config: dict, **kwargs):
        super().__init__(strategy, **kwargs)
        self.results_path = results_path
        self.record = {"run_config": run_config, "train_metrics": {}, "evaluate_metrics": {}}

    def _dump(self) -> None:
        if self.results_path:
            write_json_atomic(self.results_path, self.record)

    def aggregate_fit(self, server_round, results, failures):
        params, metrics = super().aggregate_fit(server_round, results, failures)
        self.record["train_metrics"][str(server_round)] = dict(metrics or {})
        self._dump()
        return params, metrics

    def aggregate_evaluate(self, server_round, results, failures):
        loss, metrics = super().aggregate_evaluate(server_round, results, failures)
        entry = dict(metrics or {})
        if loss is not None:
            entry["eval-loss"] = float(loss)
        self.record["evaluate_metrics"][str(server_round)] = entry
        self._dump()
        return loss, metrics


def server_fn(context: Context) -> ServerAppComponents:
    cfg = context.run_config
    num_rounds = int(cfg["num-server-rounds"])
    local_epochs = int(cfg["local-epochs"])

    # Seeded: a restarted server builds the same initial model, which a resume checks.
    torch.manual_seed(int(cfg["seed"]))
    net = DigitsCNN()
    ndarrays = [v.cpu().numpy() for v in net.state_dict().values()]
    fedavg = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=1.0,
        min_fit_clients=2,
        min_evaluate_clients=2,
        min_available_clients=2,
        initial_parameters=ndarrays_to_parameters(ndarrays),
        # Legacy FedAvg does not send the round number: add it here.
        on_fit_config_fn=lambda rnd: {"server-round": rnd, "local-epochs": local_epochs},
        fit_metrics_aggregation_fn=weighted_average,
        evaluate_metrics_aggregation_fn=weighted_average,
    )
    strategy = RecordingLIPS(
        fedavg,
        results_path=str(cfg["results-path"]),
        run_config=dict(cfg),
        param_names=list(net.state_dict().keys()),
        num_rounds=num_rounds,
        tau0=float(cfg["tau0"]),
        every=int(cfg["every"]),
        score=str(cfg["score"]),
        mode=str(cfg["mode"]),
        seed=int(cfg["seed"]),
        mask_last_round=bool(cfg["mask-last-round"]),
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=num_rounds))


app = ServerApp(server_fn=server_fn)
