"""plain-legacy: A Flower / PyTorch app."""
