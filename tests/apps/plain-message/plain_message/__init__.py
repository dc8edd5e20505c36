"""plain-message: A Flower / PyTorch app."""
