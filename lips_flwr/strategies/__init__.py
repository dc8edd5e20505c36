"""Flower server side: LIPS strategies for the Message API and the legacy API."""

from .legacy import LegacyLIPS, LegacyLIPSFedAvg
from .message import LIPS, LIPSFedAvg
from .overrides import forced_options

__all__ = ["LIPS", "LIPSFedAvg", "LegacyLIPS", "LegacyLIPSFedAvg", "forced_options"]
