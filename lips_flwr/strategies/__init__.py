"""Flower server side: LIPS strategies for the Message API and the legacy API.

In three wings: :mod:`.adapters` (the strategies, the round's sequence once
for both APIs), :mod:`.replies` (the reply gate both APIs share) and
:mod:`.resume` (checkpointing, the wrapped chain's state as a declared
contract); :mod:`.chain` is the chain of wrapped strategies and its
declared state (Flower's in :mod:`.flower_state`), :mod:`.codecs` each
API's models as arrays and back, :mod:`.options` the keyword arguments the
strategies take.
"""

from .adapters import LIPS, LegacyLIPS, LegacyLIPSFedAvg, LIPSFedAvg
from .options import forced_options

__all__ = ["LIPS", "LIPSFedAvg", "LegacyLIPS", "LegacyLIPSFedAvg", "forced_options"]
