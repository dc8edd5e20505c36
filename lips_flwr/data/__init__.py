"""Federated datasets for the examples (offline ones are tested)."""

from .digits import load_digits_client

__all__ = ["load_digits_client"]
