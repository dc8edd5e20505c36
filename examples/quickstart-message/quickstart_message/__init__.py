"""quickstart-message: LIPS on Flower's Message API (ServerApp/ClientApp)."""
