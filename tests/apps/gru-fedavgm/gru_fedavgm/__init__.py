"""gru-fedavgm: a Flower / PyTorch app, a GRU classifying sequences under FedAvgM."""
