"""Flower client side: Message API mods and a legacy NumPyClient wrapper."""

from .mods import fedbn_mod, lips_mod, make_fedbn_mod, persistent_state_mod
from .numpy_client import LIPSNumPyClient

__all__ = ["LIPSNumPyClient", "fedbn_mod", "lips_mod", "make_fedbn_mod", "persistent_state_mod"]
