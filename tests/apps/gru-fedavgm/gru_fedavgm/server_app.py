"""gru-fedavgm: the ServerApp, FedAvgM."""

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvgM

from gru_fedavgm.task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    arrays = ArrayRecord(Net().state_dict())
    strategy = FedAvgM(fraction_train=1.0, server_momentum=float(cfg["server-momentum"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        num_rounds=int(cfg["num-server-rounds"]),
    )
    print(f"final model: {len(result.arrays)} arrays")
