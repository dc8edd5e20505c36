"""quickstart-legacy: LIPS on Flower's legacy API (Strategy + NumPyClient)."""
